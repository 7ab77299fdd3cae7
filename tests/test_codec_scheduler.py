"""Stage 1's frame-bounded steps (``core/sched/codec_scheduler.py``): which chunks wait, and the knob.

The scheduler itself runs in every served test: ``kani_tts_cpu.yaml`` bounds a codec step to 32 frames, so the
serving tests' concurrent streams (``test_serving.py``, ``test_reliability.py``, ``test_shm_cleanup.py``) decode
with chunks held back, and their audio is checked against solo runs and against each request's frames there;
``test_serving.py`` also reads the scheduler's summary line from the server's log. ``codec_first_chunks_out_first``
acts only through vLLM's batch queue, which the CPU platform never runs (no async scheduling): it is checked here
against vLLM's own ``EngineCore.step_with_batch_queue`` over the real scheduler, with an executor that queues steps.
"""

from __future__ import annotations

import queue
from collections import deque
from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from vllm.v1.outputs import ModelRunnerOutput

from vllm_omni_kani.core.sched.codec_scheduler import (
    DEFAULT_STEP_MAX_FRAMES,
    DEFAULT_URGENT_CHUNKS,
    FIRST_CHUNKS_ALONE_KEY,
    FIRST_CHUNKS_OUT_FIRST_KEY,
    URGENT_CHUNKS_KEY,
    BudgetStats,
    KaniCodecScheduler,
    boolean_key,
    chunk_frames,
    deferred_from,
    first_chunks_alone,
    step_cut,
    step_max_frames,
    urgent_chunks,
)
from vllm_omni_kani.model_executor.models.kani_tts.pipeline import CODEC_SCHEDULER, PIPELINES


def test_no_budget_holds_nothing():
    assert deferred_from([64] * 300, committed=0, budget=0) == 300
    assert deferred_from([], committed=90, budget=32) == 0


def test_chunks_go_in_queue_order_while_the_step_fits():
    assert deferred_from([16, 16, 16], committed=0, budget=32) == 2
    assert deferred_from([16, 16, 16], committed=0, budget=48) == 3
    # First chunks are in the step already: they take budget first.
    assert deferred_from([16, 16, 16], committed=9, budget=32) == 1


def test_a_smaller_chunk_never_jumps_the_queue():
    # The 64-frame chunk does not fit; the 8-frame one behind it would, but waits with it.
    assert deferred_from([16, 64, 8], committed=0, budget=40) == 1


def test_the_head_always_goes_even_over_the_budget():
    assert deferred_from([200, 8], committed=0, budget=64) == 1
    assert deferred_from([200], committed=30, budget=64) == 1


def test_first_chunks_alone_hold_every_running_chunk_but_never_two_steps_in_a_row():
    # A step with first chunks (committed) takes nothing else ...
    assert step_cut([64, 16, 32], committed=3, budget=0, first_alone=True, held_last=False) == 0
    # ... unless the step before it held running chunks back: then the budget decides (none here: all go).
    assert step_cut([64, 16, 32], committed=3, budget=0, first_alone=True, held_last=True) == 3
    assert step_cut([64, 16, 32], committed=3, budget=70, first_alone=True, held_last=True) == 1
    # Without first chunks, or with the knob off, the budget alone decides.
    assert step_cut([64, 16, 32], committed=0, budget=0, first_alone=True, held_last=False) == 3
    assert step_cut([64, 16, 32], committed=3, budget=0, first_alone=False, held_last=False) == 3


def test_a_run_of_steps_with_first_chunks_alternates_so_running_chunks_wait_one_step_at_most():
    held, taken = False, []
    for _ in range(6):  # new streams arrive before every step
        cut = step_cut([16] * 5, committed=3, budget=0, first_alone=True, held_last=held)
        held = cut == 0
        taken.append(cut)
    assert taken == [0, 5, 0, 5, 0, 5]


def _stream(request_id: str, frames: int) -> SimpleNamespace:
    """A Stage-1 request carrying a chunk as the step assembly sees it: the connector makes every chunk one
    placeholder token with nothing computed, the codes in its payload."""
    return SimpleNamespace(
        request_id=request_id,
        prompt_token_ids=[0],
        num_computed_tokens=0,
        additional_information={"codes": {"audio": torch.zeros(frames, 4, dtype=torch.long)}},
    )


