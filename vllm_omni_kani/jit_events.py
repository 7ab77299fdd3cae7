"""``KANI_JIT_EVENTS=1``: every Triton kernel compiled in a process, logged with when it started and how long it took.

Served at 64 streams the first wave of requests met one Stage-0 engine that took no input for ~60 ms while the other
stepped every 15-40 ms (docs/BENCHMARKS.md, fifty-ninth set). A Triton kernel met with a new specialisation (an
integer argument that is now 1 or a multiple of 16, a pointer at another alignment) is compiled, or read back from
Triton's disk cache, inside the step that launches it. vLLM's JIT monitor names such a kernel once (with
``--jit-monitor-verbose`` every time), but not when on the clock the project's request points use. Each compile
here logs ``[KaniJit] kernel=NAME start=T ms=D warmup=W spec=KEY``: ``T`` in ``time.perf_counter()`` seconds
(CLOCK_MONOTONIC, one clock for every process of the host, as ``[KaniFirstOutput]``), ``D`` the compile's
milliseconds (a read from the disk cache included), ``KEY`` Triton's cache key (which specialisation was new).
Both of Triton's hooks are chained: whatever was installed before (vLLM's monitor) still runs.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from vllm_omni_kani.envs import jit_events

logger = logging.getLogger(__name__)

_installed = False
SPEC_CHARS = 800  # of Triton's cache key: each argument's type and specialisation in order ('D': divisible by 16)


def _name(kwargs: dict[str, Any]) -> str:
    fn = kwargs.get("fn")
    return str(getattr(fn, "name", None) or getattr(fn, "__name__", None) or "<unknown>")


def install() -> bool:
    """Chain the hooks if ``KANI_JIT_EVENTS`` asks for them and Triton is importable; returns whether they are in."""
    global _installed
    if _installed or not jit_events():
        return _installed
    try:
        from triton import knobs
    except ImportError:
        return False
    cache_hook, post_hook = knobs.runtime.jit_cache_hook, knobs.runtime.jit_post_compile_hook
    starts: dict[Any, float] = {}

    def on_cache_miss(**kwargs: Any) -> Any:
        # Called before a compile; a true answer would skip it, so the chained hook's answer is returned as is.
        starts[(_name(kwargs), str(kwargs.get("key")))] = time.perf_counter()
        return cache_hook(**kwargs) if cache_hook is not None else None

    def on_compiled(**kwargs: Any) -> Any:
        end = time.perf_counter()
        name = _name(kwargs)
        start = starts.pop((name, str(kwargs.get("key"))), end)
        logger.info(
            "[KaniJit] kernel=%s start=%.6f ms=%.1f warmup=%s spec=%s",
            name,
            start,
            (end - start) * 1e3,
            bool(kwargs.get("is_manual_warmup")),
            str(kwargs.get("key", ""))[:SPEC_CHARS],
        )
        return post_hook(**kwargs) if post_hook is not None else None

    knobs.runtime.jit_cache_hook = on_cache_miss
    knobs.runtime.jit_post_compile_hook = on_compiled
    _installed = True
    logger.info("KANI_JIT_EVENTS: Triton compiles are logged ([KaniJit])")
    return True
