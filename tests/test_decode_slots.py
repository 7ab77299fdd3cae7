"""The decode check in front of vLLM's slot allocation (``core/sched/decode_slots.py``): on a real KV-cache manager of
LFM2's shape (16-token attention blocks beside a one-block conv state), a run of prompts, decode steps, departures
and a full pool ends every call exactly as vLLM's own path does; and a served pipeline speaks the same with it off."""

from __future__ import annotations

import random
import re

import numpy as np
import pytest
import torch
from vllm.sampling_params import SamplingParams
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    MambaSpec,
    SlidingWindowSpec,
)
from vllm.v1.request import Request, RequestStatus

from tests.conftest import REPO_ROOT, speak_offline
from vllm_omni_kani.core.sched import decode_slots
from vllm_omni_kani.envs import KANI_FAST_DECODE_SLOTS, fast_decode_slots
from vllm_omni_kani.model_executor.models.kani_tts.configuration import SAMPLES_PER_FRAME

MAX_LEN = 256
BLOCK = 16


def lfm2_like_manager(num_blocks: int = 40, attention: object = None, caching: bool = False) -> KVCacheManager:
    """A real manager with one attention group of 16-token blocks and one Mamba-family group (the conv state: one
    block covers the whole sequence, as vLLM sizes it without prefix caching)."""
    attention = attention or FullAttentionSpec(block_size=BLOCK, num_kv_heads=2, head_size=8, dtype=torch.bfloat16)
    conv = MambaSpec(block_size=MAX_LEN, shapes=((2, 8),), dtypes=(torch.bfloat16,))
    config = KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["attn.0"], attention), KVCacheGroupSpec(["conv.0"], conv)],
    )
    return KVCacheManager(
        config, max_model_len=MAX_LEN, scheduler_block_size=MAX_LEN, hash_block_size=BLOCK, enable_caching=caching
    )


def state(manager: KVCacheManager) -> tuple:
    """Everything an allocation can change: free blocks and each request's block ids per group."""
    groups = manager.coordinator.single_type_managers
    per_request = tuple(
        sorted((rid, tuple(b.block_id for b in blocks)) for rid, blocks in group.req_to_blocks.items() if blocks)
        for group in groups
    )
    return manager.block_pool.get_num_free_blocks(), per_request


def returned(blocks: object) -> object:
    return None if blocks is None else blocks.get_block_ids(allow_none=True)


def test_every_call_ends_as_vllms_own_path_ends_it():
    """Two managers, one with the check, take the same calls the scheduler makes (prompts, then one token per step
    for each running request, requests leaving and new ones arriving, a pool too small for all): the same return
    value and the same blocks after every call, and most decode calls answered by the check."""
    stock, fast = lfm2_like_manager(), lfm2_like_manager()
    calls = {"all": 0, "vllm": 0}
    vllm_path = fast.allocate_slots

    def counted(*args, **kwargs):
        calls["vllm"] += 1
        return vllm_path(*args, **kwargs)

    fast.allocate_slots = counted  # the check passes what it does not answer to this, i.e. to vLLM's path
    assert decode_slots.install(fast)
    rng = random.Random(7)
    live: dict[str, tuple[Request, Request]] = {}
    next_id = 0
    refused = 0
    for step in range(400):
        if len(live) < 6 and rng.random() < 0.3:
            prompt = list(range(rng.randrange(3, 40)))
            pair = tuple(Request(f"r{next_id}", prompt, SamplingParams(max_tokens=MAX_LEN), None) for _ in range(2))
            a, b = (
                m.allocate_slots(r, len(prompt), has_scheduled_reqs=bool(live))
                for m, r in zip((stock, fast), pair, strict=True)
            )
            calls["all"] += 1
            assert returned(a) == returned(b) and state(stock) == state(fast)
            if a is not None:
                for r in pair:
                    r.status = RequestStatus.RUNNING
                    r.num_computed_tokens = len(prompt)
                live[f"r{next_id}"] = pair
            next_id += 1
        for rid, pair in list(live.items()):
            done = pair[0].num_computed_tokens >= MAX_LEN - 1 or rng.random() < 0.01
            if not done:
                a, b = (m.allocate_slots(r, 1) for m, r in zip((stock, fast), pair, strict=True))
                calls["all"] += 1
                assert returned(a) == returned(b), (step, rid)
                assert state(stock) == state(fast), (step, rid)
                if a is None:
                    refused += 1  # the pool is full: the scheduler would preempt; here the request leaves
                    done = True
                else:
                    for r in pair:
                        r.append_output_token_ids(5)
                        r.num_computed_tokens += 1
            if done:
                stock.free(pair[0])
                fast.free(pair[1])
                del live[rid]
                assert state(stock) == state(fast)
    answered = calls["all"] - calls["vllm"]
    assert answered > 10 * calls["vllm"] > 0, calls
    assert refused > 0  # the run did reach a full pool


def test_the_check_stays_out_where_it_does_not_know_the_path():
    """Prefix caching (the full path then caches blocks) or a group kind it does not model (a sliding window frees
    blocks as it moves): vLLM's path, untouched."""
    assert not decode_slots.install(lfm2_like_manager(caching=True))
    window = SlidingWindowSpec(block_size=BLOCK, num_kv_heads=2, head_size=8, dtype=torch.bfloat16, sliding_window=32)
    manager = lfm2_like_manager(attention=window)
    original = manager.allocate_slots
    assert not decode_slots.install(manager)
    assert manager.allocate_slots == original


@pytest.mark.parametrize("value", ["", "1", "on", "0", "off", "false", "No"])
def test_the_check_is_on_unless_switched_off_as_every_default_on_switch_reads(monkeypatch, value):
    monkeypatch.setenv(KANI_FAST_DECODE_SLOTS, value)
    assert fast_decode_slots() is (value.lower() not in ("0", "off", "false", "no"))


def test_a_served_pipeline_speaks_the_same_without_the_check(tiny_parallel, tmp_path):
    """The offline pipeline, greedy, with ``KANI_FAST_DECODE_SLOTS=0`` and without: the same audio (within one PCM16
    step), and each run's Stage-0 scheduler says which path its decode steps took."""
    texts = ["Hello there.", "A second one, a little longer."]
    audio = {}
    yaml = REPO_ROOT / "stage_configs/kani_tts_cpu.yaml"
    for name, env_value in (("vllm", "0"), ("check", "1")):
        env = {KANI_FAST_DECODE_SLOTS: env_value}
        log, audio[name] = speak_offline(tiny_parallel, yaml, texts, tmp_path / name, max_new_tokens=40, env=env)
        said = "take" if name == "vllm" else "skip"
        assert re.search(rf"Kani Stage-0 scheduler: decode steps {said} vLLM's slot allocation", log), log[-3000:]
    for stock, checked in zip(audio["vllm"], audio["check"], strict=True):
        assert stock.shape == checked.shape and stock.shape[0] > 8 * SAMPLES_PER_FRAME
        assert np.abs(stock.astype(np.int32) - checked).max() <= 1
