"""The API server's event-loop lag meter (``KANI_LOOP_LAG_S``): a blocked loop shows in its line, off costs nothing."""

from __future__ import annotations

import asyncio
import logging
import re
import time

import pytest

from vllm_omni_kani.entrypoints.loop_lag import LoopLagMeter
from vllm_omni_kani.envs import KANI_LOOP_LAG_S, loop_lag_interval_s

LINE = re.compile(r"kani api loop lag: p50 ([\d.]+) ms, p99 ([\d.]+) ms, max ([\d.]+) ms, late (\d+)% of ([\d.]+) s")
BLOCK_S = 0.12


def test_a_blocked_loop_shows_as_the_windows_largest_lag(caplog):
    caplog.set_level(logging.INFO, logger="vllm_omni_kani.entrypoints.loop_lag")

    async def serve() -> LoopLagMeter:
        meter = LoopLagMeter(interval_s=0.4)
        meter.ensure_started()
        meter.ensure_started()  # once per loop
        await asyncio.sleep(0.05)
        time.sleep(BLOCK_S)  # a callback that holds the loop
        await asyncio.sleep(0.6)
        meter.task.cancel()
        return meter

    asyncio.run(serve())
    windows = [tuple(map(float, m.groups())) for m in map(LINE.search, caplog.messages) if m]
    assert windows, caplog.messages
    p50, p99, top, late, seconds = windows[0]
    # The tick that spanned the block woke at least BLOCK_S - one tick late; the others were on time.
    assert top >= 1e3 * (BLOCK_S - 0.005), windows
    assert p50 < top and p99 <= top and seconds >= 0.4
    assert late >= 100 * (BLOCK_S - 0.005) / seconds - 1, windows


def test_off_by_default_starts_no_task(monkeypatch):
    monkeypatch.delenv(KANI_LOOP_LAG_S, raising=False)

    async def serve() -> LoopLagMeter:
        meter = LoopLagMeter()
        meter.ensure_started()
        return meter

    assert asyncio.run(serve()).task is None


def test_the_variable_is_read_as_seconds(monkeypatch):
    monkeypatch.setenv(KANI_LOOP_LAG_S, "2.5")
    assert loop_lag_interval_s() == 2.5
    monkeypatch.setenv(KANI_LOOP_LAG_S, "soon")
    with pytest.raises(ValueError, match="KANI_LOOP_LAG_S='soon'"):
        loop_lag_interval_s()
