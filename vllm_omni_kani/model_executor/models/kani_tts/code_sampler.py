"""Sampling codebooks 2-4 with each request's own vLLM sampling parameters.

The extra heads are sampled inside the model, right after the forward pass, with the same
temperature / top-k / top-p / seed that vLLM uses for codebook 1 of that request. Rows are
the requests of the step in batch order (the rows of ``SamplingMetadata``); everything stays
on the device and needs no host synchronisation. A seeded request draws from its own
``torch.Generator``, so its codes do not depend on which other requests share the batch.
"""

from __future__ import annotations

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

    vLLM's ``random_sample`` with the K heads flattened into rows would draw a seeded request's noise in K generator
    calls (one kernel launch each, ~20 µs of host time per call on a GPU); here one call fills all K rows of that
    request from its generator, so a step with every request seeded costs R calls rather than R·K.
    """
    q = empty_exponential_noise_like(probs, use_fp64_gumbel=False)
    if len(generators) != probs.shape[0]:
        q.exponential_()
    for row, generator in generators.items():
        q[row].exponential_(generator=generator)
    return sample_with_exponential_noise(probs.view(-1, probs.shape[-1]), q.view(-1, probs.shape[-1])).view(
        probs.shape[:2]
    )
