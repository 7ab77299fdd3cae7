"""Codebook 1's noise for seeded requests on CUDA: the seeded-noise hash in one kernel, not one draw per request.

vLLM's sampler draws each seeded request's Exp(1) noise from its own ``torch.Generator``, one kernel launch per
request per step (``topk_topp_sampler.random_sample``): at 256 seeded streams that loop was 5.7% of a served
Stage-0 step's main-thread samples (docs/BENCHMARKS.md, "Eleventh set"). Here the seeded rows get
``seeded_noise``'s hash of (seed, generator position) under codebook 1's own salt, all in one kernel, and each
generator is then moved on exactly as far as vLLM's own draw would have moved it, so vLLM's rewind of a discarded
step (``set_offset(offset - 4)`` in ``GPUModelRunner._bookkeeping_sync``) and the code heads' positions stay right.

A seeded request's codebook-1 tokens are then a function of its seed and step alone, as its code heads' already
are; they are not the tokens stock vLLM would draw for that seed. Unseeded rows keep vLLM's one batch draw.
Experimental, off unless ``KANI_STAGE0_SAMPLER_PATCHES`` names it (``patch.apply_stage0_sampling``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from vllm.v1.sample.ops.topk_topp_sampler import empty_exponential_noise_like, sample_with_exponential_noise

from vllm_omni_kani import sampler_ab
from vllm_omni_kani.model_executor.models.kani_tts.seeded_noise import (
    CODEBOOK1_SALT,
    fused_kernel_available,
    noise_table,
    scatter_hashed_exponentials,
)

# How far one vLLM draw moves a CUDA generator's Philox offset (one row of noise), the step vLLM rewinds by.
PHILOX_OFFSET_PER_DRAW = 4

RandomSample = Callable[[torch.Tensor, dict[int, torch.Generator], bool], torch.Tensor]


def applies(probs: torch.Tensor, generators: dict[int, torch.Generator], use_fp64_gumbel: bool) -> bool:
    """Whether ``hashed_random_sample`` takes this call (seeded rows, float32 noise, CUDA generators)."""
    return (
        bool(generators)
        and not use_fp64_gumbel
        and probs.is_cuda
        and probs.dtype == torch.float32
        and fused_kernel_available(probs.device)
        and all(g.device.type == "cuda" for g in generators.values())
    )


def hashed_random_sample(
    probs: torch.Tensor, generators: dict[int, torch.Generator], use_fp64_gumbel: bool = False
) -> torch.Tensor:
    """vLLM's ``random_sample`` (exponential race, no host sync) with the seeded rows' noise hashed in one kernel.

    Call only where ``applies``; advances every generator by one draw."""
    noise = empty_exponential_noise_like(probs, use_fp64_gumbel)
    if len(generators) != probs.shape[0]:
        noise.exponential_()
    rows, gens = list(generators), list(generators.values())
    positions = [g.get_offset() for g in gens]
    table = noise_table(rows, gens, positions).pin_memory().to(probs.device, non_blocking=True)
    scatter_hashed_exponentials(noise, table, salt=CODEBOOK1_SALT)
    for gen, position in zip(gens, positions, strict=True):
        gen.set_offset(position + PHILOX_OFFSET_PER_DRAW)
    return sample_with_exponential_noise(probs, noise)


def with_hashed_seeded_noise(original: RandomSample) -> RandomSample:
    """``random_sample`` that hands the calls ``applies`` accepts to ``hashed_random_sample``, the rest to vLLM."""

    def random_sample(
        probs: torch.Tensor, generators: dict[int, torch.Generator], use_fp64_gumbel: bool = False
    ) -> torch.Tensor:
        if sampler_ab.patched_now() and applies(probs, generators, use_fp64_gumbel):
            return hashed_random_sample(probs, generators, use_fp64_gumbel)
        return original(probs, generators, use_fp64_gumbel)

    random_sample.__wrapped__ = original  # type: ignore[attr-defined]
    return random_sample


def warm_up_kernel(vocab_size: int, device: torch.device) -> None:
    """Compile the noise kernel for codebook 1 now, at model load, not in the first seeded step.

    Triton specialises the kernel on the row width's divisibility by 16, so the code heads' warm-up (width 3 x
    4,032) does not cover the vocabulary's width: py-spy-free evidence is the JIT monitor's "compilation during
    inference: _hashed_exponentials_kernel" in the first sampled step of a Stage-0 engine (docs/BENCHMARKS.md,
    "Eleventh set").
    """
    if device.type != "cuda" or not fused_kernel_available(device):
        return
    probs = torch.full((1, vocab_size), 1.0 / vocab_size, device=device)
    hashed_random_sample(probs, {0: torch.Generator(device=device).manual_seed(0)})
