"""A candidate for the codec's causal convolutions: one Triton kernel per conv, residual add fused (benchmark only).

cuDNN's channel-major TF32 convs ran NanoCodec's narrow layers (27 and 54 channels at 1,764 and 882 samples per
frame) at 19-29 TFLOP/s against 149 for the 432-channel layer (``codec_layers.py``, H200). This kernel computes one
``[co, t]`` output tile as ``sum_j W_j @ X[:, t + j·d]`` on tensor cores (``tl.dot``, TF32 or strict float32) and
can add a residual to it, the ``x + conv(...)`` of a residual unit. ``codec_layers.py`` measures it beside cuDNN:
it lost everywhere but at 27 channels and 3 taps (docs/BENCHMARKS.md, fourteenth set), so the codec uses cuDNN in
channels-last instead, and this stays here as the measured alternative. Applying the half-snake on load was 13×
slower (the sine recomputed for every tap); time as the GEMM's M dimension (``[T, Ci] @ [Ci, Co]`` tiles) was
slower still (``results/h200-fourteenth/codec-layers/run2-…``).

Input is unpadded (a left-padded window, or ``[state | new]``): ``T_out = T_in - (K-1)·d``. Runs on the Triton
interpreter too (``TRITON_INTERPRET=1``, CPU tensors), which is how the tests check it.
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - CPU wheels without Triton
    triton = None

# Output samples per program; channel tiles follow the layer's width (tl.dot needs at least 16).
BLOCK_T = 128
MIN_BLOCK = 16
MAX_BLOCK_CO = 64
MAX_BLOCK_CI = 32


def _block(channels: int, cap: int) -> int:
    return max(MIN_BLOCK, min(cap, triton.next_power_of_2(channels)))


if triton is not None:

    @triton.jit
    def _causal_conv_kernel(
        x_ptr,
        w_ptr,
        bias_ptr,
        res_ptr,
        y_ptr,
        c_in,
        c_out,
        t_out,
        dilation,
        sxb,
        sxc,
        sxt,
        srb,
        src,
        srt,
        syb,
        syc,
        syt,
        KSIZE: tl.constexpr,
        HAS_RES: tl.constexpr,
        PRECISION: tl.constexpr,
        BLOCK_CO: tl.constexpr,
        BLOCK_CI: tl.constexpr,
        BLOCK_T: tl.constexpr,
    ):
        b = tl.program_id(0).to(tl.int64)
        t = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)
        co = tl.program_id(2) * BLOCK_CO + tl.arange(0, BLOCK_CO)
        t_ok = t < t_out
        co_ok = co < c_out
        acc = tl.zeros((BLOCK_CO, BLOCK_T), dtype=tl.float32)
        # Taps outer and not unrolled: 11 unrolled taps of pipelined loads overflow shared memory.
        for j in range(KSIZE):
            for ci0 in range(0, c_in, BLOCK_CI):
                ci = ci0 + tl.arange(0, BLOCK_CI)
                ci_ok = ci < c_in
                w = tl.load(
                    w_ptr + (j * c_out + co[:, None]) * c_in + ci[None, :],
                    mask=co_ok[:, None] & ci_ok[None, :],
                    other=0.0,
                )
                x = tl.load(
                    x_ptr + b * sxb + ci[:, None].to(tl.int64) * sxc + (t[None, :] + j * dilation).to(tl.int64) * sxt,
                    mask=ci_ok[:, None] & t_ok[None, :],
                    other=0.0,
                )
                acc += tl.dot(w, x, input_precision=PRECISION)
        acc += tl.load(bias_ptr + co, mask=co_ok, other=0.0)[:, None]
        ok = co_ok[:, None] & t_ok[None, :]
        if HAS_RES:
            acc = (
                tl.load(
                    res_ptr + b * srb + co[:, None].to(tl.int64) * src + t[None, :].to(tl.int64) * srt,
                    mask=ok,
                    other=0.0,
                )
                + acc
            )
        tl.store(y_ptr + b * syb + co[:, None].to(tl.int64) * syc + t[None, :].to(tl.int64) * syt, acc, mask=ok)


def available() -> bool:
    """Whether the kernel can run here (Triton importable and a CUDA device present)."""
    return triton is not None and torch.cuda.is_available()


def tap_major(weight: torch.Tensor) -> torch.Tensor:
    """``[Co, Ci, K]`` conv weight → ``[K, Co, Ci]`` contiguous, the layout the kernel reads (once, at load)."""
    return weight.permute(2, 0, 1).contiguous()


def causal_conv(
    x: torch.Tensor,
    weight_tap_major: torch.Tensor,
    bias: torch.Tensor,
    dilation: int,
    *,
    residual: torch.Tensor | None = None,
    tf32: bool = True,
    out: torch.Tensor | None = None,
    block_t: int = BLOCK_T,
    num_warps: int = 4,
) -> torch.Tensor:
    """``residual + conv1d(x, W, bias, dilation)`` without padding: ``[B, Ci, T_in]`` → ``[B, Co, T_out]``.

    ``weight_tap_major``: :func:`tap_major` of the ``[Co, Ci, K]`` weight. ``residual``: ``[B, Co, T_out]``, added
    to the output. float32 throughout; ``tf32`` lets the tensor cores round the inputs to TF32, as cuDNN's TF32
    convs do.
    """
    ksize, c_out, c_in = weight_tap_major.shape
    batch, channels, t_in = x.shape
    if channels != c_in:
        raise ValueError(f"input has {channels} channels, the weight {c_in}")
    t_out = t_in - (ksize - 1) * dilation
    if t_out < 0:
        raise ValueError(f"{t_in} input samples are fewer than the conv's span {(ksize - 1) * dilation + 1}")
    if out is None:
        out = x.new_empty(batch, c_out, t_out)
    if residual is not None and residual.shape != out.shape:
        raise ValueError(f"residual {tuple(residual.shape)} != output {tuple(out.shape)}")
    if batch == 0 or t_out == 0:
        return out
    res = residual if residual is not None else out
    block_co, block_ci = _block(c_out, MAX_BLOCK_CO), _block(c_in, MAX_BLOCK_CI)
    grid = (batch, triton.cdiv(t_out, block_t), triton.cdiv(c_out, block_co))
    _causal_conv_kernel[grid](
        x,
        weight_tap_major,
        bias,
        res,
        out,
        c_in,
        c_out,
        t_out,
        dilation,
        *x.stride(),
        *res.stride(),
        *out.stride(),
        KSIZE=ksize,
        HAS_RES=residual is not None,
        PRECISION="tf32" if tf32 else "ieee",
        BLOCK_CO=block_co,
        BLOCK_CI=block_ci,
        BLOCK_T=block_t,
        num_warps=num_warps,
    )
    return out
