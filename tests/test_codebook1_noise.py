"""Codebook 1's seeded noise (``codebook1_noise``, patched into vLLM's sampler by a Kani Stage-0 process when named):
a seeded request's token depends on its seed and step alone, its generator moves on one vLLM draw per step (what
vLLM's rewind of a discarded step assumes), and the draws follow the probabilities; other calls go to vLLM."""

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
from vllm_omni_kani.model_executor.models.kani_tts.seeded_noise import generator_position

VOCAB = 68442
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA"))]


def _probs(rows: int, width: int, device: str, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator(device="cpu").manual_seed(seed)
    return torch.randn(rows, width, generator=gen).mul_(3).softmax(dim=-1).to(device)


def _gen(device: str, seed: int) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


@pytest.mark.parametrize("device", DEVICES)
def test_a_seeded_request_draws_the_same_token_in_any_batch_and_its_generator_moves_one_draw(device):
    probs = _probs(6, VOCAB, device)
    gens = {i: _gen(device, 100 + i) for i in (0, 2, 5)}
    assert applies(probs, gens, False)
    first = hashed_random_sample(probs.clone(), gens)
    # Request 2 again at the same position: alone, and in another row beside other requests.
    alone = hashed_random_sample(probs[2:3].clone(), {0: _gen(device, 102)})
    assert alone.item() == first[2].item()
    other = _probs(3, VOCAB, device, seed=1)
    other[1] = probs[2]
    assert hashed_random_sample(other, {1: _gen(device, 102)})[1].item() == first[2].item()
    # Each generator stands where one vLLM draw leaves it.
    for seed in (100, 102, 105):
        drawn = _gen(device, seed)
        torch.empty(VOCAB if device == "cuda" else 1, device=device).exponential_(generator=drawn)
        if device == "cuda":
            assert gens[seed - 100].get_offset() == drawn.get_offset() == PHILOX_OFFSET_PER_DRAW
        else:
            assert torch.equal(gens[seed - 100].get_state(), drawn.get_state())
    # The next step draws fresh noise; a rewind to the step's start brings its token back.
    gen = _gen(device, 102)
    start = gen.get_state() if device == "cpu" else None
    steps = [hashed_random_sample(probs[2:3].clone(), {0: gen}).item() for _ in range(20)]
    assert steps[0] == first[2].item() and len(set(steps)) > 1
    if device == "cpu":
        gen.set_state(start)
    else:
        gen.set_offset(0)
    assert hashed_random_sample(probs[2:3].clone(), {0: gen}).item() == steps[0]


@pytest.mark.parametrize("device", DEVICES)
def test_seeded_draws_follow_the_probabilities(device):
    """4,000 steps of one seeded request over 8 tokens: each token's frequency within 5 standard errors."""
    p = torch.tensor([0.30, 0.20, 0.15, 0.12, 0.10, 0.07, 0.04, 0.02], device=device)
    gen = _gen(device, 7)
    steps = 4000
    counts = torch.zeros(8)
    positions = set()
    for _ in range(steps):
        positions.add(generator_position(gen))
        counts[hashed_random_sample(p.clone().view(1, -1), {0: gen}).item()] += 1
    assert len(positions) == steps  # a new position, so new noise, every step
    freq, expected = counts / steps, p.cpu()
    assert torch.all((freq - expected).abs() <= 5 * (expected * (1 - expected) / steps).sqrt())


def test_unseeded_and_float64_calls_go_to_vllms_function():
    probs = _probs(4, 50, "cpu")
    wrapped = with_hashed_seeded_noise(ops.random_sample)
    assert not applies(probs, {}, False) and not applies(probs, {1: _gen("cpu", 3)}, True)
    for generators, fp64 in (({}, False), ({1: _gen("cpu", 3)}, True)):
        torch.manual_seed(0)  # the unseeded rows' batch draw comes from the global generator
        ours = wrapped(probs.clone(), dict(generators), fp64)
        torch.manual_seed(0)
        theirs = ops.random_sample(probs.clone(), {k: _gen("cpu", 3) for k in generators}, fp64)
        assert torch.equal(ours, theirs)

    # A seeded call takes the hashed path: the seeded row's token is hashed_random_sample's, not vLLM's draw.
    def row1(sample, seed: int) -> int:
        return int(sample(probs.clone(), {1: _gen("cpu", seed)})[1])

    seeds = range(20)
    assert [row1(wrapped, s) for s in seeds] == [row1(hashed_random_sample, s) for s in seeds]
    assert [row1(wrapped, s) for s in seeds] != [row1(ops.random_sample, s) for s in seeds]
