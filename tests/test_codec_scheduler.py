"""Stage 1's frame-bounded steps (``core/sched/codec_scheduler.py``): which chunks wait, and the knob.

The scheduler itself runs in every served test: ``kani_tts_cpu.yaml`` bounds a codec step to 32 frames, so the
serving tests' concurrent streams (``test_serving.py``, ``test_reliability.py``, ``test_shm_cleanup.py``) decode
with chunks held back, and their audio is checked against solo runs and against each request's frames there;
``test_serving.py`` also reads the scheduler's summary line from the server's log.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from vllm_omni_kani.core.sched.codec_scheduler import (
    DEFAULT_STEP_MAX_FRAMES,
    FIRST_CHUNKS_ALONE_KEY,
    chunk_frames,
    deferred_from,
    first_chunks_alone,
    step_cut,
    step_max_frames,
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
