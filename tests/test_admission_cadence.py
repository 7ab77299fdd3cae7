"""Stage 0's admission cadence (``core/sched/admission_cadence.py``) on the real scheduler: under load new prompts wait
for every ``k``-th step, never longer; a light load and the default admit every step, as vLLM-Omni's scheduler does."""

from __future__ import annotations

import itertools
import random
from types import SimpleNamespace

import pytest
import torch
from vllm.sampling_params import SamplingParams
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request

from vllm_omni_kani.core.sched.admission_cadence import (
    ADMIT_EVERY_STEPS_KEY,
    ADMIT_MIN_RUNNING_KEY,
    ADMIT_ROWS_PER_STEP_KEY,
    DEFAULT_ADMIT_EVERY_STEPS,
    DEFAULT_ADMIT_MIN_RUNNING,
    DEFAULT_ADMIT_ROWS_PER_STEP,
    AdmissionGate,
    admission_cadence,
)

PROMPT = 6
MAX_SEQS = 32


def scheduler(ckpt, scheduler_cls=None, **additional):
    """A real Stage-0 scheduler (``KaniStage0Scheduler`` unless another class is named) over a real KV-cache manager
    of one attention group, for the tiny flattened checkpoint (a stock LFM2 model: no plugin model class needed)."""
    from vllm.config import CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    from vllm_omni_kani.core.sched.stage0_scheduler import KaniStage0Scheduler

    model = ModelConfig(model=str(ckpt), dtype="float32", max_model_len=256, enforce_eager=True)
    cache = CacheConfig(block_size=16, enable_prefix_caching=False)
    cache.num_gpu_blocks = 1024
    config = VllmConfig(
        model_config=model,
        scheduler_config=SchedulerConfig(
            max_num_seqs=MAX_SEQS, max_num_batched_tokens=1024, max_model_len=256, is_encoder_decoder=False
        ),
        cache_config=cache,
        device_config=DeviceConfig("cpu"),
        additional_config=additional,
    )
    spec = FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=8, dtype=torch.float32)
    kv = KVCacheConfig(num_blocks=1024, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["attn"], spec)])
    cls = scheduler_cls or KaniStage0Scheduler
    return cls(
        vllm_config=config, kv_cache_config=kv, structured_output_manager=StructuredOutputManager(config), block_size=16
    )


def request(rid: str, max_tokens: int) -> Request:
    return Request(rid, list(range(10, 10 + PROMPT)), SamplingParams(max_tokens=max_tokens, ignore_eos=True), None)


def run(sched, arrivals: dict[int, list[tuple[str, int]]], steps: int) -> dict[str, int]:
    """Drive ``sched`` for ``steps`` steps (every scheduled request samples one token), adding ``arrivals[step]``
    (request id, output tokens) before each step's schedule; the step at which each request was first scheduled."""
    first: dict[str, int] = {}
    for step in range(steps):
        for rid, tokens in arrivals.get(step, ()):
            sched.add_request(request(rid, tokens))
        out = sched.schedule()
        for new in out.scheduled_new_reqs:
            first[new.req_id] = step
        ids = list(out.num_scheduled_tokens)
        sched.update_from_output(
            out,
            ModelRunnerOutput(
                req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)}, sampled_token_ids=[[7] for _ in ids]
            ),
        )
    return first


def test_the_gate_holds_at_most_every_minus_one_steps_in_a_row_and_only_under_load():
    gate = AdmissionGate(every=3, min_running=4)
    assert [gate.defer(running=8, waiting=1) for _ in range(7)] == [True, True, False] * 2 + [True]
    assert not gate.defer(running=3, waiting=5)  # a light load admits at once, and starts the count again
    assert [gate.defer(running=4, waiting=2) for _ in range(3)] == [True, True, False]
    assert not gate.defer(running=40, waiting=0)  # nothing waits: nothing to hold
    assert gate.deferred_steps == 7
    assert not any(AdmissionGate(every=1, min_running=0).defer(running=100, waiting=9) for _ in range(10))


