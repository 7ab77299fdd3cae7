"""The interpreter's GIL switch interval, set per process from ``KANI_GIL_SWITCH_INTERVAL_MS``.

Each engine process runs its step loop on the main thread beside Python threads of vLLM-Omni's (the connector's
save and receive loops, the output socket's encoder). Whenever the main thread releases the GIL (waiting for the
GPU, a socket) and such a thread takes it, the main thread gets it back only after the interpreter's switch
interval (5 ms by default) or when that thread blocks, so the step loop can lose up to one interval per release.
A shorter interval bounds that wait at the cost of more switches. ``register()`` applies it in every process.
"""

from __future__ import annotations

import logging
import sys

from vllm_omni_kani.envs import KANI_GIL_SWITCH_INTERVAL_MS, gil_switch_interval_s

logger = logging.getLogger(__name__)


def apply_switch_interval() -> float | None:
    """Set the switch interval from the environment; returns the interval set (seconds), or None if left alone."""
    interval = gil_switch_interval_s()
    if interval is None:
        return None
    previous = sys.getswitchinterval()
    sys.setswitchinterval(interval)
    logger.info(
        "%s: GIL switch interval %.3f ms (was %.3f ms)", KANI_GIL_SWITCH_INTERVAL_MS, interval * 1e3, previous * 1e3
    )
    return sys.getswitchinterval()