def _assembly(first_alone: bool, budget: int = 0, urgent: int = DEFAULT_URGENT_CHUNKS) -> KaniCodecScheduler:
    """The scheduler's step-assembly state alone (no engine): what ``_defer_over_budget`` reads and writes."""
    scheduler = KaniCodecScheduler.__new__(KaniCodecScheduler)
    scheduler.step_max_frames, scheduler.first_chunks_alone = budget, first_alone
    scheduler._held_last, scheduler._deferred, scheduler._stats = False, [], BudgetStats()
    scheduler._taken, scheduler.urgent_chunks = {}, urgent
    scheduler.max_num_running_reqs = 256
    return scheduler


def test_a_running_streams_first_chunk_counts_as_first_and_takes_its_step_alone():
    """Stage 1's requests exist from their Stage-0 submission on, so a first chunk mostly arrives on a running
    request: a stream no step has taken a chunk of is what makes it first, not the waiting queue."""
    scheduler = _assembly(first_alone=True)
    old = [_stream(f"old{i}", 64) for i in range(3)]
    new = [_stream("new0", 3), _stream("new1", 3)]
    scheduler._taken = {r.request_id: 1 for r in old}
    running = [old[0], new[0], old[1], new[1], old[2]]
    scheduler.requests = {r.request_id: r for r in running}
    scheduler._defer_over_budget([], running)
    assert running == new and scheduler._deferred == old and scheduler._held_last
    assert scheduler._stats.first_alone_steps == 1 and scheduler.max_num_running_reqs == 256 - 3
    # The next step takes every running chunk, a new first chunk with them.
    scheduler._note_taken(r.request_id for r in new)
    newer = _stream("new2", 3)
    running = [*old, newer]
    scheduler.requests[newer.request_id] = newer
    scheduler._deferred, scheduler.max_num_running_reqs = [], 256
    scheduler._defer_over_budget([], running)
    assert running == [*old, newer] and scheduler._deferred == [] and not scheduler._held_last


def test_with_a_budget_a_running_first_chunk_is_never_held():
    scheduler = _assembly(first_alone=False, budget=64)
    running = [_stream("old0", 64), _stream("old1", 64), _stream("new", 3)]
    scheduler.requests = {r.request_id: r for r in running}
    scheduler._taken = {"old0": 1, "old1": 1}
    scheduler._defer_over_budget([], running)
    assert [r.request_id for r in running] == ["old0", "new"]
    assert [r.request_id for r in scheduler._deferred] == ["old1"]


def test_with_two_urgent_chunks_a_second_chunk_rides_in_the_step_of_first_chunks():
    """``codec_urgent_chunks: 2``: a stream with one chunk taken is still urgent, so its second chunk goes in the
    short step with the new streams' first chunks instead of waiting for the step of every running chunk; the
    streams past their second chunk wait for that step, as every running stream does with the default."""
    scheduler = _assembly(first_alone=True, urgent=2)
    long_running = [_stream(f"old{i}", 64) for i in range(3)]
    second = _stream("second", 8)
    new = _stream("new", 3)
    scheduler._taken = {**{r.request_id: 4 for r in long_running}, "second": 1}
    running = [long_running[0], second, long_running[1], new, long_running[2]]
    scheduler.requests = {r.request_id: r for r in running}
    scheduler._defer_over_budget([], running)
    assert running == [second, new] and scheduler._deferred == long_running and scheduler._held_last
    # The default: the second chunk waits with the running streams.
    scheduler = _assembly(first_alone=True)
    scheduler._taken = {**{r.request_id: 4 for r in long_running}, "second": 1}
    running = [long_running[0], second, long_running[1], new, long_running[2]]
    scheduler.requests = {r.request_id: r for r in running}
    scheduler._defer_over_budget([], running)
    assert running == [new] and scheduler._deferred == [long_running[0], second, *long_running[1:]]


def test_with_a_budget_urgent_chunks_are_never_held():
    scheduler = _assembly(first_alone=False, budget=64, urgent=2)
    running = [_stream("old0", 64), _stream("old1", 64), _stream("second", 8)]
    scheduler.requests = {r.request_id: r for r in running}
    scheduler._taken = {"old0": 3, "old1": 3, "second": 1}
    scheduler._defer_over_budget([], running)
    assert [r.request_id for r in running] == ["old0", "second"]
    assert [r.request_id for r in scheduler._deferred] == ["old1"]


