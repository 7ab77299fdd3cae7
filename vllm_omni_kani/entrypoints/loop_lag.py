"""The API server's event-loop lag, logged every ``KANI_LOOP_LAG_S`` seconds.

Served at 64 streams on an H200, a new request waited 48 / 168 ms (p50 / p95) between its admission and the speech
handler, and 48 / 129 ms before its admission, though neither computes much (docs/BENCHMARKS.md, fourteenth set):
its coroutine waits while the event loop runs the other streams' work. This meter measures that wait on its own: a
task asks to wake every ``TICK_S`` and notes how late it woke. Each window's line gives the lag's p50 / p99 / max
and how much of the window the loop spent late, so a blocked loop shows up beside Stage 0's step line.
"""

from __future__ import annotations

import asyncio
import logging
import time

from vllm_omni_kani.envs import loop_lag_interval_s

logger = logging.getLogger(__name__)

TICK_S = 0.005


class LoopLagMeter:
    """One task on the serving loop; started by the first request that passes the speech guard."""

    def __init__(self, interval_s: float | None = None, tick_s: float = TICK_S) -> None:
        self.interval_s = loop_lag_interval_s() if interval_s is None else interval_s
        self.tick_s = tick_s
        self.task: asyncio.Task | None = None

    def ensure_started(self) -> None:
        """Start the meter on the running loop, once (a no-op when off)."""
        if self.interval_s > 0 and self.task is None:
            self.task = asyncio.get_running_loop().create_task(self._run(), name="kani-loop-lag")

    async def _run(self) -> None:
        lags: list[float] = []
        start = time.perf_counter()
        while True:
            before = time.perf_counter()
            await asyncio.sleep(self.tick_s)
            now = time.perf_counter()
            lags.append(max(now - before - self.tick_s, 0.0))
            if now - start >= self.interval_s:
                self._log(lags, now - start)
                lags, start = [], now

    @staticmethod
    def _log(lags: list[float], elapsed: float) -> None:
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
