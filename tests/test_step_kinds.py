"""Stage 0's step-kind meter (``core/sched/step_kinds.py``): each step under its kind, timed end to end.

The served path (a real scheduler on a real server logging the line) is checked in ``test_serving.py``'s
flattened-server test.
"""

from __future__ import annotations

import re
from types import SimpleNamespace

from vllm_omni_kani.core.sched.step_kinds import IDLE_S, StepKindMeter, step_kind


def _output(tokens: dict[str, int], new: int = 0, finished: tuple[str, ...] = (), resumed: tuple[str, ...] = ()):
    """What the meter reads of a vLLM ``SchedulerOutput``."""
    return SimpleNamespace(
        num_scheduled_tokens=tokens,
        total_num_scheduled_tokens=sum(tokens.values()),
        scheduled_new_reqs=[object()] * new,
        scheduled_cached_reqs=SimpleNamespace(resumed_req_ids=set(resumed)),
        finished_req_ids=set(finished),
    )


def test_kinds_follow_new_requests_prompt_tokens_and_departures():
    assert step_kind(_output({"a": 1, "b": 1})) == ("decode", 2, 0, 2)
    assert step_kind(_output({"a": 1}, finished=("b",))) == ("finished", 1, 0, 1)
    assert step_kind(_output({"a": 1, "c": 40}, new=1)) == ("prefill", 2, 1, 41)
    assert step_kind(_output({"a": 1, "c": 40}, finished=("b",))) == ("prefill", 2, 0, 41)  # a chunked prompt
    assert step_kind(_output({"a": 1, "d": 1}, resumed=("d",))) == ("prefill", 2, 1, 2)


def test_a_window_times_each_kind_from_the_step_before_it():
    meter = StepKindMeter(interval_s=1.0)
    t = 100.0
    lines = []
    plan = [({"a": 1, "b": 1}, 0, (), 0.010)] * 6 + [({"a": 1, "b": 1, "c": 30}, 1, (), 0.030)] * 2
    plan += [({"a": 1}, 0, ("b",), 0.020)] * 2 + [({"a": 1}, 0, (), 0.010)] * 100
    for tokens, new, finished, seconds in plan:
        meter.scheduled(_output(tokens, new, finished), called=t + 0.001)
        t += seconds
        line = meter.updated(now=t)
        if line:
            lines.append(line)
    first = lines[0]
    # The first step opens the window at its schedule; each later one starts where the one before it ended.
    decode, decode_ms = re.search(r"decode (\d+) x ([\d.]+) ms", first).groups()
    assert abs(float(decode_ms) * int(decode) - (10.0 * int(decode) - 1.0)) < 0.01 * int(decode), first  # 1st: 9 ms
    assert "prefill 2 x 30.00 ms (rows 3.0, new 1.0, tokens 32.0)" in first, first
    assert "finished 2 x 20.00 ms (rows 1.0)" in first, first
    seconds = float(re.search(r"over ([\d.]+) s", first).group(1))
    assert seconds >= 1.0 and abs(int(decode) * 0.010 + 2 * 0.030 + 2 * 0.020 - 0.001 - seconds) < 0.05, first
    assert meter.tallies["prefill"].steps == 0  # the next window starts empty


def test_an_idle_engine_is_no_part_of_a_step():
    meter = StepKindMeter(interval_s=0.05)
    meter.scheduled(_output({"a": 1}), called=10.0)
    assert meter.updated(now=10.01) is None
    # The engine idles, then a new request arrives: its step starts at its schedule, in a new window.
    meter.scheduled(_output({"b": 30}, new=1), called=10.01 + IDLE_S + 5.0)
    assert meter.updated(now=10.01 + IDLE_S + 5.02) is None
    meter.scheduled(_output({"b": 1}), called=10.01 + IDLE_S + 5.021)
    line = meter.updated(now=10.01 + IDLE_S + 5.07)
    assert line is not None and "prefill 1 x 20.00 ms" in line and "decode 1 x 50.00 ms" in line, line
    # An empty schedule (nothing to run) opens no step, and an update without one is ignored.
    meter.scheduled(_output({}), called=20.0)
    assert meter.updated(now=20.1) is None and not meter._open


def test_a_step_after_an_emptied_scheduler_starts_at_its_schedule():
    """Between two waves the engine waits for input: that wait is no part of the next wave's first (prefill) step."""
    meter = StepKindMeter(interval_s=10.0)
    meter.scheduled(_output({"a": 1}), called=1.0)
    meter.updated(now=1.010, emptied=True)  # a's last step: the scheduler is empty
    meter.scheduled(_output({"b": 30}, new=1), called=1.300)  # 0.29 s later, within IDLE_S
    meter.updated(now=1.320)
    meter.scheduled(_output({"b": 1}), called=1.321)
    meter.updated(now=1.330)
    assert abs(meter.tallies["prefill"].seconds - 0.020) < 1e-9
    assert abs(meter.tallies["decode"].seconds - (0.010 + 0.010)) < 1e-9  # chained again after the prefill


def test_a_burst_that_empties_the_scheduler_closes_its_window():
    """A level shorter than the interval, then an idle engine: its line comes when the scheduler empties (a burst of
    at least IDLE_S), not never; a shorter lull between waves keeps the window open."""
    meter = StepKindMeter(interval_s=5.0)
    t = 1.0
    meter.scheduled(_output({"a": 1}), called=t)
    assert meter.updated(now=t + 0.01, emptied=True) is None  # 10 ms of steps: the window stays open
    lines = []
    for step in range(60):
        tokens = {"a": 30} if step == 0 else {"a": 1}
        meter.scheduled(_output(tokens, new=int(step == 0)), called=t + 0.02 + 0.02 * step)
        lines.append(meter.updated(now=t + 0.04 + 0.02 * step, emptied=step == 59))
    assert lines[:-1] == [None] * 59
    assert lines[-1] is not None and "prefill 1 x 20.00 ms" in lines[-1] and "decode 60 x" in lines[-1], lines[-1]
    assert all(tally.steps == 0 for tally in meter.tallies.values())  # the next burst opens a new window


def test_async_scheduling_overlaps_two_open_steps():
    meter = StepKindMeter(interval_s=10.0)
    meter.scheduled(_output({"a": 1}), called=1.0)
    meter.scheduled(_output({"a": 1, "b": 20}, new=1), called=1.002)  # scheduled while the first one runs
    meter.updated(now=1.010)
    meter.updated(now=1.020)
    assert meter.tallies["decode"].steps == 1 and abs(meter.tallies["decode"].seconds - 0.010) < 1e-9
    assert meter.tallies["prefill"].steps == 1 and abs(meter.tallies["prefill"].seconds - 0.018) < 1e-9


def test_with_the_admission_cadence_each_window_gives_the_steps_it_held_prompts_back():
    held = {"n": 3}  # the gate's count before the first window
    meter = StepKindMeter(interval_s=0.05, held_steps=lambda: held["n"])
    lines, t = [], 1.0
    for step in range(12):
        held["n"] += step % 2  # every other step sets the waiting prompts aside
        meter.scheduled(_output({"a": 1}), called=t)
        t += 0.01
        line = meter.updated(now=t)
        if line:
            lines.append(line)
    assert [re.search(r"; held (\d+) over", line).group(1) for line in lines] == ["2", "3"], lines
    assert "held" not in StepKindMeter(interval_s=0.0)._log(1.0)  # without the cadence the line is as before
