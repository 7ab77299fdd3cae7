"""The penalties' output-token counts kept on the device (``penalty_counts``, patched into vLLM's sampler by a Kani
Stage-0 process) equal vLLM's bin counts step after step, whatever the requests do between steps, and the penalised
logits are vLLM's. The engine-level check (same tokens with and without the patch) is in ``test_stage0.py``."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from vllm.model_executor.layers.utils import get_token_bin_counts_and_mask
from vllm.utils.torch_utils import make_tensor_with_pad
from vllm.v1.sample.logits_processor import LogitsProcessors
from vllm.v1.sample.metadata import SamplingMetadata
from vllm.v1.sample.sampler import Sampler

from vllm_omni_kani.model_executor.models.kani_tts.penalty_counts import (
    PLACEHOLDER,
    OutputTokenCounts,
    with_counted_penalties,
)
from vllm_omni_kani.model_executor.models.kani_tts.pinned_staging import PinnedStaging

VOCAB = 1000  # small, so that repeated tokens are common

DEVICES = [
    "cpu",
    pytest.param(
        "cuda",
        marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="the pinned-copy path needs a CUDA device"),
    ),
]


def vllm_counts(lists: list[list[int]], device: str) -> torch.Tensor:
    """vLLM's bin counts of the same lists (placeholders padded out, as ``apply_all_penalties`` does)."""
    tokens = make_tensor_with_pad(
        [[t if t != PLACEHOLDER else VOCAB for t in x] for x in lists], pad=VOCAB, device=device, dtype=torch.int64
    )
    counts, _ = get_token_bin_counts_and_mask(tokens, VOCAB, len(lists))
    return counts


@pytest.mark.parametrize("device", DEVICES)
def test_the_counts_equal_vllms_through_appends_finishes_arrivals_reorders_placeholders_and_trims(device):
    rng = random.Random(0)
    store = OutputTokenCounts(VOCAB, device, rows=8)
    live = [[rng.randrange(VOCAB) for _ in range(rng.randrange(0, 3))] for _ in range(40)]
    for step in range(300):
        for tokens in live:
            tokens.append(rng.randrange(VOCAB))
        event = rng.random()
        if event < 0.05 and live:  # a request finishes
            live.pop(rng.randrange(len(live)))
        elif event < 0.15:  # requests arrive (past the store's first capacity, over the steps)
            live.extend([rng.randrange(VOCAB)] for _ in range(rng.randrange(1, 30)))
        elif event < 0.25:  # the batch is reordered
            rng.shuffle(live)
        elif event < 0.35 and live:  # async scheduling: placeholders at the end, their tokens written a step later
            tokens = rng.choice(live)
            tokens.extend([PLACEHOLDER] * rng.randrange(1, 3))
            counts, exact = store.gather(live)
            assert exact and torch.equal(counts.long(), vllm_counts(live, device)), step
            tokens[tokens.index(PLACEHOLDER) :] = [rng.randrange(VOCAB) for _ in tokens[tokens.index(PLACEHOLDER) :]]
        elif event < 0.40 and live:  # a trim: the last tokens dropped and others written, as long or longer
            tokens = rng.choice(live)
            cut = rng.randrange(1, 6)
            del tokens[max(len(tokens) - cut, 0) :]
            tokens.extend(rng.randrange(VOCAB) for _ in range(cut + rng.randrange(0, 2)))
        elif event < 0.45 and live:  # a list replaced by a new one with the same tokens
            i = rng.randrange(len(live))
            live[i] = list(live[i])
        counts, exact = store.gather(live)
        assert exact and counts.dtype == torch.int32, step
        assert torch.equal(counts.long(), vllm_counts(live, device)), step
    assert len(live) > 64 and max(map(len, live)) > 200  # the store grew past its first rows


def test_rows_are_freed_when_their_requests_leave():
    """10,000 requests through a batch of at most 32: the store holds at most the batch, and its rows stay few."""
    store = OutputTokenCounts(VOCAB, "cpu", rows=8)
    rng = random.Random(1)
    live: list[list[int]] = []
    for _ in range(10_000):
        live.append([rng.randrange(VOCAB)])
        if len(live) > 32:
            live.pop(rng.randrange(len(live)))
        store.gather(live)
        assert store.rows_held == len(live)
    store.gather([])
    assert store.rows_held == 0


def test_a_real_token_after_a_placeholder_is_reported_not_counted():
    store = OutputTokenCounts(VOCAB, "cpu")
    lists = [[5, PLACEHOLDER, 7], [5, 5]]
    counts, exact = store.gather(lists)
    assert not exact
    assert counts[0, 5] == 1 and counts[0, 7] == 0 and counts[1, 5] == 2


def metadata(rows: int, rng: torch.Generator, lists: list[list[int]]) -> SamplingMetadata:
    prompts = [
        torch.randint(0, VOCAB, (int(torch.randint(1, 20, (1,), generator=rng)),), generator=rng) for _ in range(rows)
    ]
    return SamplingMetadata(
        temperature=None,
        all_greedy=True,
        all_random=False,
        top_p=None,
        top_k=None,
        generators={},
        max_num_logprobs=None,
        no_penalties=False,
        prompt_token_ids=make_tensor_with_pad(
            [p.tolist() for p in prompts], pad=VOCAB, device="cpu", dtype=torch.int64
        ),
        frequency_penalties=torch.rand(rows, generator=rng) * 0.5,
        presence_penalties=torch.rand(rows, generator=rng) * 0.5,
        repetition_penalties=1.0 + torch.rand(rows, generator=rng),
        output_token_ids=lists,
        allowed_token_ids_mask=None,
        bad_words_token_ids={},
        logitsprocs=LogitsProcessors(),
    )


def test_the_sampler_stand_in_gives_vllms_penalised_logits_step_after_step():
    rng = torch.Generator().manual_seed(2)
    pyrng = random.Random(2)
    stand_in = with_counted_penalties(Sampler.apply_penalties)
    lists = [[pyrng.randrange(VOCAB) for _ in range(pyrng.randrange(0, 40))] for _ in range(12)]
    for step in range(20):
        for tokens in lists:
            tokens.append(pyrng.randrange(VOCAB))
        md = metadata(len(lists), rng, lists)
        logits = torch.randn(len(lists), VOCAB, generator=rng)
        want = Sampler.apply_penalties(logits.clone(), md, lists)
        got = stand_in(logits.clone(), md, lists)
        # The same operations on the same inputs and shapes.
        torch.testing.assert_close(got, want, rtol=0, atol=0, msg=f"step {step}")
        assert not torch.equal(got, logits)  # the penalties did something


def test_no_penalties_goes_to_vllms_path_untouched():
    rng = torch.Generator().manual_seed(3)
    md = metadata(2, rng, [[1], [2]])
    md.no_penalties = True
    logits = torch.randn(2, VOCAB, generator=rng)
    assert torch.equal(with_counted_penalties(Sampler.apply_penalties)(logits.clone(), md, [[1], [2]]), logits)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="pinned staging copies to a CUDA device (CPU CI has none)")
def test_the_pinned_ring_delivers_every_steps_array_to_the_device():
    rng = random.Random(4)
    staging = PinnedStaging(slots=2)
    sent = []
    for step in range(12):  # more steps than slots, growing: buffers are reused and regrown
        array = np.array([[rng.randrange(VOCAB) for _ in range(step + 1)] for _ in range(3 + step)], dtype=np.int64)
        sent.append((array, staging.to_device(array, torch.device("cuda"))))
    for array, tensor in sent:
        assert torch.equal(tensor.cpu(), torch.from_numpy(array))
