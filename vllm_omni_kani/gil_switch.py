"""The interpreter's GIL switch interval, set per process from ``KANI_GIL_SWITCH_INTERVAL_MS`` (every process) and
``KANI_MAIN_GIL_SWITCH_INTERVAL_MS`` (the main process only).

Each engine process runs its step loop on the main thread beside Python threads of vLLM-Omni's (the connector's
save and receive loops, the output socket's encoder). Whenever the main thread releases the GIL (waiting for the
GPU, a socket) and such a thread takes it, the main thread gets it back only after the interpreter's switch
interval (5 ms by default) or when that thread blocks, so the step loop can lose up to one interval per release.
A shorter interval bounds that wait at the cost of more switches. In the main process (the API server) vLLM-Omni's
orchestrator thread hands requests to the engines under the GIL that the server's event loop holds while a burst
of requests arrives; each of its loop's turns can wait one interval there, so the main process has its own
variable. ``register()`` applies them in every process.
"""

from __future__ import annotations

import logging
import multiprocessing
import sys

from vllm_omni_kani.envs import KANI_GIL_SWITCH_INTERVAL_MS, KANI_MAIN_GIL_SWITCH_INTERVAL_MS, gil_switch_interval_s

logger = logging.getLogger(__name__)


def is_main_process() -> bool:
    """True in the process that was started, not spawned by multiprocessing (``vllm serve``'s API server, an
    offline script); engine cores and workers are its children."""
    return multiprocessing.parent_process() is None


def apply_switch_interval() -> float | None:
    """Set the switch interval from the environment; returns the interval set (seconds), or None if left alone."""
    name = KANI_GIL_SWITCH_INTERVAL_MS
    interval = gil_switch_interval_s(name)
    main_interval = gil_switch_interval_s(KANI_MAIN_GIL_SWITCH_INTERVAL_MS)
    if main_interval is not None and is_main_process():
        name, interval = KANI_MAIN_GIL_SWITCH_INTERVAL_MS, main_interval
    if interval is None:
        return None
    previous = sys.getswitchinterval()
    sys.setswitchinterval(interval)
    logger.info("%s: GIL switch interval %.3f ms (was %.3f ms)", name, interval * 1e3, previous * 1e3)
    return sys.getswitchinterval()
