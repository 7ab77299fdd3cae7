"""Codebook 1's seeded noise (``codebook1_noise``, patched into vLLM's sampler by a Kani Stage-0 process): on CUDA a
seeded request's token depends on its seed and step alone, its generator moves on exactly one vLLM draw per step
(what vLLM's rewind of a discarded step assumes), and the draws follow the probabilities. Elsewhere vLLM's own
function samples."""

from __future__ import annotations

import pytest
import torch
from vllm.v1.sample.ops import topk_topp_sampler as ops

from vllm_omni_kani.model_executor.models.kani_tts.codebook1_noise import (
    PHILOX_OFFSET_PER_DRAW,
    applies,
    hashed_random_sample,
    with_hashed_seeded_noise,
)

VOCAB = 68442
cuda_only = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="the hashed path runs on CUDA only (CPU CI has none)"
)


def _probs(rows: int, width: int, device: str, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator(device="cpu").manual_seed(seed)
    return torch.randn(rows, width, generator=gen).mul_(3).softmax(dim=-1).to(device)


def test_on_cpu_vllms_own_draws_sample():
    """CPU generators have no offset to move on: the wrapper hands the call to vLLM's function unchanged."""
    probs = _probs(4, 50, "cpu")
    assert not applies(probs, {1: torch.Generator().manual_seed(3)}, False)
    wrapped = with_hashed_seeded_noise(ops.random_sample)
    torch.manual_seed(0)  # the unseeded rows' batch draw comes from the global generator
    ours = wrapped(probs.clone(), {1: torch.Generator().manual_seed(3), 2: torch.Generator().manual_seed(4)})
    torch.manual_seed(0)
    theirs = ops.random_sample(
        probs.clone(), {1: torch.Generator().manual_seed(3), 2: torch.Generator().manual_seed(4)}
    )
    assert torch.equal(ours, theirs)


@cuda_only
def test_a_seeded_request_draws_the_same_token_in_any_batch_and_its_generator_moves_one_draw():
    probs = _probs(6, VOCAB, "cuda")
    gens = {i: torch.Generator(device="cuda").manual_seed(100 + i) for i in (0, 2, 5)}
    assert applies(probs, gens, False)
    before = {i: g.get_offset() for i, g in gens.items()}
    first = hashed_random_sample(probs.clone(), gens)
    assert {i: g.get_offset() for i, g in gens.items()} == {i: o + PHILOX_OFFSET_PER_DRAW for i, o in before.items()}
    # Request 2 again, at the same position, alone and beside other requests in other rows.
    alone = hashed_random_sample(probs[2:3].clone(), {0: torch.Generator(device="cuda").manual_seed(102)})
    assert alone.item() == first[2].item()
    other = _probs(3, VOCAB, "cuda", seed=1)
    other[1] = probs[2]
    mixed = hashed_random_sample(other, {1: torch.Generator(device="cuda").manual_seed(102)})
    assert mixed[1].item() == first[2].item()
    # vLLM's rewind of a discarded step brings the same token back; the next step draws fresh noise.
    gen = gens[2]
    gen.set_offset(gen.get_offset() - PHILOX_OFFSET_PER_DRAW)
    assert hashed_random_sample(probs[2:3].clone(), {0: gen}).item() == first[2].item()
    later = [hashed_random_sample(probs[2:3].clone(), {0: gen}).item() for _ in range(20)]
    assert len(set(later)) > 1


@cuda_only
def test_seeded_draws_follow_the_probabilities():
    """4,000 steps of one seeded request over 8 tokens: each token's frequency within 5 standard errors."""
    p = torch.tensor([0.30, 0.20, 0.15, 0.12, 0.10, 0.07, 0.04, 0.02], device="cuda")
    gen = torch.Generator(device="cuda").manual_seed(7)
    steps = 4000
    counts = torch.zeros(8)
    for _ in range(steps):
        counts[hashed_random_sample(p.clone().view(1, -1), {0: gen}).item()] += 1
    freq, expected = counts / steps, p.cpu()
    assert torch.all((freq - expected).abs() <= 5 * (expected * (1 - expected) / steps).sqrt())
