"""Sampling codebooks 2-4 with each request's own vLLM sampling parameters.

The extra heads are sampled inside the model, right after the forward pass, with the same
temperature / top-k / top-p / seed that vLLM uses for codebook 1 of that request. Rows are
the requests of the step in batch order (the rows of ``SamplingMetadata``); everything stays
on the device and needs no host synchronisation. A seeded request's noise is a hash of its seed and of where its
``torch.Generator`` stands, so its codes do not depend on which other requests share the batch.
"""

from __future__ import annotations

import functools
import zlib
from typing import Any

import torch
from vllm.v1.sample.ops.topk_topp_sampler import (
    apply_top_k_top_p,
    empty_exponential_noise_like,
    sample_with_exponential_noise,
)

# vLLM treats temperatures below this as greedy (vllm.v1.sample.sampler._SAMPLING_EPS).
GREEDY_EPS = 1e-5


def sample_codes(logits: torch.Tensor, sampling_metadata: Any | None) -> torch.Tensor:
    """Sample ``[R, K]`` codes from ``[R, K, C]`` head logits.

    ``sampling_metadata`` is vLLM's ``SamplingMetadata`` for the same R requests, or None
    (dummy and profiling runs), which means greedy.
    """
    rows, heads, size = logits.shape
    greedy = logits.argmax(dim=-1)
    if sampling_metadata is None or sampling_metadata.all_greedy:
        return greedy

    flat = logits.reshape(rows * heads, size).float()
    temp = sampling_metadata.temperature
    temp = torch.where(temp < GREEDY_EPS, torch.ones_like(temp), temp)
    flat = flat / temp.repeat_interleave(heads).unsqueeze(1)
    top_k, top_p = sampling_metadata.top_k, sampling_metadata.top_p
    flat = apply_top_k_top_p(
        flat,
        None if top_k is None else top_k.repeat_interleave(heads),
        None if top_p is None else top_p.repeat_interleave(heads),
    )
    sampled = _exponential_race(flat.softmax(dim=-1).view(rows, heads, size), sampling_metadata.generators)
    if sampling_metadata.all_random:
        return sampled
    return torch.where((sampling_metadata.temperature < GREEDY_EPS).unsqueeze(1), greedy, sampled)


def _exponential_race(probs: torch.Tensor, generators: dict[int, torch.Generator]) -> torch.Tensor:
    """``[R, K, C]`` probabilities → ``[R, K]`` samples: argmax of ``p / q`` with ``q ~ Exp(1)`` (no host sync).

    Unseeded rows share one batch draw; all seeded rows get their noise from ``seeded_exponentials`` in one batch of
    kernels, where drawing from each request's generator would cost one launch per request per step (~20 µs of host
    time each on a GPU, 9% of a served Stage-0 step at 256 seeded streams).
    """
    rows, heads, size = probs.shape
    q = empty_exponential_noise_like(probs, use_fp64_gumbel=False)
    if len(generators) != rows:
        q.exponential_()
    if generators:
        seeded = torch.tensor(list(generators), dtype=torch.long, pin_memory=probs.is_cuda)
        noise = seeded_exponentials(list(generators.values()), heads * size, probs.device).to(q.dtype)
        q.view(rows, heads * size).index_copy_(0, seeded.to(probs.device, non_blocking=True), noise)
    return sample_with_exponential_noise(probs.view(-1, size), q.view(-1, size)).view(rows, heads)


# Counter-based noise for seeded requests. Integers hold 32-bit values in int64 and every product stays inside int64
# (no overflow, so every device computes the same bits); only the low 32 bits of each product are kept.
_MASK32 = 0xFFFFFFFF
_SALT = 0x6B43A9B5  # keys this noise apart from any other hash of the same seed and position


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A bijection of 32-bit integers with full avalanche (C. Wellons' "lowbias32"), elementwise on int64, in place."""
    x ^= x >> 16
    x *= 0x7FEB352D
    x &= _MASK32
    x ^= x >> 15
    x *= 0x846CA68B - (1 << 32)  # the same low 32 bits as 0x846CA68B, and |x * it| < 2**63
    x &= _MASK32
    x ^= x >> 16
    return x


@functools.cache
def _mixed_columns(width: int, device: torch.device) -> torch.Tensor:
    """``_mix32`` of ``0..width-1``: the per-column half of every row's hash, the same every step (read, never
    written: callers combine it into new tensors)."""
    return _mix32(torch.arange(width, dtype=torch.long, device=device))


def generator_position(generator: torch.Generator) -> int:
    """Where a request's generator stands; it moves only when vLLM samples codebook 1 from it.

    vLLM draws from a seeded request's generator once per sampled step and rewinds it when it discards a step
    (CUDA: the Philox offset; CPU: ``patch.restore_discarded_generators_on_cpu`` restores the state), so the
    position names the step of that request alone. Our heads read it and never advance it.
    """
    if generator.device.type == "cuda":
        return generator.get_offset()
    return zlib.crc32(generator.get_state().numpy().tobytes())


def seeded_exponentials(generators: list[torch.Generator], width: int, device: torch.device) -> torch.Tensor:
    """``[len(generators), width]`` float32 Exp(1) noise, each row a function of its generator's seed and position.

    The same seed at the same position gives the same row on any batch and any device (integer hashing, then one
    float conversion); a new position gives fresh noise. Uniforms take the hash's top 24 bits, centred in their
    bin, so they lie strictly inside (0, 1).
    """
    words = []
    for generator in generators:
        seed, position = generator.initial_seed(), generator_position(generator)
        words.append((seed & _MASK32, (seed >> 32) & _MASK32, position & _MASK32, (position >> 32) & _MASK32))
    key = torch.tensor(words, dtype=torch.long, pin_memory=device.type == "cuda").to(device, non_blocking=True)
    row = _mix32(key[:, 3] ^ _SALT)
    for column in (2, 1, 0):
        row = _mix32(row ^ key[:, column])
    bits = _mix32(_mixed_columns(width, device).unsqueeze(0) ^ row.unsqueeze(1))
    bits ^= _mix32(row ^ _SALT).unsqueeze(1)
    bits = _mix32(bits)
    bits >>= 8
    return bits.to(torch.float32).add_(0.5).mul_(1.0 / (1 << 24)).log_().neg_()
