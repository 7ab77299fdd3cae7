"""Environment variables the plugin reads, defined once (vLLM's own are in ``vllm.envs``)."""

from __future__ import annotations

import os

# "1": log one line per chunk where Stage 0 emits it and per codec step (windows, decode time, wall clock), to
# place first-audio latency between the stages; the codec step then waits for its decode to finish (a host sync).
KANI_TRACE_CHUNKS = "KANI_TRACE_CHUNKS"


def trace_chunks() -> bool:
    """Whether ``KANI_TRACE_CHUNKS`` is on (read when a stage process loads its model or producer)."""
    return os.environ.get(KANI_TRACE_CHUNKS, "").strip().lower() in ("1", "true", "on", "yes")


KANI_DISABLE_PATCHES = "KANI_DISABLE_PATCHES"


def disabled_patches() -> set[str]:
    """Names of ``patch`` functions listed in ``KANI_DISABLE_PATCHES`` (comma-separated): left unapplied, to measure
    or bypass one workaround without editing the plugin."""
    return {name.strip() for name in os.environ.get(KANI_DISABLE_PATCHES, "").split(",") if name.strip()}
