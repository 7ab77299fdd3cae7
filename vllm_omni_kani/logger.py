"""Route the plugin's loggers (``vllm_omni_kani.*``) through vLLM's ``vllm`` logger.

vLLM configures only the ``vllm`` logger tree; a logger outside it falls back to the root logger, whose
WARNING level silently drops the plugin's INFO lines (graph capture, admission limit, chunk traces).
"""

from __future__ import annotations

import logging

ROOT = "vllm_omni_kani"


def route_to_vllm() -> None:
    """Make ``vllm`` the parent of the plugin's root logger, so vLLM's handler and level apply (idempotent)."""
    plugin_root = logging.getLogger(ROOT)
    plugin_root.handlers = []
    plugin_root.parent = logging.getLogger("vllm")
    plugin_root.propagate = True
    plugin_root.setLevel(logging.NOTSET)
