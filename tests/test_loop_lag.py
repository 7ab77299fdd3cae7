"""The API server's event-loop lag meter (``KANI_LOOP_LAG_S``): a blocked loop shows in its line, with what blocked it
(``KANI_LOOP_STALL_MS``, collections); off costs nothing."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from vllm_omni_kani.entrypoints.loop_lag import LoopLagMeter
from vllm_omni_kani.envs import (
    KANI_LOOP_GC_CENSUS,
    KANI_LOOP_LAG_S,
    KANI_LOOP_STALL_MS,
    loop_gc_census,
    loop_lag_interval_s,
    loop_stall_threshold_s,
)

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


def _hold_the_loop(meter: LoopLagMeter, samples: int, timeout_s: float = 30.0) -> None:
    """Pure Python work on the loop thread (a blocking callback) until the watchdog has sampled it ``samples`` times
    and seen another thread busy once: how long that takes depends on the machine's load, not on the test."""
    end = time.perf_counter() + timeout_s
    stalls = meter.stalls
    while time.perf_counter() < end:
        if sum(stalls.loop_stacks.values()) >= samples and stalls.other_stacks:
            return
        sum(range(100))


def _busy_elsewhere(done: threading.Event) -> None:
    while not done.is_set():
        sum(range(100))


def _names(stack: str, frame: str) -> bool:
    """Whether a logged stack (``outer (file:line) < ... < leaf (file)``) holds ``frame``, with or without its line."""
    return any(part.startswith(frame) for part in stack.split(" < "))


def test_a_stall_names_the_function_that_held_the_loop_and_gc_is_timed(caplog):
    caplog.set_level(logging.INFO, logger="vllm_omni_kani.entrypoints.loop_lag")

    async def serve() -> LoopLagMeter:
        meter = LoopLagMeter(interval_s=0.5, stall_s=0.03)
        meter.ensure_started()
        idle_pool = ThreadPoolExecutor(1)
        idle_pool.submit(int).result()  # its worker now waits for work in C
        await asyncio.sleep(0.05)
        done = threading.Event()
        busy = threading.Thread(target=_busy_elsewhere, args=(done,))
        busy.start()
        _hold_the_loop(meter, samples=5)
        done.set()
        busy.join()
        idle_pool.shutdown()
        gc.collect(2)
        await asyncio.sleep(0.5)
        meter.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await meter.task
        return meter

    meter = asyncio.run(serve())
    assert meter.stalls is not None and not meter.stalls._thread.is_alive()
    text = "\n".join(caplog.messages)
    stalls = re.search(r"kani api loop stalls: (\d+) of >= 30 ms, (\d+) ms sampled", text)
    assert stalls, text
    # One stall, held until it had five 10-ms samples.
    assert int(stalls[1]) >= 1 and int(stalls[2]) >= 50, text
    held = re.findall(r"kani api loop stall, loop thread, (\d+) ms: (.*)", text)
    assert held and held[0][1].endswith("_hold_the_loop (tests/test_loop_lag.py)"), held
    # The other thread that ran Python during the stall is named; the idle executor worker is not.
    others = re.findall(r"kani api loop stall, other thread busy, (\d+) ms: (.*)", text)
    # The busy thread may be sampled inside a callee (``Event.is_set``): its function is somewhere on the stack.
    assert any(_names(stack, "_busy_elsewhere (tests/test_loop_lag.py") for _, stack in others), others
    assert not any(_names(stack, "_worker (futures/thread.py") for _, stack in others), others
    gen2 = re.search(r"kani api gc: .*gen2 (\d+)x total ([\d.]+) ms", text)
    assert gen2 and int(gen2[1]) >= 1, text


def test_stall_sampling_is_off_by_default(monkeypatch):
    monkeypatch.delenv(KANI_LOOP_STALL_MS, raising=False)
    assert loop_stall_threshold_s() == 0.0
    monkeypatch.setenv(KANI_LOOP_STALL_MS, "50")
    assert loop_stall_threshold_s() == 0.05
    monkeypatch.setenv(KANI_LOOP_STALL_MS, "x")
    with pytest.raises(ValueError, match="KANI_LOOP_STALL_MS='x': expected a number of milliseconds"):
        loop_stall_threshold_s()


def test_the_gc_census_line_comes_only_when_asked(caplog, monkeypatch):
    """``KANI_LOOP_GC_CENSUS=1``: each window also says what the oldest generation holds; off, no such line."""
    caplog.set_level(logging.INFO, logger="vllm_omni_kani.entrypoints.loop_lag")
    census_line = re.compile(
        r"kani api gc census: (\d+) objects in the oldest generation, commonest: (\S.*); suspended: (\S.*)"
    )

    async def serve(**kwargs) -> None:
        meter = LoopLagMeter(interval_s=0.1, **kwargs)
        meter.ensure_started()
        await asyncio.sleep(0.35)
        meter.task.cancel()

    asyncio.run(serve(gc_census=False))
    assert not any(census_line.search(m) for m in caplog.messages)
    monkeypatch.setenv(KANI_LOOP_GC_CENSUS, "1")
    assert loop_gc_census()
    kept = [[] for _ in range(100)]
    gc.collect()  # these lists now sit in the oldest generation, even where an earlier test froze the heap
    asyncio.run(serve())
    found = [m for m in map(census_line.search, caplog.messages) if m]
    assert found and all(int(m[1]) >= len(kept) for m in found)
