"""Codebooks 2-4 of a step sampled and packed in one Triton kernel: temperature, top-k, top-p and the exponential
race of each head row, then the three codes packed the way ``token_layout.pack_codes`` packs them.

The torch form (``code_sampler.sample_codes`` then ``pack_codes``) launches ~25 kernels a sampled step, more below 8
head rows where vLLM's top-k/top-p falls back to a sort in torch ops; at one stream the step is host-bound and
``make_omni_output`` took ~1.0 ms of a ~4.3 ms step, the parallel heads' whole cost over the flattened checkpoint's step
(py-spy of the sampled step held at batch 1, docs/BENCHMARKS.md "Thirty-seventh set"). A head row is 4,032 codes, so
one program holds a request's rows whole: it sorts each row once, takes top-k's k-th value and top-p's nucleus floor
from the sorted values, and races what is left against the same Exp(1) noise the torch form draws (unseeded rows'
batch draw, seeded rows' hash), so the codes match it except where a float rounding moves a code across a filter's
edge.

Filters as vLLM's torch form applies them: top-k keeps every code at least as large as the k-th largest tempered logit;
top-p then keeps the largest codes until the probability of those before a code reaches ``p`` (the top code always);
a request whose temperature is below ``GREEDY_EPS`` takes each head's argmax.

Stage-0 switch ``code_race_kernel`` (``KANI_STAGE0_SAMPLER_PATCHES``, on by default), taken for steps of at most
``MAX_ROWS`` sampled requests: one program a request does the work that vLLM's batched top-k/top-p kernel spreads over
the GPU, so it wins where launches dominate and not where the sort does (docs/BENCHMARKS.md, "Thirty-eighth set").
"""

from __future__ import annotations

import functools

import torch

from vllm_omni_kani import sampler_ab
from vllm_omni_kani.model_executor.models.kani_tts import token_layout as tl_codes
from vllm_omni_kani.model_executor.models.kani_tts.seeded_noise import fused_kernel_available
from vllm_omni_kani.model_executor.models.kani_tts.warm_ups import CODE_RACE_KERNEL, WarmUp

try:  # Triton itself, as seeded_noise imports it: the interpreter runs the kernel in the CPU tests
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - every supported install has Triton
    triton = None

NAME = "code_race_kernel"  # its name in KANI_STAGE0_SAMPLER_PATCHES and KANI_SAMPLER_AB_PATCHES
# vLLM treats temperatures below this as greedy (vllm.v1.sample.sampler._SAMPLING_EPS).
GREEDY_EPS = 1e-5
_NUM_WARPS = 8  # a 4,096-wide row: 16 values a thread
# The most sampled requests a step takes the kernel for. In-engine A/B on an H200 (sampled step held, async scheduling,
# 2-s windows): 0.89x the step at batch 1, 0.94x at 4, 0.95x at 16, 1.00x at 64, 1.05x at 256.
MAX_ROWS = 16

_taken = False


def take() -> bool:
    """Have this process's Stage 0 sample its code heads here (``patch.apply_stage0_sampling``); True."""
    global _taken
    _taken = True
    return True


def applies(device: torch.device, rows: int) -> bool:
    """Whether a step of ``rows`` sampled requests on ``device`` samples its code heads here now: the switch taken, at
    most ``MAX_ROWS`` rows, in its A/B window, and the kernel able to run (CUDA, or Triton's interpreter)."""
    return _taken and rows <= MAX_ROWS and fused_kernel_available(device) and sampler_ab.patched_now(NAME)


def warm_ups(heads: int, width: int, dtype: torch.dtype, device: torch.device) -> list[WarmUp]:
    """The calls that compile the kernel at model load, for each filter set a step can bring (each a specialisation),
    where the switch is taken and the kernel compiles (CUDA): a compile in a step stalls every stream."""
    if not (_taken and device.type == "cuda" and fused_kernel_available(device)):
        return []
    return [
        WarmUp(CODE_RACE_KERNEL, functools.partial(sample_packed, *arguments))
        for arguments in warm_up_arguments(heads, width, dtype, device)
    ]


def warm_up_arguments(heads: int, width: int, dtype: torch.dtype, device: torch.device) -> list[tuple]:
    """``sample_packed``'s arguments for each specialisation a step can bring: greedy, then each filter set. The dtypes
    are a served step's (vLLM's float32 temperature and top-p, int32 top-k, the race's float32 noise), named because a
    model loads under vLLM's default dtype (the model's, e.g. bfloat16), whose tensors would compile other kernels."""
    logits = torch.zeros(1, heads, width, dtype=dtype, device=device)
    temperature = torch.ones(1, dtype=torch.float32, device=device)
    top_p = torch.ones(1, dtype=torch.float32, device=device)
    top_k = torch.full((1,), width, dtype=torch.int32, device=device)
    noise = torch.ones(1, heads * width, dtype=torch.float32, device=device)
    filters = ((None, None), (top_k, None), (None, top_p), (top_k, top_p))
    return [(logits, None, None, None, None)] + [(logits, temperature, k, p, noise) for k, p in filters]


