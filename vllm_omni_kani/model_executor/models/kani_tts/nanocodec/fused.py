"""The half-snake activation as one Triton kernel (CUDA), writing straight into a caller's buffer.

In eager PyTorch :class:`~.decoder.HalfSnake` is seven kernels (slice, two multiplies, sin, square, add, leaky
ReLU) plus the ``cat`` that rejoins the halves, and the stateful decoder then copies the result once more to
prepend each row's conv state. Elementwise work was ~28% of the codec's GPU time. This kernel reads ``x`` once
and writes the activation once, into any strided view, e.g. the slice of the ``[state | new]`` conv input that
:mod:`.streaming` assembles.

The arithmetic is eager's, op for op in float32 (``s + inv_alpha * (sin(alpha * s) ** 2)`` with libdevice's
``sinf``, ``x if x > 0 else x * slope``), so fused and eager agree to float32 rounding; the CUDA-only tests hold
them to a few ulps. Only float32 activations on CUDA are fused (and float16 ones: the channels-last layers'
half-precision conv inputs and outputs, computed in float32); everything else stays eager. Tensors whose channels
are adjacent in memory (the codec's channels-last layers hand over ``[B, C, T]`` views of ``[B, T, C]``) take a
second kernel that tiles time × channels, so its reads and writes stay coalesced.

Both kernels can add a per-channel bias to ``x`` first: the stateful decoder runs its convs without their bias and
has the activation that follows add it (``between_convs``), which saves cuDNN's separate broadcast add per conv.
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
    from triton.language.extra import libdevice
except ImportError:  # pragma: no cover - CPU wheels without Triton
    triton = None

# Input and output dtypes the kernels take (float16 for the channels-last layers' half-precision conv inputs).
IO_DTYPES = (torch.float32, torch.float16)
# Time steps per program; one program covers one (row, channel) pair's BLOCK samples.
BLOCK = 1024
# Channels-last tensors (channel stride 1): one program covers BLOCK_T_CL time steps of up to MAX_BLOCK_C_CL channels.
BLOCK_T_CL = 64
MAX_BLOCK_C_CL = 128


def available() -> bool:
    """Whether the fused kernel can run here (Triton importable and a CUDA device present)."""
    return triton is not None and torch.cuda.is_available()


def supports(x: torch.Tensor) -> bool:
    """Whether ``x`` can go through the kernel: float32 or float16 ``[B, C, T]`` on a CUDA device."""
    return triton is not None and x.is_cuda and x.dtype in IO_DTYPES and x.dim() == 3


if triton is not None:

    @triton.jit
    def tile_offsets(BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr):
        """(batch, time offsets, channel offsets) of this program's ``[BLOCK_T, BLOCK_C]`` tile of a ``[B, T, C]``
        grid ``(B, cdiv(T, BLOCK_T), cdiv(C, BLOCK_C))``; time as int64 (a row's samples pass 2**31 bytes)."""
        b = tl.program_id(0).to(tl.int64)
        t = tl.program_id(1).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
        c = tl.program_id(2) * BLOCK_C + tl.arange(0, BLOCK_C)
        return b, t, c

    @triton.jit
    def _half_snake_kernel(
        x_ptr,
        out_ptr,
        alpha_ptr,
        inv_alpha_ptr,
        bias_ptr,
        channels,
        snake_channels,
        length,
        sxb,
        sxc,
        sxt,
        sob,
        soc,
        sot,
        slope,
        BLOCK_T: tl.constexpr,
        HAS_BIAS: tl.constexpr,
    ):
        row = tl.program_id(0)
        b = (row // channels).to(tl.int64)
        c = (row % channels).to(tl.int64)
        t = tl.program_id(1).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
        mask = t < length
        x = tl.load(x_ptr + b * sxb + c * sxc + t * sxt, mask=mask, other=0.0).to(tl.float32)
        if HAS_BIAS:
            x = x + tl.load(bias_ptr + c)
        if c < snake_channels:
            alpha = tl.load(alpha_ptr + c)
            inv_alpha = tl.load(inv_alpha_ptr + c)
            s = libdevice.sin(alpha * x)
            y = x + inv_alpha * (s * s)
        else:
            y = tl.where(x > 0, x, x * slope)
        tl.store(out_ptr + b * sob + c * soc + t * sot, y, mask=mask)

    @triton.jit
    def _half_snake_channels_last_kernel(
        x_ptr,
        out_ptr,
        alpha_ptr,
        inv_alpha_ptr,
        bias_ptr,
        channels,
        snake_channels,
        length,
        sxb,
        sxt,
        sob,
        sot,
        slope,
        BLOCK_T: tl.constexpr,
        BLOCK_C: tl.constexpr,
        HAS_BIAS: tl.constexpr,
    ):
        b, t, c = tile_offsets(BLOCK_T, BLOCK_C)
        t = t[:, None]
        mask = (t < length) & (c < channels)[None, :]
        x = tl.load(x_ptr + b * sxb + t * sxt + c[None, :], mask=mask, other=0.0).to(tl.float32)
        if HAS_BIAS:
            x = x + tl.load(bias_ptr + c, mask=c < channels, other=0.0)[None, :]
        snake = c < snake_channels
        alpha = tl.load(alpha_ptr + c, mask=snake, other=0.0)
        inv_alpha = tl.load(inv_alpha_ptr + c, mask=snake, other=0.0)
        s = libdevice.sin(alpha[None, :] * x)
        y = tl.where(snake[None, :], x + inv_alpha[None, :] * (s * s), tl.where(x > 0, x, x * slope))
        tl.store(out_ptr + b * sob + t * sot + c[None, :], y, mask=mask)


def half_snake_into(
    x: torch.Tensor,
    alpha: torch.Tensor,
    inv_alpha: torch.Tensor,
    slope: float,
    out: torch.Tensor,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """Write half-snake(``x`` + ``bias``) into ``out`` (same shape, any strides); snake on the first
    ``alpha.numel()`` channels, leaky ReLU with ``slope`` on the rest. ``bias``: float32 ``[C]`` or None.
    ``x`` and ``out`` may each be float16 (the channels-last layers' half-precision convs): the arithmetic stays
    float32, rounded once on the store. Returns ``out``."""
    if not supports(x) or out.dtype not in IO_DTYPES or out.shape != x.shape:
        raise ValueError(
            f"fused half-snake needs float32/float16 CUDA [B, C, T] tensors of one shape; got {x.dtype} {x.shape}, "
            f"{out.dtype} {out.shape}"
        )
    if bias is not None and (bias.dtype != torch.float32 or bias.shape != (x.shape[1],) or not bias.is_contiguous()):
        raise ValueError(f"the bias must be a contiguous float32 [{x.shape[1]}] tensor; got {bias.dtype} {bias.shape}")
    batch, channels, length = x.shape
    if batch * channels == 0 or length == 0:
        return out
    if x.stride(1) == 1 and out.stride(1) == 1 and channels > 1:
        # Channels-last views ([B, T, C] memory): tiles of [time, channels], reads and writes coalesced.
        block_c = min(triton.next_power_of_2(channels), MAX_BLOCK_C_CL)
        grid = (batch, triton.cdiv(length, BLOCK_T_CL), triton.cdiv(channels, block_c))
        _half_snake_channels_last_kernel[grid](
            x,
            out,
            alpha,
            inv_alpha,
            alpha if bias is None else bias,
            channels,
            alpha.numel(),
            length,
            x.stride(0),
            x.stride(2),
            out.stride(0),
            out.stride(2),
            slope,
            BLOCK_T=BLOCK_T_CL,
            BLOCK_C=block_c,
            HAS_BIAS=bias is not None,
        )
        return out
    grid = (batch * channels, triton.cdiv(length, BLOCK))
    _half_snake_kernel[grid](
        x,
        out,
        alpha,
        inv_alpha,
        alpha if bias is None else bias,
        channels,
        alpha.numel(),
        length,
        *x.stride(),
        *out.stride(),
        slope,
        BLOCK_T=BLOCK,
        HAS_BIAS=bias is not None,
    )
    return out
