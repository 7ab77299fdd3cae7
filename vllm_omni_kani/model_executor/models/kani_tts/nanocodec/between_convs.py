"""The stateful decoder's work between its convs as Triton kernels (CUDA, float32).

Served at 256 streams, the codec's GPU time was ~1/3 convolutions: cuDNN adds each conv's bias in a separate
broadcast kernel (15% of the codec's kernel time, as long as half the conv itself in the narrow layers), the
grouped transposed convs of the up-samplers run in cuDNN's direct dgrad kernel (0.2-0.6 ms each), and every
layout change is a copy of its own (``benchmarks/kernel_share.py`` on a served trace, docs/BENCHMARKS.md). Here
the convs run without their bias and:

- :func:`residual_into` adds the skip conv's bias and the residual in one pass, and for a branch's last unit also
  the branch mean ``(total + y) / n`` (NeMo's ``sum(...) / len(...)``, same association), writing the layer's
  output in whatever layout the next layer takes; inside a branch it can also write the next unit's input
  half-snake (:class:`NextActivation`) into that unit's conv input, saving the half-snake kernel's read of the
  float32 residual stream;
- :func:`upsample_into` is the grouped transposed conv (kernel ``2r``, stride ``r``, two input channels per output
  channel: four multiply-adds per sample) with its bias, written straight into the next layer's layout and channel
  padding, with the stream's one input of state already prepended;
- the input conv's bias goes into the half-snake that follows it (``fused.half_snake_into``).

Tensors are indexed ``[B, T, C]`` with any strides, so channel-major ``[B, C, T]`` memory and channels-last
``[B, T, C_padded]`` memory go through the same kernels; Triton specializes unit strides, so reads and writes along
the contiguous dimension coalesce. Sums happen in float32 in the order eager PyTorch does them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vllm_omni_kani.model_executor.models.kani_tts.nanocodec import fused

try:
    import triton
    import triton.language as tl
    from triton.language.extra import libdevice
except ImportError:  # pragma: no cover - CPU wheels without Triton
    triton = None

# What a conv hands the kernels: float32, or float16 from the channels-last layers' half-precision convs.
CONV_OUTPUT_DTYPES = (torch.float32, torch.float16)
# Tiles of [time, channels]; channel tiles narrower for narrow layers.
BLOCK_T = 64
MAX_BLOCK_C = 64


def available() -> bool:
    return fused.available()


def _btc_strides(x: torch.Tensor, channel_major: bool) -> tuple[int, int, int]:
    """(batch, time, channel) strides of a ``[B, C, T]`` (``channel_major``) or ``[B, T, C]`` tensor."""
    return (x.stride(0), x.stride(2), x.stride(1)) if channel_major else (x.stride(0), x.stride(1), x.stride(2))


if triton is not None:
    from vllm_omni_kani.model_executor.models.kani_tts.nanocodec.fused import tile_offsets

    @triton.jit
    def _residual_kernel(
        y_ptr,
        s_ptr,
        bias_ptr,
        total_ptr,
        out_ptr,
        length,
        channels,
        syb,
        syt,
        syc,
        ssb,
        sst,
        ssc,
        stb,
        stt,
        stc,
        sob,
        sot,
        soc,
        divisor,
        act_ptr,
        sab,
        sat,
        sac,
        alpha_ptr,
        inv_alpha_ptr,
        snake_channels,
        slope,
        HAS_TOTAL: tl.constexpr,
        HAS_ACT: tl.constexpr,
        BLOCK_T: tl.constexpr,
        BLOCK_C: tl.constexpr,
    ):
        b, t, c = tile_offsets(BLOCK_T, BLOCK_C)
        t, c = t[:, None], c[None, :]
        mask = (t < length) & (c < channels)
        y = tl.load(y_ptr + b * syb + t * syt + c * syc, mask=mask, other=0.0)
        s = tl.load(s_ptr + b * ssb + t * sst + c * ssc, mask=mask, other=0.0).to(tl.float32)
        bias = tl.load(bias_ptr + c, mask=c < channels, other=0.0)
        r = y + (s + bias)
        if HAS_TOTAL:
            total = tl.load(total_ptr + b * stb + t * stt + c * stc, mask=mask, other=0.0)
            r = libdevice.div_rn(total + r, divisor)
        tl.store(out_ptr + b * sob + t * sot + c * soc, r, mask=mask)
        if HAS_ACT:
            # The next unit's input half-snake of r, as fused.half_snake_into computes it from r read back.
            snake = c < snake_channels
            alpha = tl.load(alpha_ptr + c, mask=snake, other=0.0)
            inv_alpha = tl.load(inv_alpha_ptr + c, mask=snake, other=0.0)
            sn = libdevice.sin(alpha * r)
            h = tl.where(snake, r + inv_alpha * (sn * sn), tl.where(r > 0, r, r * slope))
            tl.store(act_ptr + b * sab + t * sat + c * sac, h, mask=mask)

    @triton.jit
    def _upsample_kernel(
        x_ptr,
        w_ptr,
        bias_ptr,
        out_ptr,
        out_length,
        channels,
        out_channels,
        rate,
        sxb,
        sxc,
        sxt,
        sob,
        sot,
        soc,
        BLOCK_T: tl.constexpr,
        BLOCK_C: tl.constexpr,
    ):
        b, o, c = tile_offsets(BLOCK_T, BLOCK_C)
        o, c = o[:, None], c[None, :]
        live = c < channels
        mask = (o < out_length) & live
        # Output o (after the leading ``rate`` are trimmed) takes input q+1 through tap m and input q through tap
        # m + rate, from both input channels 2c and 2c+1 of its group; input 0 is the stream's state.
        q = o // rate
        m = o % rate
        x0 = x_ptr + b * sxb + (2 * c) * sxc
        x1 = x0 + sxc
        w0 = w_ptr + (2 * c) * (2 * rate)
        w1 = w0 + 2 * rate
        acc = tl.load(bias_ptr + c, mask=live, other=0.0)
        acc = acc + tl.load(x0 + (q + 1) * sxt, mask=mask, other=0.0) * tl.load(w0 + m, mask=mask, other=0.0)
        acc = acc + tl.load(x0 + q * sxt, mask=mask, other=0.0) * tl.load(w0 + m + rate, mask=mask, other=0.0)
        acc = acc + tl.load(x1 + (q + 1) * sxt, mask=mask, other=0.0) * tl.load(w1 + m, mask=mask, other=0.0)
        acc = acc + tl.load(x1 + q * sxt, mask=mask, other=0.0) * tl.load(w1 + m + rate, mask=mask, other=0.0)
        # Padded channels (out_channels > channels) are written as zeros.
        tl.store(out_ptr + b * sob + o * sot + c * soc, acc, mask=(o < out_length) & (c < out_channels))


@dataclass(frozen=True)
class NextActivation:
    """The half-snake of the next residual unit, for :func:`residual_into` to apply on the way out: snake with
    ``alpha`` / ``inv_alpha`` (``HalfSnake``'s, ``alpha.numel()`` channels) then leaky ReLU with ``slope``, written
    into ``out`` (the new-input part of that unit's joined ``[state | new]`` conv input)."""

    out: torch.Tensor
    alpha: torch.Tensor
    inv_alpha: torch.Tensor
    slope: float

    def check(self, shape: torch.Size) -> None:
        if not (self.out.is_cuda and self.out.dtype in CONV_OUTPUT_DTYPES and self.out.shape == shape):
            raise ValueError(
                f"the next activation's output must be a float32/float16 CUDA tensor of shape {tuple(shape)}; "
                f"got {self.out.dtype} {tuple(self.out.shape)} on {self.out.device}"
            )
        if not all(p.is_cuda and p.dtype == torch.float32 and p.is_contiguous() for p in (self.alpha, self.inv_alpha)):
            raise ValueError("alpha and inv_alpha must be contiguous float32 CUDA tensors")
        if self.alpha.numel() != self.inv_alpha.numel():
            raise ValueError(f"alpha ({self.alpha.numel()}) and inv_alpha ({self.inv_alpha.numel()}) differ in size")


def _tiles(batch: int, length: int, channels: int) -> tuple[tuple[int, int, int], int]:
    """The launch grid of ``[BLOCK_T, block_c]`` tiles over ``[batch, length, channels]``, and ``block_c``."""
    block_c = min(triton.next_power_of_2(max(channels, 1)), MAX_BLOCK_C)
    return (batch, triton.cdiv(length, BLOCK_T), triton.cdiv(channels, block_c)), block_c


def _check(*tensors: torch.Tensor, conv_output: torch.Tensor | None = None) -> None:
    """Float32 CUDA tensors; ``conv_output`` may also be float16 (a channels-last conv's, ``streaming``)."""
    for x in tensors:
        if not (x.is_cuda and x.dtype == torch.float32):
            raise ValueError(f"between-conv kernels take float32 CUDA tensors; got {x.dtype} on {x.device}")
    if conv_output is not None and not (conv_output.is_cuda and conv_output.dtype in CONV_OUTPUT_DTYPES):
        raise ValueError(f"a conv output must be a float32 or float16 CUDA tensor; got {conv_output.dtype}")


def residual_into(
    y: torch.Tensor,
    s: torch.Tensor,
    bias: torch.Tensor,
    out: torch.Tensor,
    channel_major: bool,
    total: torch.Tensor | None = None,
    divisor: int = 1,
    channels: int | None = None,
    activation: NextActivation | None = None,
) -> torch.Tensor:
    """``out = y + (s + bias)``, or with ``total`` ``out = (total + y + (s + bias)) / divisor``, over the first
    ``channels`` channels (default: all of ``y``'s); with ``activation`` also its half-snake of ``out`` into
    ``activation.out``, so the next unit's conv input is written without reading ``out`` back.

    ``y``, ``s``, ``total``: ``[B, C, T]`` when ``channel_major``, else ``[B, T, C]``, any strides; ``out`` and
    ``activation.out`` are indexed the same way (pass a transposed view to change layout); ``bias``: contiguous
    ``[>= channels]``. ``s`` (the skip conv's output) and ``activation.out`` (a conv's input) may be float16, computed
    in float32; everything else is float32. ``out`` may be ``s`` when both are float32. Returns ``out``.
    """
    _check(y, bias, out, *(() if total is None else (total,)), conv_output=s)
    length = y.shape[2] if channel_major else y.shape[1]
    width = channels if channels is not None else (y.shape[1] if channel_major else y.shape[2])
    batch = y.shape[0]
    if activation is not None:
        activation.check(y.shape)
    if batch == 0 or length == 0 or width == 0:
        return out
    tot = s if total is None else total
    # Without an activation the kernel still takes its pointers (HAS_ACT=False never touches them).
    act = activation if activation is not None else NextActivation(out, bias, bias, 0.0)
    grid, block_c = _tiles(batch, length, width)
    _residual_kernel[grid](
        y,
        s,
        bias,
        tot,
        out,
        length,
        width,
        *_btc_strides(y, channel_major),
        *_btc_strides(s, channel_major),
        *_btc_strides(tot, channel_major),
        *_btc_strides(out, channel_major),
        float(divisor),
        act.out,
        *_btc_strides(act.out, channel_major),
        act.alpha,
        act.inv_alpha,
        act.alpha.numel() if activation is not None else 0,
        float(act.slope),
        HAS_TOTAL=total is not None,
        HAS_ACT=activation is not None,
        BLOCK_T=BLOCK_T,
        BLOCK_C=block_c,
    )
    return out


def upsample_into(
    joined: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, rate: int, out: torch.Tensor, channel_major: bool
) -> torch.Tensor:
    """The stream step of a grouped causal transposed conv: ``joined`` ``[B, 2C, 1 + T]`` (state, then the new
    inputs, activation applied; any strides), ``weight`` contiguous ``[2C, 1, 2·rate]``, ``bias`` ``[C]`` →
    ``out`` of ``T·rate`` outputs per row, equal to ``conv_transpose1d(joined)[..., rate : rate·(T+1)]``.

    ``out``: ``[B, C_out, T·rate]`` when ``channel_major``, else ``[B, T·rate, C_out]``, any strides, with
    ``C_out >= C``; channels past ``C`` are written as zeros (the channels-last layers' padding). Returns ``out``.
    """
    _check(joined, weight, bias, out)
    batch, in_channels, steps = joined.shape
    channels = in_channels // 2
    if weight.shape != (in_channels, 1, 2 * rate) or not weight.is_contiguous() or bias.shape != (channels,):
        raise ValueError(f"upsample weight {tuple(weight.shape)} / bias {tuple(bias.shape)} do not fit {in_channels}")
    out_length = (steps - 1) * rate
    out_channels = out.shape[1] if channel_major else out.shape[2]
    if out_channels < channels or (out.shape[2] if channel_major else out.shape[1]) != out_length:
        raise ValueError(f"upsample output {tuple(out.shape)} does not hold {channels} x {out_length}")
    if batch == 0 or out_length == 0:
        return out
    grid, block_c = _tiles(batch, out_length, out_channels)
    _upsample_kernel[grid](
        joined,
        weight,
        bias,
        out,
        out_length,
        channels,
        out_channels,
        rate,
        joined.stride(0),
        joined.stride(1),
        joined.stride(2),
        *_btc_strides(out, channel_major),
        BLOCK_T=BLOCK_T,
        BLOCK_C=block_c,
    )
    return out