def test_with_rows_per_step_the_cadence_follows_the_running_count_up_to_every():
    gate = AdmissionGate(every=8, min_running=16, rows_per_step=10)

    def admitted_every(running: int) -> int:
        """Steps from one admission to the next with ``running`` requests and a prompt always waiting."""
        gate.held = 0
        decisions = [gate.defer(running=running, waiting=1) for _ in range(40)]
        return decisions.index(False) + 1

    assert [admitted_every(n) for n in (15, 16, 25, 30, 64, 79, 80, 128, 256)] == [1, 1, 2, 3, 6, 7, 8, 8, 8]
    # a streak started under a heavy load ends as soon as the load falls to the current cadence
    gate.held = 0
    assert [gate.defer(running=n, waiting=1) for n in (128, 128, 128, 30, 128)] == [True, True, True, False, True]


def test_under_load_new_prompts_are_admitted_together_every_kth_step(tiny_flattened):
    sched = scheduler(tiny_flattened, **{ADMIT_EVERY_STEPS_KEY: 4, ADMIT_MIN_RUNNING_KEY: 2})
    arrivals = {0: [("a", 200), ("b", 200)], 2: [("c", 200)], 3: [("d", 200)], 9: [("e", 200)], 10: [("f", 200)]}
    first = run(sched, arrivals, steps=16)
    # a, b start an empty engine at once; c waits 3 steps (2, 3, 4) and d goes with it; e waits 3 and f with it.
    assert first == {"a": 0, "b": 0, "c": 5, "d": 5, "e": 12, "f": 12}
    assert sched.admission_gate.deferred_steps == 3 + 3


@pytest.mark.parametrize(("rows_per_step", "admitted_at"), [(2, 4), (1, 7), (0, 9)])
def test_with_rows_per_step_the_served_scheduler_holds_prompts_for_running_over_r_steps(
    tiny_flattened, rows_per_step, admitted_at
):
    """Six running requests: R = 2 admits every 3 steps, R = 1 every 6, no R every 8 (``kani_admit_every_steps``)."""
    keys = {ADMIT_EVERY_STEPS_KEY: 8, ADMIT_MIN_RUNNING_KEY: 1, ADMIT_ROWS_PER_STEP_KEY: rows_per_step}
    sched = scheduler(tiny_flattened, **keys)
    arrivals = {0: [(f"s{i}", 300) for i in range(6)], 2: [("c", 300)]}
    first = run(sched, arrivals, steps=12)
    assert first == {**{f"s{i}": 0 for i in range(6)}, "c": admitted_at}


def test_a_light_load_and_the_default_admit_every_step_as_vllm_omni_does(tiny_flattened):
    from vllm_omni.core.sched.omni_ar_scheduler import OmniARScheduler

    rng = random.Random(3)
    arrivals: dict[int, list[tuple[str, int]]] = {}
    for i in range(60):
        arrivals.setdefault(rng.randrange(0, 150), []).append((f"r{i}", rng.randrange(1, 40)))
    want = run(scheduler(tiny_flattened, scheduler_cls=OmniARScheduler), arrivals, steps=200)
    assert len(want) == 60
    assert run(scheduler(tiny_flattened), arrivals, steps=200) == want  # the default: every step
    light = scheduler(tiny_flattened, **{ADMIT_EVERY_STEPS_KEY: 8, ADMIT_MIN_RUNNING_KEY: MAX_SEQS})
    assert run(light, arrivals, steps=200) == want  # never MAX_SEQS running: never held
    assert light.admission_gate.deferred_steps == 0


