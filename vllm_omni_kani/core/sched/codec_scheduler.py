"""Stage 1's scheduler: a codec step takes at most ``codec_step_max_frames`` frames, earliest chunks first.

vLLM-Omni's generation scheduler puts every chunk that has arrived into the next step. Under load a codec step
decodes thousands of frames (256 streams of 64-frame chunks: ~16,000 frames, about a second), and a new stream's
3-frame first chunk that arrives meanwhile waits for all of it: served at 256 streams the codec's first audio came
650-850 ms after a request reached Stage 1, though it needs only ~0.1 s of Stage 0 (docs/BENCHMARKS.md). Bounding
a step in frames bounds that wait to one bounded step. Served on one H200 that shortened no TTFA, so it is off by
default (``DEFAULT_STEP_MAX_FRAMES``): the first audio's wait was mostly each new stream's state-slot zeroing in
the codec (``StreamingCodec.zero_acquired`` now does it once per step), not the steps' length.

Which chunks go first: every first chunk (a new stream: it is what its client is waiting for), then the others in
the running queue's order. Chunks past the budget are not dropped: their requests keep their chunk, stay ready and
go to the head of the queue, and the head always goes, so every chunk runs within a few steps and one larger than
the budget still runs.

``codec_first_chunks_alone`` (off unless set; the shipped GPU file sets it) goes further for the first audio: a
step that has first chunks takes only those (a few frames each, one short replay) and the running streams' chunks go
in the next step, which takes everything that is ready then. So no two steps in a row hold running streams back, and
a running chunk waits one short step at most. The first-output trace put a first chunk's codec step at 15-41 ms p50
at 64 streams on an H200 (docs/BENCHMARKS.md, twenty-first set), where a step of first chunks alone replays in
5-19 ms (fifteenth set). With requests arriving one by one at 256 streams it cut that step from 154-161 to
103-114 ms p50 and TTFA by 9-12% (twenty-second set).

``codec_urgent_chunks`` (default 1) is how many of a stream's first chunks get the first chunk's place: before the
budget and, with ``codec_first_chunks_alone``, in the step of first chunks alone. With 2 a stream's second chunk
rides in that short step as well instead of waiting for the next step of every running stream. Why: a stream's first
chunk is 240 ms of audio, and its player runs dry unless the second chunk arrives before that has played; served on
one H200 at 256 streams of 250-frame requests 13-18% of the requests stalled right after their first chunk
(docs/BENCHMARKS.md, fifty-fourth set), where a step of every running stream's chunks (up to 64 frames each) takes a
few hundred milliseconds. Served (fifty-fifth set) 2.5-11% of those requests stalled with 2 against 13.5-14% with 1,
at -3 and -4% frames/s there, within what two runs of the shipped file differed by; the stalls left are Stage 0's
own pace (its 8 steps for the second chunk take longer than the first chunk plays), which paced chunks
(``codec_chunk_lead_ms``, Stage 0's side) address. 1 keeps the shipped behaviour.

``codec_first_chunks_out_first`` (off unless set) hands a step of first chunks back before the next step is
scheduled. Under async scheduling vLLM's batch queue (``EngineCore.step_with_batch_queue``) schedules and launches
step N+1 before it waits for step N and turns it into outputs, so a short step of first chunks leaves only after
the next, often larger, step has been assembled and launched: in about half of such steps the first audio left
8-10 ms p50 after the next step was scheduled (fiftieth set). With the key on, ``has_requests()`` reads False from
the scheduling of a step that holds a first chunk until ``update_from_output`` has taken that step, so the engine
pops it instead of scheduling another; the next step is then scheduled after it (the GPU idles for that step's
host work, and the engine loop sleeps 1 ms once). Without a batch queue (the CPU platform: no async scheduling)
every step is taken in the call that scheduled it, and the key changes nothing. Served on one H200 (fifty-first
set) no first audio left after the next step any more and a first chunk's codec step at 256 streams was ~11 ms
shorter p50, but TTFA and frames/s showed no resolved difference, so it stays off; a few percent of the requests then
finished in the codec before the orchestrator took their last Stage-0 output (dropped with vLLM-Omni's warning; the
audio is whole).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from vllm.v1.request import Request
from vllm_omni.core.sched.omni_generation_scheduler import OmniGenerationScheduler

from vllm_omni_kani.core.sched.first_outputs import FirstOutputTracing
from vllm_omni_kani.model_executor.models.kani_tts.configuration import (
    additional_config,
    additional_config_int,
    boolean_key,
)

logger = logging.getLogger(__name__)

# Frames one codec step may take (Stage 1 additional_config codec_step_max_frames; 0 = no bound). No bound by
# default: served on one H200 (docs/BENCHMARKS.md, fifteenth set) a bound of 1,024 or 4,096 frames shortened
# neither the time to first audio nor anything else (two runs each way, same machine), and cost frames/s at 256
# streams; the knob stays for deployments whose codec steps are long (kani_tts_cpu.yaml).
DEFAULT_STEP_MAX_FRAMES = 0
# Stage 1 additional_config: a step with first chunks takes nothing else (module docstring).
FIRST_CHUNKS_ALONE_KEY = "codec_first_chunks_alone"
# Stage 1 additional_config: a step with first chunks is taken before the next is scheduled (module docstring).
FIRST_CHUNKS_OUT_FIRST_KEY = "codec_first_chunks_out_first"
# Stage 1 additional_config: how many of a stream's first chunks are scheduled as first chunks are (module docstring).
URGENT_CHUNKS_KEY = "codec_urgent_chunks"
DEFAULT_URGENT_CHUNKS = 1
# The scheduler logs what the bound did when it held chunks back, at most this often.
SUMMARY_INTERVAL_S = 10.0


def chunk_frames(request: Any) -> int:
    """Frames of the chunk a request carries (``additional_information``, where the connector put it)."""
    info = getattr(request, "additional_information", None)
    codes = info.get("codes") if isinstance(info, dict) else None
    shape = getattr(codes.get("audio") if isinstance(codes, dict) else None, "shape", None)
    return int(shape[0]) if shape else 0


def deferred_from(frames: Sequence[int], committed: int, budget: int) -> int:
    """Index from which the running requests' chunks (``frames``, in queue order) wait for a later step.

    ``committed`` frames are in the step already (first chunks, which always go). The queue's head always goes,
    even alone over the budget, so nothing waits forever; the rest go in order while the step stays within
    ``budget``, and from the first that does not fit on everything waits (no smaller chunk jumps the queue).
    ``budget`` <= 0: nothing waits (returns ``len(frames)``).
    """
    if budget <= 0 or not frames:
        return len(frames)
    total = committed + frames[0]
    for i in range(1, len(frames)):
        total += frames[i]
        if total > budget:
            return i
    return len(frames)


def step_cut(frames: Sequence[int], committed: int, budget: int, first_alone: bool, held_last: bool) -> int:
    """``deferred_from``, except that with ``first_alone`` a step with first chunks (``committed`` > 0) holds every
    running chunk back, unless the step before it already did (``held_last``): then the budget alone decides."""
    if first_alone and committed > 0 and not held_last:
        return 0
    return deferred_from(frames, committed, budget)


@dataclass
class BudgetStats:
    """What the bound did since the last summary line."""

    steps: int = 0
    bounded_steps: int = 0
    deferred: int = 0
    first_alone_steps: int = 0  # steps of first chunks alone (codec_first_chunks_alone)
    # Most frames of already-running streams that one step took. The step's first chunks are left out: those of
    # more waiting requests than the step can admit are ready too, so their sum says nothing about one step.
    largest_running_frames: int = 0
    since: float = 0.0


class KaniCodecScheduler(FirstOutputTracing, OmniGenerationScheduler):
    """vLLM-Omni's generation scheduler with each step bounded in codec frames (see the module docstring); with
    ``KANI_TRACE_FIRST_OUTPUTS`` it traces each stream's first chunk (its first scheduled step) and first audio."""

    trace_stage = 1

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        config = additional_config(self.vllm_config)
        self.step_max_frames = step_max_frames(config)
        self.first_chunks_alone = first_chunks_alone(config)
        self.first_chunks_out_first = boolean_key(config, FIRST_CHUNKS_OUT_FIRST_KEY)
        self.urgent_chunks = urgent_chunks(self.vllm_config)
        # id() of each scheduled step that holds a first chunk and that update_from_output has not taken yet (the
        # engine's batch queue keeps the step object alive until then, so the id is unique meanwhile).
        self._first_steps_in_flight: set[int] = set()
        self._held_last = False  # the last step held running chunks back for its first chunks
        self._taken: dict[str, int] = {}  # chunks a step has taken, per stream (request id) that had one
        self._deferred: list[Request] = []
        self._stats = BudgetStats(since=time.monotonic())
        self._last_summary: float | None = None
        adapter = self.chunk_transfer_adapter
        self._assembles = adapter is not None and (self.step_max_frames > 0 or self.first_chunks_alone)
        self._tracks_starts = self._assembles or self.first_chunks_out_first
        if self._assembles:
            # The budget applies right after this step's chunks were received, before the step is assembled.
            receive = adapter.process_pending_chunks

            def receive_then_bound(waiting: Any, running: list[Request], **kw: Any) -> None:
                receive(waiting, running, **kw)
                self._defer_over_budget(waiting, running)

            adapter.process_pending_chunks = receive_then_bound
        logger.info(
            "Kani codec scheduler: at most %s frames a step, %s first%s%s",
            self.step_max_frames if self.step_max_frames > 0 else "(no bound)",
            "first chunks" if self.urgent_chunks == 1 else f"a stream's first {self.urgent_chunks} chunks",
            ", and alone" if self.first_chunks_alone else "",
            ", out before the next step" if self.first_chunks_out_first else "",
        )

    def _ready(self, requests: Iterable[Request]) -> list[Request]:
        """The requests that carry a chunk not yet decoded (what the step would take)."""
        return [
            r for r in requests if r.request_id in self.requests and len(r.prompt_token_ids) - r.num_computed_tokens > 0
        ]

    def _defer_over_budget(self, waiting: Any, running: list[Request]) -> None:
        """Move the running requests whose chunks do not fit this step out of ``running`` until it is assembled.

        A first chunk (its stream never scheduled before), or one of a stream's first ``codec_urgent_chunks``, is
        never held, wherever it waits: Stage 1's requests are created when their Stage-0 request is submitted, so
        most streams are already running when their first chunk arrives, not waiting. (The connector resets a
        request's computed tokens with every chunk, so they cannot tell.)"""
        ready = self._ready(running)
        taken, urgent = self._taken, self.urgent_chunks
        firsts = [r for r in ready if taken.get(r.request_id, 0) < urgent]
        ready = [r for r in ready if taken.get(r.request_id, 0) >= urgent]
        committed = sum(chunk_frames(r) for r in self._ready(waiting)) + sum(chunk_frames(r) for r in firsts)
        frames = [chunk_frames(r) for r in ready]
        if not frames and not committed:
            return  # an idle tick: nothing arrived
        cut = step_cut(frames, committed, self.step_max_frames, self.first_chunks_alone, self._held_last)
        self._held_last = self.first_chunks_alone and committed > 0 and cut == 0 and bool(ready)
        stats = self._stats
        stats.steps += 1
        stats.first_alone_steps += self._held_last
        stats.largest_running_frames = max(stats.largest_running_frames, sum(frames[:cut]))
        if cut == len(ready):
            return
        stats.bounded_steps += 1
        stats.deferred += len(ready) - cut
        self._deferred = ready[cut:]
        held = {id(r) for r in self._deferred}
        running[:] = [r for r in running if id(r) not in held]
        # Held requests still occupy the stage: new ones are admitted against max_num_seqs as if they were running.
        self.max_num_running_reqs -= len(self._deferred)

    def schedule(self, throttle_prefills: bool = False) -> Any:
        try:
            scheduler_output = super().schedule(throttle_prefills)
            if self._tracks_starts:
                scheduled = scheduler_output.num_scheduled_tokens
                if self.first_chunks_out_first and any(rid not in self._taken for rid in scheduled):
                    self._first_steps_in_flight.add(id(scheduler_output))
                self._note_taken(scheduled)
            return scheduler_output
        finally:
            if self._deferred:
                # First in line next step.
                self.running[:0] = self._deferred
                self.max_num_running_reqs += len(self._deferred)
                self._deferred = []
            self._maybe_log_summary()

    def _note_taken(self, scheduled: Iterable[str]) -> None:
        """Count a chunk for each stream a step took one of; finished streams leave with their requests."""
        taken = self._taken
        for rid in scheduled:
            taken[rid] = taken.get(rid, 0) + 1
        for rid in [rid for rid in taken if rid not in self.requests]:
            del taken[rid]

    def has_requests(self) -> bool:
        """False while a step of first chunks is in flight, so the engine takes it before scheduling another."""
        if self._first_steps_in_flight:
            return False
        return super().has_requests()

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
        self._first_steps_in_flight.discard(id(scheduler_output))
        return super().update_from_output(scheduler_output, model_runner_output)

    def _maybe_log_summary(self) -> None:
        """A line when the bound held chunks back, at most every ``SUMMARY_INTERVAL_S`` (counts since the last)."""
        stats = self._stats
        now = time.monotonic()
        if not stats.deferred or (self._last_summary is not None and now - self._last_summary < SUMMARY_INTERVAL_S):
            return
        logger.info(
            "Kani codec scheduler: %d of %d steps in the last %.1f s held %d chunks for a later step "
            "(budget %d frames; at most %d frames of running streams in one step; %d steps of first chunks alone)",
            stats.bounded_steps,
            stats.steps,
            now - stats.since,
            stats.deferred,
            self.step_max_frames,
            stats.largest_running_frames,
            stats.first_alone_steps,
        )
        self._last_summary = now
        self._stats = BudgetStats(since=now)


def step_max_frames(config: Any) -> int:
    """``codec_step_max_frames`` of a Stage-1 ``additional_config`` (default ``DEFAULT_STEP_MAX_FRAMES``)."""
    raw = config.get("codec_step_max_frames", DEFAULT_STEP_MAX_FRAMES)
    try:
        value = int(raw)
    except (TypeError, ValueError):
        raise ValueError(f"codec_step_max_frames must be an integer (0: no bound), got {raw!r}") from None
    if value < 0:
        raise ValueError(f"codec_step_max_frames must be >= 0 (0: no bound), got {value}")
    return value


def first_chunks_alone(config: Any) -> bool:
    """``codec_first_chunks_alone`` of a Stage-1 ``additional_config`` (default off); a YAML boolean only."""
    return boolean_key(config, FIRST_CHUNKS_ALONE_KEY)


def urgent_chunks(vllm_config: Any) -> int:
    """``codec_urgent_chunks`` of Stage 1's ``additional_config``: an integer >= 1 (default 1: first chunks only)."""
    return additional_config_int(vllm_config, URGENT_CHUNKS_KEY, DEFAULT_URGENT_CHUNKS, least=1)
