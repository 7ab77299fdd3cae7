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
    chunk_frames,
    deferred_from,
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
