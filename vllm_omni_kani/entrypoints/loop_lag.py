"""The API server's event-loop lag, logged every ``KANI_LOOP_LAG_S`` seconds.

Served at 64 streams on an H200, a new request waited 48 / 168 ms (p50 / p95) between its admission and the speech
handler, and 48 / 129 ms before its admission, though neither computes much (docs/BENCHMARKS.md, fourteenth set):
its coroutine waits while the event loop runs the other streams' work. This meter measures that wait on its own: a
task asks to wake every ``TICK_S`` and notes how late it woke. Each window's line gives the lag's p50 / p99 / max
and how much of the window the loop spent late, so a blocked loop shows up beside Stage 0's step line. Two more lines
say what blocked it: the process's garbage collections in the window (``gc_pauses``), and, with
``KANI_LOOP_STALL_MS``, the stacks the loop thread stood in while it was stalled (``loop_stalls``). With
``KANI_LOOP_GC_CENSUS=1`` a third line says what the oldest generation holds, which is what a full collection walks
(the start-up heap is frozen, so under load it is what the load keeps alive).
"""

from __future__ import annotations

import asyncio
import logging
import time

from vllm_omni_kani.entrypoints.loop_stalls import LoopStallSampler
from vllm_omni_kani.envs import loop_gc_census, loop_lag_interval_s, loop_stall_threshold_s
from vllm_omni_kani.gc_pauses import GcPauses, census, describe

logger = logging.getLogger(__name__)

TICK_S = 0.005


class LoopLagMeter:
    """One task on the serving loop; started by the first request that passes the speech guard."""

    def __init__(
        self,
        interval_s: float | None = None,
        tick_s: float = TICK_S,
        stall_s: float | None = None,
        gc_census: bool | None = None,
    ) -> None:
        self.interval_s = loop_lag_interval_s() if interval_s is None else interval_s
        self.stall_s = loop_stall_threshold_s() if stall_s is None else stall_s
        self.gc_census = loop_gc_census() if gc_census is None else gc_census
        self.tick_s = tick_s
        self.task: asyncio.Task | None = None
        self.gc = GcPauses()
        self.stalls: LoopStallSampler | None = None

    def ensure_started(self) -> None:
        """Start the meter on the running loop, once (a no-op when off)."""
        if self.interval_s > 0 and self.task is None:
            self.task = asyncio.get_running_loop().create_task(self._run(), name="kani-loop-lag")

    async def _run(self) -> None:
        self.gc.install()
        if self.stall_s > 0:
            self.stalls = LoopStallSampler(self.stall_s)
        try:
            lags: list[float] = []
            start = time.perf_counter()
            while True:
                before = time.perf_counter()
                await asyncio.sleep(self.tick_s)
                now = time.perf_counter()
                if self.stalls is not None:
                    self.stalls.beat()
                lags.append(max(now - before - self.tick_s, 0.0))
                if now - start >= self.interval_s:
                    self._log(lags, now - start)
                    lags, start = [], now
        finally:
            self.gc.uninstall()
            if self.stalls is not None:
                self.stalls.stop()

    def _log(self, lags: list[float], elapsed: float) -> None:
        ms = sorted(1e3 * lag for lag in lags)

        def pct(q: int) -> float:
            return ms[min(len(ms) - 1, len(ms) * q // 100)]

        logger.info(
            "kani api loop lag: p50 %.1f ms, p99 %.1f ms, max %.1f ms, late %.0f%% of %.1f s (%d ticks)",
            pct(50),
            pct(99),
            ms[-1],
            100 * sum(lags) / elapsed,
            elapsed,
            len(ms),
        )
        logger.info("kani api gc: %s", describe(self.gc.take(), elapsed))
        if self.gc_census:
            found = census()
            logger.info(
                "kani api gc census: %d objects in the oldest generation, commonest: %s; suspended: %s",
                found.count,
                ", ".join(f"{name} {n}" for name, n in found.commonest),
                ", ".join(f"{name} {n}" for name, n in found.suspended) or "none",
            )
        if self.stalls is None:
            return
        stalls, seconds, loop, others = self.stalls.take()
        if not stalls:
            return
        logger.info(
            "kani api loop stalls: %d of >= %.0f ms, %.0f ms sampled", stalls, 1e3 * self.stall_s, 1e3 * seconds
        )
        for held, stack in loop:
            logger.info("kani api loop stall, loop thread, %.0f ms: %s", 1e3 * held, stack)
        for held, stack in others:
            logger.info("kani api loop stall, other thread busy, %.0f ms: %s", 1e3 * held, stack)