def test_chunk_counts_leave_with_their_requests_over_many_streams():
    """Each step counts a chunk for the streams it took; a stream's count goes when its request does (finished or
    aborted): nothing is left over 10,000 streams."""
    scheduler = _assembly(first_alone=True, urgent=2)
    scheduler.requests = {}
    for i in range(10_000):
        rid = f"r{i}"
        scheduler.requests[rid] = _stream(rid, 8)
        scheduler._note_taken([rid])
        scheduler._note_taken([rid])
        assert scheduler._taken[rid] == 2
        if i % 3 == 0:
            del scheduler.requests[rid]  # finished or aborted right after its second chunk
        scheduler.requests.pop(f"r{i - 50}", None)  # the others 50 streams later
    scheduler._note_taken([])
    assert set(scheduler._taken) == set(scheduler.requests) and len(scheduler._taken) <= 50
    scheduler.requests.clear()
    scheduler._note_taken([])
    assert scheduler._taken == {}


def test_the_urgent_chunks_knob_is_a_positive_integer():
    def stage(**config: Any) -> SimpleNamespace:
        return SimpleNamespace(additional_config=config)

    assert urgent_chunks(stage()) == DEFAULT_URGENT_CHUNKS == 1
    assert urgent_chunks(stage(**{URGENT_CHUNKS_KEY: 2})) == 2
    for bad in (0, -1, "2", 1.5, True, None):
        with pytest.raises(ValueError, match=URGENT_CHUNKS_KEY):
            urgent_chunks(stage(**{URGENT_CHUNKS_KEY: bad}))


def test_the_first_chunks_alone_knob_is_a_boolean():
    assert first_chunks_alone({}) is False
    assert first_chunks_alone({FIRST_CHUNKS_ALONE_KEY: True}) is True
    for bad in ("yes", 1, None):
        with pytest.raises(ValueError, match=FIRST_CHUNKS_ALONE_KEY):
            first_chunks_alone({FIRST_CHUNKS_ALONE_KEY: bad})


def test_frames_are_read_from_the_chunk_a_request_carries():
    carrying = SimpleNamespace(additional_information={"codes": {"audio": torch.zeros(13, 4, dtype=torch.long)}})
    assert chunk_frames(carrying) == 13
    assert chunk_frames(SimpleNamespace(additional_information=None)) == 0


def test_the_knob_defaults_and_refuses_nonsense():
    assert step_max_frames({}) == DEFAULT_STEP_MAX_FRAMES
    assert step_max_frames({"codec_step_max_frames": 0}) == 0
    assert step_max_frames({"codec_step_max_frames": "64"}) == 64
    for bad in (-1, "many", None):
        with pytest.raises(ValueError, match="codec_step_max_frames"):
            step_max_frames({"codec_step_max_frames": bad})


def test_both_pipelines_schedule_the_codec_stage_with_it():
    for pipeline in PIPELINES.values():
        (codec,) = [stage for stage in pipeline.stages if stage.stage_id == 1]
        assert codec.scheduler_cls == CODEC_SCHEDULER


def test_the_first_chunks_out_first_knob_is_a_boolean():
    assert boolean_key({}, FIRST_CHUNKS_OUT_FIRST_KEY) is False
    assert boolean_key({FIRST_CHUNKS_OUT_FIRST_KEY: True}, FIRST_CHUNKS_OUT_FIRST_KEY) is True
    with pytest.raises(ValueError, match=FIRST_CHUNKS_OUT_FIRST_KEY):
        boolean_key({FIRST_CHUNKS_OUT_FIRST_KEY: "false"}, FIRST_CHUNKS_OUT_FIRST_KEY)


class _QueuedExecutor:
    """An executor whose steps run "on the device" behind the engine: ``execute_model`` notes the launch and hands
    back a finished future, the way an async-scheduled step's result is waited for later. (The CPU platform turns
    async scheduling off, so no real executor here queues steps.)"""

    def __init__(self, events: list[tuple[str, tuple[str, ...]]]) -> None:
        self.events = events

    def execute_model(self, scheduler_output: Any, non_block: bool = False) -> Future:
        ids = list(scheduler_output.num_scheduled_tokens)
        self.events.append(("launch", tuple(ids)))
        future: Future = Future()
        future.set_result(
            ModelRunnerOutput(
                req_ids=ids,
                req_id_to_index={r: i for i, r in enumerate(ids)},
                sampled_token_ids=[],
                pooler_output=[torch.zeros(1) for _ in ids],
            )
        )
        return future


def _batch_queue_engine(ckpt: Any, **additional: Any) -> tuple[Any, list[tuple[str, tuple[str, ...]]]]:
    """vLLM's own ``EngineCore.step_with_batch_queue`` (a queue of two steps, as under async scheduling) over a real
    ``KaniCodecScheduler``; the launches and the outputs as they happen, in ``events``."""
    from vllm.v1.engine.core import EngineCore

    from tests.test_admission_cadence import scheduler

    events: list[tuple[str, tuple[str, ...]]] = []
    sched = scheduler(ckpt, scheduler_cls=KaniCodecScheduler, **additional)
    core = EngineCore.__new__(EngineCore)
    core.scheduler, core.model_executor, core.vllm_config = sched, _QueuedExecutor(events), sched.vllm_config
    core.batch_queue_size, core.batch_queue = 2, deque(maxlen=2)
    core.is_ec_consumer, core.is_pooling_model, core.log_stats = True, True, False
    core.check_for_draft_tokens, core.aborts_queue = False, queue.Queue()
    return core, events


