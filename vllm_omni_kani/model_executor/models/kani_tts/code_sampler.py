"""Sampling codebooks 2-4 with each request's own vLLM sampling parameters.

The extra heads are sampled inside the model, right after the forward pass, with the same
temperature / top-k / top-p / seed that vLLM uses for codebook 1 of that request. Rows are
the requests of the step in batch order (the rows of ``SamplingMetadata``); everything stays
on the device and needs no host synchronisation. A seeded request's noise is a hash of its seed and of where its
``torch.Generator`` stands, so its codes do not depend on which other requests share the batch.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p, sample_with_exponential_noise

from vllm_omni_kani.model_executor.models.kani_tts import code_race, warm_ups
from vllm_omni_kani.model_executor.models.kani_tts import token_layout as tl
from vllm_omni_kani.model_executor.models.kani_tts.code_race import GREEDY_EPS
from vllm_omni_kani.model_executor.models.kani_tts.seeded_noise import fused_kernel_available, write_seeded_rows
from vllm_omni_kani.model_executor.models.kani_tts.warm_ups import HASHED_NOISE_KERNEL, TOPK_TOPP_KERNEL, WarmUp

# Request counts for the warm-up whose head rows (three per request) fall in both of Triton's integer
# specialisations of the row count, not a multiple of 16 and a multiple of 16 (its top-k/top-p kernel runs from 8 rows).
WARM_UP_REQUESTS = (3, 16)
WARM_UP_TOP_P = 0.9

# vLLM's ``apply_top_k_top_p(logits, k, p)`` and the wrappers that stand in for it.
ApplyTopKTopP = Callable[[torch.Tensor, torch.Tensor | None, torch.Tensor | None], torch.Tensor]


def sample_codes(logits: torch.Tensor, sampling_metadata: Any | None) -> torch.Tensor:
    """Sample ``[R, K]`` codes from ``[R, K, C]`` head logits.

    ``sampling_metadata`` is vLLM's ``SamplingMetadata`` for the same R requests, or None
    (dummy and profiling runs), which means greedy.
    """
    rows, heads, size = logits.shape
    if sampling_metadata is None or sampling_metadata.all_greedy:
        return logits.argmax(dim=-1)

    temp = sampling_metadata.temperature
    if not sampling_metadata.all_random:  # greedy rows are tempered by 1; their sample is replaced below
        temp = torch.where(temp < GREEDY_EPS, torch.ones_like(temp), temp)
    # One kernel: the heads' logits promoted to float32 and divided by their request's temperature.
    flat = torch.div(logits, temp.float().view(rows, 1, 1)).view(rows * heads, size)
    top_k, top_p = sampling_metadata.top_k, sampling_metadata.top_p
    if top_k is not None:
        # vLLM keeps top-k per request against codebook 1's vocabulary (no filter: its whole width); a head row is
        # narrower, and vLLM's torch form indexes out of range for a k above a row's width.
        top_k = top_k.clamp(max=size)
    flat = apply_top_k_top_p(
        flat,
        None if top_k is None else top_k.repeat_interleave(heads),
        None if top_p is None else top_p.repeat_interleave(heads),
    )
    sampled = _exponential_race(flat.softmax(dim=-1).view(rows, heads, size), sampling_metadata.generators)
    if sampling_metadata.all_random:
        return sampled
    greedy_rows = (sampling_metadata.temperature < GREEDY_EPS).unsqueeze(1)
    return torch.where(greedy_rows, logits.argmax(dim=-1), sampled)


def sample_packed_codes(logits: torch.Tensor, sampling_metadata: Any | None) -> torch.Tensor:
    """``[R, K, C]`` head logits → ``[R]`` packed codes (``token_layout.pack_codes``): ``sample_codes``' draw, in one
    kernel where the ``code_race`` switch applies."""
    if not code_race.applies(logits.device, logits.shape[0]):
        return tl.pack_codes(sample_codes(logits, sampling_metadata))
    if sampling_metadata is None or sampling_metadata.all_greedy:
        return code_race.sample_packed(logits, None, None, None, None)
    rows = logits.shape[0]
    noise = race_noise(logits, sampling_metadata.generators)
    return code_race.sample_packed(
        logits, sampling_metadata.temperature, sampling_metadata.top_k, sampling_metadata.top_p, noise.view(rows, -1)
    )


def race_noise(like: torch.Tensor, generators: dict[int, torch.Generator]) -> torch.Tensor:
    """Float32 Exp(1) noise shaped as ``[R, ...]`` ``like``, for an exponential race (no host sync).

    Unseeded rows share one batch draw; all seeded rows get their noise from ``seeded_noise`` in one batch (one
    kernel on CUDA), where drawing from each request's generator would cost one launch per request per step (~20 µs
    of host time each on a GPU, 9% of a served Stage-0 step at 256 seeded streams).
    """
    rows = like.shape[0]
    q = torch.empty(like.shape, dtype=torch.float32, device=like.device)
    if len(generators) != rows:
        q.exponential_()
    if generators:
        write_seeded_rows(q.view(rows, -1), generators)
    return q


def _exponential_race(probs: torch.Tensor, generators: dict[int, torch.Generator]) -> torch.Tensor:
    """``[R, K, C]`` probabilities → ``[R, K]`` samples: argmax of ``p / q`` with ``q ~ Exp(1)`` (``race_noise``)."""
    rows, heads, size = probs.shape
    q = race_noise(probs, generators)
    return sample_with_exponential_noise(probs.view(-1, size), q.view(-1, size)).view(rows, heads)


def warm_up_kernels(heads: int, size: int, device: torch.device, dtype: torch.dtype = torch.bfloat16) -> None:
    """Compile the sampled path's Triton kernels now, at model load, not in the first sampled step (``kernel_warm_ups``,
    run by ``warm_ups.run``)."""
    warm_ups.run(kernel_warm_ups(heads, size, device, dtype), device)


def kernel_warm_ups(heads: int, size: int, device: torch.device, dtype: torch.dtype = torch.bfloat16) -> list[WarmUp]:
    """The calls that compile the sampled path's Triton kernels at model load, not in the first sampled step.

    A compile in a step stalls every stream for seconds on a fresh machine (py-spy of the first sampled steps at
    batch 256, docs/BENCHMARKS.md "Tenth set"); Triton then keeps the kernels on disk. vLLM's own sampler warm-up
    covers its vocabulary only, and with top-k and top-p both on. Covered here: vLLM's top-k/top-p kernel at the
    heads' width for each filter set and both row-count specialisations, the seeded-noise kernel, and where its
    switch is taken the one-kernel sampler (``code_race``) for heads' logits of ``dtype``.
    """
    if device.type != "cuda":
        return []
    calls = code_race.warm_ups(heads, size, dtype, device)
    for requests in WARM_UP_REQUESTS:
        calls += filter_set_warm_ups(apply_top_k_top_p, requests * heads, size, size - 1, device)
    if fused_kernel_available(device):
        # float32 named: the model loads under vLLM's default dtype, and the kernel takes float32 noise only
        rows = torch.empty(1, heads * size, dtype=torch.float32, device=device)
        generators = {0: torch.Generator(device=device).manual_seed(0)}
        calls.append(WarmUp(HASHED_NOISE_KERNEL, functools.partial(write_seeded_rows, rows, generators)))
    return calls


def filter_set_warm_ups(
    apply: ApplyTopKTopP,
    rows: int,
    width: int,
    top_k: int,
    device: torch.device,
) -> list[WarmUp]:
    """The calls of the top-k/top-p function ``apply`` on ``[rows, width]`` zero logits with top-k alone, top-p alone
    and both: each filter set is its own specialisation of vLLM's Triton kernel. The dtypes are a served step's (vLLM
    samples float32 logits), named because a model loads under vLLM's default dtype, the model's."""
    k = torch.full((rows,), top_k, dtype=torch.int32, device=device)
    p = torch.full((rows,), WARM_UP_TOP_P, dtype=torch.float32, device=device)

    def zeros() -> torch.Tensor:  # a call's own logits: vLLM's function may filter them in place
        return torch.zeros(rows, width, dtype=torch.float32, device=device)

    return [
        WarmUp(TOPK_TOPP_KERNEL, functools.partial(apply, zeros(), top_k_rows, top_p_rows))
        for top_k_rows, top_p_rows in ((None, p), (k, None), (k, p))
    ]
