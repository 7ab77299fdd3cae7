"""Stage 0's steps by kind (decode, or admitting a prompt), each timed end to end, logged every ``KANI_STEP_STATS_S`` s.

The step meter (``step_meter.py``) gives the mean served step. A step that admits a new prompt differs from a decode
step: vLLM runs it as a mixed batch (CUDA graphs in pieces around the attention and short-conv layers, not one full
graph) and the runners do their per-request set-up in it. The first-output trace puts such a step at ~23 ms beside a
mean of ~9 ms at 64 streams on an H200 (docs/BENCHMARKS.md, twenty-first set), and at 256 streams about one request
arrives per step. This meter splits every window's steps into

- ``decode``: every scheduled request decodes one token and none left the batch since the last step;
- ``finished``: the same, but requests left the batch (the runner's input batch condenses);
- ``prefill``: a new or resumed request is scheduled, or some request has more than one token (a prompt),

and logs, per kind, its steps, ms per step, mean rows, and for ``prefill`` the new requests and tokens per step (also
when a burst of at least ``IDLE_S`` empties the scheduler, so a short benchmark level gets its line):

    kani stage0 step kinds: decode 412 x 9.10 ms (rows 48.2); finished 30 x 11.02 ms (rows 47.9); prefill 58 x
    22.81 ms (rows 49.0, new 1.1, tokens 90.2) over 5.0 s

With the admission cadence on (``admission_cadence.py``, ``kani_admit_every_steps`` > 1) the line also gives
``held N``: the window's steps that set waiting prompts aside for a later step.

A step lasts from the end of the step before it (its outputs out of the scheduler) to the end of its own: the engine's
intake of the requests it admits, ``schedule``, the model step and its outputs' processing. A step after an empty
scheduler (the engine waited for input: between two waves of a benchmark) starts at its ``schedule``, and a gap over
``IDLE_S`` also opens a new window. Host clocks only.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from vllm_omni_kani.envs import step_stats_interval_s

logger = logging.getLogger(__name__)

KINDS = ("decode", "finished", "prefill")
# A gap this long between one step's outputs and the next schedule is an idle engine, not part of a step.
IDLE_S = 1.0


@dataclass
class _Tally:
    steps: int = 0
    seconds: float = 0.0
    rows: int = 0
    new: int = 0
    tokens: int = 0


def step_kind(scheduler_output: Any) -> tuple[str, int, int, int]:
    """``(kind, rows, new requests, tokens)`` of a vLLM ``SchedulerOutput`` (module docstring)."""
    per_request = scheduler_output.num_scheduled_tokens
    rows, tokens = len(per_request), scheduler_output.total_num_scheduled_tokens
    cached = scheduler_output.scheduled_cached_reqs
    new = len(scheduler_output.scheduled_new_reqs) + len(getattr(cached, "resumed_req_ids", ()) or ())
    if new or tokens > rows:
        return "prefill", rows, new, tokens
    return ("finished" if scheduler_output.finished_req_ids else "decode"), rows, new, tokens


class StepKindMeter:
    """Tallies each step under its kind and logs a line per window (module docstring)."""

    def __init__(self, interval_s: float, label: str = "stage0", held_steps: Callable[[], int] | None = None) -> None:
        self.interval_s = interval_s
        self.label = label
        # With the admission cadence on: its count of steps that set the waiting prompts aside, read per window.
        self.held_steps = held_steps
        self._held_at_start = held_steps() if held_steps else 0
        self.tallies = {kind: _Tally() for kind in KINDS}
        self._window_start = 0.0
        self._last_end: float | None = None
        self._emptied = False  # the last step left the scheduler empty: the next one starts at its schedule
        # Steps scheduled and not yet updated (two under async scheduling): start, kind, rows, new, tokens.
        self._open: deque[tuple[float, str, int, int, int]] = deque()

    def scheduled(self, scheduler_output: Any, called: float) -> None:
        """A step was scheduled by a ``schedule`` call that began at ``called``."""
        if scheduler_output.total_num_scheduled_tokens <= 0:
            return
        last = self._last_end
        chained = last is not None and not self._emptied and not self._open and called - last <= IDLE_S
        self._open.append((last if chained else called, *step_kind(scheduler_output)))

    def updated(self, now: float | None = None, emptied: bool = False) -> str | None:
        """The oldest open step's outputs are out: tally it; returns the logged line when a window closed.
        ``emptied``: no request is left in the scheduler, so the engine waits for input before its next step."""
        if not self._open:
            return None
        now = time.perf_counter() if now is None else now
        start, kind, rows, new, tokens = self._open.popleft()
        if self._last_end is None or start - self._last_end > IDLE_S:
            self._reset(start)  # the first step, or the first after a long idle: a new window
        self._last_end = now
        self._emptied = emptied
        tally = self.tallies[kind]
        tally.steps += 1
        tally.seconds += now - start
        tally.rows += rows
        tally.new += new
        tally.tokens += tokens
        # A burst that empties the scheduler closes its window too (when it is at least IDLE_S long): a benchmark level
        # shorter than the interval, followed by an idle engine, would otherwise never be logged.
        age = now - self._window_start
        return self._log(now) if age >= self.interval_s or (emptied and age >= IDLE_S) else None

    def _reset(self, now: float) -> None:
        self.tallies = {kind: _Tally() for kind in KINDS}
        self._window_start = now
        if self.held_steps:
            self._held_at_start = self.held_steps()

    def _log(self, now: float) -> str:
        parts = []
        for kind in KINDS:
            t = self.tallies[kind]
            if not t.steps:
                parts.append(f"{kind} 0")
                continue
            text = f"{kind} {t.steps} x {1e3 * t.seconds / t.steps:.2f} ms (rows {t.rows / t.steps:.1f}"
            if kind == "prefill":
                text += f", new {t.new / t.steps:.1f}, tokens {t.tokens / t.steps:.1f}"
            parts.append(text + ")")
        if self.held_steps:
            parts.append(f"held {self.held_steps() - self._held_at_start}")
        line = f"kani {self.label} step kinds: {'; '.join(parts)} over {now - self._window_start:.1f} s"
        logger.info("%s", line)
        self._reset(now)
        return line


class StepKinds:
    """A scheduler mixin: a ``StepKindMeter`` when ``KANI_STEP_STATS_S`` is on, else one attribute check a step."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        interval_s = step_stats_interval_s()
        gate = getattr(self, "admission_gate", None)
        held = (lambda: gate.deferred_steps) if gate is not None and gate.every > 1 else None
        self.step_kind_meter = StepKindMeter(interval_s, held_steps=held) if interval_s > 0 else None

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        if self.step_kind_meter is None:
            return super().schedule(*args, **kwargs)
        called = time.perf_counter()
        scheduler_output = super().schedule(*args, **kwargs)
        self.step_kind_meter.scheduled(scheduler_output, called)
        return scheduler_output

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
        outputs = super().update_from_output(scheduler_output, model_runner_output)
        if self.step_kind_meter is not None and scheduler_output.total_num_scheduled_tokens > 0:
            self.step_kind_meter.updated(emptied=not self.has_unfinished_requests())
        return outputs
