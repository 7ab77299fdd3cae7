"""The main process's garbage-collector thresholds, from ``KANI_MAIN_GC_THRESHOLD`` (off unless set).

The API server's process runs the event loop and vLLM-Omni's orchestrator thread under one GIL, and a collection
stops both. Served on an H200 at 256 streams it ran 6-23 gen-1 collections of up to 13.5 ms and one or two full
ones of 49-81 ms every 5 s: the in-flight streams keep 200-370 tracked objects each alive (lists, closures' cells,
suspended coroutines, bound methods, deques), 72,000-88,000 at 256 streams, and each full collection walks them all
(docs/BENCHMARKS.md, forty-fourth set). CPython collects generation 0 after 700 net allocations of tracked objects,
generation 1 after 10 of those and the oldest after 10 of generation 1's (once it has grown by a quarter). A larger
first threshold gives the short-lived objects of a chunk's hand-off time to die by reference count before a
collection sees them, so fewer are promoted and the older generations' collections come less often, each young
collection walking more. The engines keep CPython's defaults; ``register()`` applies this in the main process only.
"""

from __future__ import annotations

import gc
import logging

from vllm_omni_kani.envs import KANI_MAIN_GC_THRESHOLD, main_gc_threshold
from vllm_omni_kani.gil_switch import is_main_process

logger = logging.getLogger(__name__)


def apply_gc_threshold() -> tuple[int, ...] | None:
    """Set the main process's thresholds from the environment; returns them as set, or None if left alone (unset,
    or not the main process)."""
    values = main_gc_threshold()
    if values is None or not is_main_process():
        return None
    previous = gc.get_threshold()
    # Fields left out keep their current value, as gc.set_threshold does.
    gc.set_threshold(*values)
    current = gc.get_threshold()
    logger.info(
        "%s: gc thresholds %s (were %s)",
        KANI_MAIN_GC_THRESHOLD,
        ", ".join(map(str, current)),
        ", ".join(map(str, previous)),
    )
    return current
