"""vLLM-Omni platform for machines without an accelerator, shipped as an out-of-tree platform plugin.

vLLM-Omni 0.26.0 ships no CPU platform: on a CPU-only machine it resolves ``UnspecifiedOmniPlatform``, which
cannot name a worker, so ``vllm serve --omni`` fails before any stage starts. The entry point below activates
:class:`~vllm_omni_kani.platforms.cpu.platform.CPUOmniPlatform` exactly when vLLM itself runs on its CPU
platform, so GPU machines keep vLLM-Omni's own platform.

This module stays import-light: vLLM-Omni imports it in every process while resolving its platform, and calls
the plugin function more than once.
"""

from __future__ import annotations

from vllm_omni_kani.envs import on_unless_off

PLATFORM_QUALNAME = "vllm_omni_kani.platforms.cpu.platform.CPUOmniPlatform"
# Set to 0 to fall back to vLLM-Omni's own resolution (for example to compare with another CPU platform plugin).
DISABLE_ENV = "KANI_CPU_PLATFORM"


def cpu_platform_plugin() -> str | None:
    """Entry point of ``vllm_omni.platform_plugins``: our platform's class path on a CPU-only vLLM, else None.

    Side-effect free and cheap, because vLLM-Omni calls it twice per process and swallows its exceptions.
    """
    if not on_unless_off(DISABLE_ENV):
        return None
    try:
        from vllm.platforms import current_platform

        return PLATFORM_QUALNAME if current_platform.is_cpu() else None
    except Exception:
        return None


# vLLM-Omni resolves its platform while its own package initializes, importing `platform` by name at that point.
# Let that happen here, after the plugin function exists: importing `platform` first would otherwise start the
# resolution from inside the half-imported `platform` module and fail. When vLLM-Omni loads this entry point it is
# already importing itself, and this line does nothing.
import vllm_omni  # noqa: E402, F401