def _drive(core: Any, events: list, arrivals: dict[int, list[str]], calls: int) -> None:
    """Call the engine's step ``calls`` times (as its busy loop would while it has work), adding ``arrivals[call]``
    (one-frame codec requests) first; each call's outputs go into ``events`` when the call returns them."""
    from tests.test_admission_cadence import request

    for call in range(calls):
        for rid in arrivals.get(call, ()):
            core.scheduler.add_request(request(rid, 1))
        if not (core.scheduler.has_requests() or core.batch_queue):
            continue
        outputs, _ = core.step_with_batch_queue()
        done = tuple(o.request_id for batch in (outputs or {}).values() for o in batch.outputs)
        if done:
            events.append(("output", done))


def _taken(events: list[tuple[str, tuple[str, ...]]]) -> list[tuple[str, tuple[str, ...]]]:
    """The events that carry requests (the engine also launches empty steps, e.g. to return finished ids)."""
    return [event for event in events if event[1]]


def test_with_out_first_a_step_of_first_chunks_leaves_before_the_next_step_is_launched(tiny_flattened):
    arrivals = {0: ["a"], 1: ["b"], 3: ["c"]}
    core, events = _batch_queue_engine(tiny_flattened)
    _drive(core, events, arrivals, calls=8)
    # vLLM's order: the next step is launched before the one in flight is taken ("b" before "a"'s output).
    assert _taken(events)[:3] == [("launch", ("a",)), ("launch", ("b",)), ("output", ("a",))]

    core, events = _batch_queue_engine(tiny_flattened, **{FIRST_CHUNKS_OUT_FIRST_KEY: True})
    _drive(core, events, arrivals, calls=8)
    assert _taken(events) == [
        ("launch", ("a",)),
        ("output", ("a",)),
        ("launch", ("b",)),
        ("output", ("b",)),
        ("launch", ("c",)),
        ("output", ("c",)),
    ]
    assert not core.scheduler._first_steps_in_flight and not core.scheduler.requests


def test_the_urgent_chunks_knob_reaches_a_real_scheduler(tiny_flattened):
    from tests.test_admission_cadence import scheduler

    assert scheduler(tiny_flattened, scheduler_cls=KaniCodecScheduler).urgent_chunks == 1
    assert scheduler(tiny_flattened, scheduler_cls=KaniCodecScheduler, **{URGENT_CHUNKS_KEY: 2}).urgent_chunks == 2
    with pytest.raises(ValueError, match=URGENT_CHUNKS_KEY):
        scheduler(tiny_flattened, scheduler_cls=KaniCodecScheduler, **{URGENT_CHUNKS_KEY: 0})


def test_with_two_urgent_chunks_the_pipeline_speaks_as_without(tiny_parallel, tmp_path):
    """The offline CPU pipeline (a step budget, first chunks alone) with ``codec_urgent_chunks: 2``: its scheduler
    reads the key (its log line) and every utterance equals the one spoken without it, within one PCM16 step (the
    codec's steps batch the streams differently)."""
    import numpy as np

    from tests.conftest import REPO_ROOT, speak_offline
    from vllm_omni_kani.benchmarks.variants import derive

    base = REPO_ROOT / "stage_configs/kani_tts_cpu.yaml"
    changes = [
        f"stages.1.additional_config.{URGENT_CHUNKS_KEY}=2",
        f"stages.1.additional_config.{FIRST_CHUNKS_ALONE_KEY}=true",
    ]
    urgent = derive(base, tmp_path / "urgent.yaml", changes)
    texts = ["Hello there.", "A second one, a little longer.", "And a third."]
    log, spoken = speak_offline(tiny_parallel, urgent, texts, tmp_path / "urgent", max_new_tokens=40)
    assert "a stream's first 2 chunks first, and alone" in log, log[-3000:]
    _, reference = speak_offline(tiny_parallel, base, texts, tmp_path / "base", max_new_tokens=40)
    for a, b in zip(spoken, reference, strict=True):
        assert a.shape == b.shape and a.any()
        assert np.abs(a.astype(np.int32) - b).max() <= 1
