"""Stage 0's step rate as the engine runs it, logged every ``KANI_STEP_STATS_S`` seconds.

The step-time benchmark times a Stage 0 alone; served, the same step shares its process with the connector's
threads and its GPU with the codec. This meter counts the steps and sampled rows the model sees (one
``compute_logits`` per step) with host clocks only (no device sync), so the served step period can be read from
the server log next to the benchmark's. With ``KANI_SAMPLER_AB_PERIOD_S`` (``sampler_ab``) a window is one A/B
window instead, and its line says whether the sampler patches took it. A second line gives the process's garbage
collections in the window (``gc_pauses``): one stops the step loop wherever it falls.
"""

from __future__ import annotations

import logging
import time

from vllm_omni_kani import sampler_ab
from vllm_omni_kani.envs import step_stats_interval_s
from vllm_omni_kani.gc_pauses import GcPauses, describe

logger = logging.getLogger(__name__)


class StepMeter:
    """Counts steps and rows; every ``interval_s`` logs steps/s, ms per step, rows/s and the mean batch.

    A window opens at a step and closes at the first step ``interval_s`` later; a pause longer than the interval
    (an idle engine) drops the open window, so the numbers describe a busy engine. With an A/B period
    (``ab_period_s``), a window spans the steps of one A/B window: the step that crosses a boundary belongs to
    neither side, and the line ends with ``(sampler patches on)`` or ``(... off)``.
    """

    def __init__(
        self, interval_s: float | None = None, label: str = "stage0", ab_period_s: float | None = None
    ) -> None:
        self.interval_s = step_stats_interval_s() if interval_s is None else interval_s
        self.ab_period_s = sampler_ab.period_s() if ab_period_s is None else ab_period_s
        self.label = label
        self._start = 0.0
        self._last = float("-inf")
        self._periods = 0
        self._rows = 0
        self._window = -1
        self.gc = GcPauses()
        if self.enabled:
            self.gc.install()

    @property
    def enabled(self) -> bool:
        return self.interval_s > 0 or self.ab_period_s > 0

    def tick(self, rows: int, now: float | None = None) -> str | None:
        """Count one step of ``rows`` sampled rows; returns the logged line when a window closed."""
        if not self.enabled:
            return None
        now = time.monotonic() if now is None else now
        if self.ab_period_s > 0:
            return self._tick_ab(rows, now)
        if now - self._last > self.interval_s:
            self._open(now)
            return None
        self._last = now
        self._periods += 1
        self._rows += rows
        elapsed = now - self._start
        if elapsed < self.interval_s:
            return None
        line = self._log(elapsed)
        self._open(now)
        return line

    def _tick_ab(self, rows: int, now: float) -> str | None:
        window = sampler_ab.window(now, self.ab_period_s)
        if window == self._window and now - self._last <= self.ab_period_s:
            self._last = now
            self._periods += 1
            self._rows += rows
            return None
        line = None
        if self._periods and now - self._last <= self.ab_period_s:
            side = "on" if sampler_ab.patched_in(self._window) else "off"
            line = self._log(self._last - self._start, f" (sampler patches {side})")
        self._window = window
        self._open(now)
        return line

    def _log(self, elapsed: float, suffix: str = "") -> str:
        line = (
            f"kani {self.label} steps: {self._periods / elapsed:.1f} steps/s, "
            f"{1e3 * elapsed / self._periods:.2f} ms per step, {self._rows / elapsed:.0f} rows/s, "
            f"mean batch {self._rows / self._periods:.1f} over {elapsed:.1f} s{suffix}"
        )
        logger.info("%s", line)
        logger.info("kani %s gc: %s", self.label, describe(self.gc.take(), elapsed))
        return line

    def _open(self, now: float) -> None:
        self.gc.take()  # collections between windows (an idle engine) belong to none
        self._start = self._last = now
        self._periods = self._rows = 0
