"""vLLM-Omni plugin serving Kani-style text-to-speech as a two-stage pipeline.

``register()`` is the ``vllm.general_plugins`` entry point: vLLM calls it in every process
(API server, engine cores, workers), so it is idempotent and imports nothing heavy until the
things it registers are actually used.
"""

from __future__ import annotations

__version__ = "0.1.0"

_registered = False


def register() -> None:
    """Register models, pipeline and TTS adapter with vLLM / vLLM-Omni; apply guarded patches."""
    global _registered
    if _registered:
        return
    _registered = True
    from vllm_omni_kani import patch

    patch.apply_all()