def sample_packed(
    logits: torch.Tensor,
    temperature: torch.Tensor | None,
    top_k: torch.Tensor | None,
    top_p: torch.Tensor | None,
    noise: torch.Tensor | None,
) -> torch.Tensor:
    """``[R, K, C]`` head logits → ``[R]`` int64 packed codes.

    ``temperature``, ``top_k`` and ``top_p`` are ``[R]`` per request (vLLM's ``SamplingMetadata`` fields; None: no
    filter). ``temperature`` None means every request is greedy, and then ``noise`` is not read; else ``noise`` is the
    race's ``[R, K * C]`` float32 Exp(1) noise.
    """
    rows, heads, width = logits.shape
    out = torch.empty(rows, dtype=torch.long, device=logits.device)
    if rows == 0:
        return out
    logits = logits.contiguous()
    all_greedy = temperature is None
    dummy = logits  # a pointer the kernel never reads under its constexpr switches
    _code_race_kernel[(rows,)](
        logits,
        dummy if all_greedy else temperature,
        dummy if top_k is None else top_k,
        dummy if top_p is None else top_p,
        dummy if noise is None else noise.contiguous(),
        out,
        width,
        HEADS=heads,
        BLOCK=triton.next_power_of_2(width),
        CODE_BITS=tl_codes.CODE_BITS,
        ALL_GREEDY=all_greedy,
        HAS_TOP_K=top_k is not None and not all_greedy,
        HAS_TOP_P=top_p is not None and not all_greedy,
        GREEDY_EPS=GREEDY_EPS,
        num_warps=_NUM_WARPS,
    )
    return out


if triton is not None:

    @triton.jit
    def _code_race_kernel(
        logits_ptr,
        temperature_ptr,
        top_k_ptr,
        top_p_ptr,
        noise_ptr,
        out_ptr,
        width,
        HEADS: tl.constexpr,
        BLOCK: tl.constexpr,
        CODE_BITS: tl.constexpr,
        ALL_GREEDY: tl.constexpr,
        HAS_TOP_K: tl.constexpr,
        HAS_TOP_P: tl.constexpr,
        GREEDY_EPS: tl.constexpr,
    ):
        request = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        inside = cols < width
        if not ALL_GREEDY:
            temperature = tl.load(temperature_ptr + request).to(tl.float32)
            greedy = temperature < GREEDY_EPS
            divisor = tl.where(greedy, 1.0, temperature)
            if HAS_TOP_K:
                k = tl.minimum(tl.maximum(tl.load(top_k_ptr + request).to(tl.int32), 1), width)
            if HAS_TOP_P:
                p = tl.load(top_p_ptr + request).to(tl.float32)
        packed = request * 0
        for head in tl.static_range(HEADS):
            row = request * HEADS + head
            x = tl.load(logits_ptr + row * width + cols, mask=inside, other=float("-inf")).to(tl.float32)
            best = tl.argmax(x, 0)
            if ALL_GREEDY:
                code = best
            else:
                y = x / divisor
                if HAS_TOP_K or HAS_TOP_P:
                    ranked = tl.sort(y, descending=True)
                    floor = float("-inf")
                    if HAS_TOP_K:
                        floor = tl.max(tl.where(cols == k - 1, ranked, float("-inf")), 0)
                        ranked = tl.where(ranked >= floor, ranked, float("-inf"))
                    if HAS_TOP_P:
                        weight = tl.exp(ranked - tl.max(ranked, 0))
                        before = (tl.cumsum(weight, 0) - weight) / tl.sum(weight, 0)
                        nucleus = tl.min(tl.where(before < p, ranked, float("inf")), 0)
                        floor = tl.where(p < 1.0, tl.maximum(floor, nucleus), floor)
                    y = tl.where(y >= floor, y, float("-inf"))
                q = tl.load(noise_ptr + row * width + cols, mask=inside, other=1.0)
                sampled = tl.argmax(tl.exp(y - tl.max(y, 0)) / q, 0)
                code = tl.where(greedy, best, sampled)
            packed |= code.to(tl.int64) << (head * CODE_BITS)
        tl.store(out_ptr + request, packed)