def test_random_arrivals_under_load_wait_fewer_than_k_steps_and_all_run(tiny_flattened):
    every = 5
    sched = scheduler(tiny_flattened, **{ADMIT_EVERY_STEPS_KEY: every, ADMIT_MIN_RUNNING_KEY: 1})
    rng = random.Random(11)
    arrivals: dict[int, list[tuple[str, int]]] = {0: [("seed", 400)]}  # one long request keeps the load on
    arrived: dict[str, int] = {}
    for i in range(80):
        step = rng.randrange(1, 250)
        arrivals.setdefault(step, []).append((f"r{i}", rng.randrange(1, 30)))
        arrived[f"r{i}"] = step
    first = run(sched, arrivals, steps=320)
    assert set(first) == set(arrived) | {"seed"}
    waits = [first[rid] - step for rid, step in arrived.items()]
    assert max(waits) <= every - 1 and max(waits) > 0, waits
    admitting = sorted(set(first.values()) - {0})
    assert all(b - a >= every for a, b in itertools.pairwise(admitting)), admitting
    assert not sched.requests or set(sched.requests) == {"seed"}  # every short request ran to its end


def test_the_keys_are_integers_in_range():
    def config(**additional):
        return SimpleNamespace(additional_config=additional)

    defaults = (DEFAULT_ADMIT_EVERY_STEPS, DEFAULT_ADMIT_MIN_RUNNING, DEFAULT_ADMIT_ROWS_PER_STEP)
    assert admission_cadence(config()) == defaults == (1, 64, 0)
    assert admission_cadence(config(**{ADMIT_EVERY_STEPS_KEY: 4, ADMIT_MIN_RUNNING_KEY: 0})) == (4, 0, 0)
    assert admission_cadence(config(**{ADMIT_ROWS_PER_STEP_KEY: 12})) == (1, 64, 12)
    bad_values = (
        (ADMIT_EVERY_STEPS_KEY, 0),
        (ADMIT_EVERY_STEPS_KEY, "4"),
        (ADMIT_MIN_RUNNING_KEY, -1),
        (ADMIT_ROWS_PER_STEP_KEY, -2),
        (ADMIT_ROWS_PER_STEP_KEY, 1.5),
    )
    for key, bad in bad_values:
        with pytest.raises(ValueError, match=key):
            admission_cadence(config(**{key: bad}))
    with pytest.raises(ValueError, match=ADMIT_MIN_RUNNING_KEY):
        admission_cadence(config(**{ADMIT_MIN_RUNNING_KEY: True}))


def test_the_deploy_files_keys_reach_the_served_scheduler(tiny_parallel, tmp_path):
    """The offline pipeline with the keys in Stage 0's additional_config: its scheduler reads them (its log line) and
    every utterance is spoken."""
    from tests.conftest import REPO_ROOT, speak_offline
    from vllm_omni_kani.benchmarks.variants import derive
    from vllm_omni_kani.model_executor.models.kani_tts.configuration import SAMPLES_PER_FRAME

    changes = [
        f"stages.0.additional_config.{ADMIT_EVERY_STEPS_KEY}=3",
        f"stages.0.additional_config.{ADMIT_MIN_RUNNING_KEY}=1",
    ]
    yaml = derive(REPO_ROOT / "stage_configs/kani_tts_cpu.yaml", tmp_path / "admit.yaml", changes)
    texts = ["Hello there.", "A second one, a little longer."]
    log, audio = speak_offline(tiny_parallel, yaml, texts, tmp_path / "out", max_new_tokens=20)
    assert "new prompts admitted every 3 steps while 1 or more requests run" in log, log[-3000:]
    assert all(a.shape[0] > 8 * SAMPLES_PER_FRAME and a.any() for a in audio), [a.shape for a in audio]


def test_the_step_meter_counts_the_held_steps_only_with_the_cadence_on(tiny_flattened, monkeypatch):
    monkeypatch.setenv("KANI_STEP_STATS_S", "5")
    sched = scheduler(tiny_flattened, **{ADMIT_EVERY_STEPS_KEY: 4, ADMIT_MIN_RUNNING_KEY: 1})
    run(sched, {0: [("a", 50)], 1: [("b", 5)], 2: [("c", 5)]}, steps=8)
    assert sched.admission_gate.deferred_steps == 3
    assert sched.step_kind_meter.held_steps() == 3
    assert scheduler(tiny_flattened).step_kind_meter.held_steps is None
