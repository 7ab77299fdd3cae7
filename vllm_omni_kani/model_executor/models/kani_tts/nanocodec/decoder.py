"""Native NanoCodec decode: group-FSQ dequantization + causal HiFi-GAN decoder.

Numerically this follows NeMo's ``AudioCodecModel.decode`` op for op (same pads, same grouped
transposed convs, same snake expression, same branch average), so on one device and one batch
shape the output matches NeMo bit for bit. What is different is only what does not change valid
samples: weight norm is folded once at load, ``1/(alpha+eps)`` is precomputed, and the per-layer
length masks are dropped — every layer is causal, so right padding never reaches a valid sample;
one mask at the end reproduces NeMo's zero tail.

``forward`` has no data-dependent control flow and no host syncs: fixed input shape, fixed work.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

from vllm_omni_kani.model_executor.models.kani_tts.nanocodec import fused
from vllm_omni_kani.model_executor.models.kani_tts.nanocodec.config import NanoCodecConfig

SNAKE_EPS = 1e-9
PRECISIONS = ("fp32", "tf32", "bf16", "fp16")
# Conv weight (and conv input) dtype of the narrow precisions; activations stay float32.
NARROW_CONV_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
LRELU_SLOPE = 0.01  # torch.nn.LeakyReLU's default, which NeMo's HalfSnake uses


def fsq_table(config: NanoCodecConfig) -> torch.Tensor:
    """Latent vector of every code: float32 ``[codebook_size, len(levels)]``.

    Code ``n`` has digits ``k_d = (n // base_d) % L_d`` in the mixed radix ``levels``; each digit
    maps to ``(k_d - L_d//2) / (L_d//2)``. The division stays a float32 division, as in NeMo
    (``* (1/h)`` would differ in the last bit for h = 3).
    """
    levels = torch.tensor(config.levels, dtype=torch.int64)
    base = torch.cumprod(torch.tensor((1, *config.levels[:-1]), dtype=torch.int64), 0)
    codes = torch.arange(config.codebook_size, dtype=torch.int64)[:, None]
    half = (levels // 2).to(torch.float32)
    return ((codes // base) % levels).to(torch.float32).sub(half).div(half)


@contextmanager
def cudnn_tf32(allowed: bool) -> Iterator[None]:
    """Set cuDNN's TF32 switch for the duration (torch 2.11 turns it on by default).

    TF32 convs move the audio by up to 5e-4 from NeMo's float32 decode (measured on an H200), past the
    1e-4 parity bar; strict float32 stays within 4e-6. Only cuDNN reads the switch, so CPU runs ignore it.
    """
    previous = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = allowed
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32 = previous


def _param(*shape: int) -> nn.Parameter:
    # float32 whatever the ambient default dtype: weights are filled by the loader.
    return nn.Parameter(torch.empty(*shape, dtype=torch.float32), requires_grad=False)


class HalfSnake(nn.Module):
    """Snake ``x + sin(αx)²/(α+ε)`` on the first ``C//2`` channels, leaky ReLU on the rest."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.snake_channels = channels // 2
        self.alpha = _param(1, self.snake_channels, 1)
        self.register_buffer("inv_alpha", torch.empty(1, self.snake_channels, 1, dtype=torch.float32), persistent=False)
        # One Triton kernel instead of eager's eight on CUDA float32 (NanoCodecDecoder.set_fused_activations).
        self.fused = False

    @torch.no_grad()
    def refresh(self) -> None:
        """Recompute ``1/(α+ε)`` after ``alpha`` changed (same op as NeMo, so the same bits)."""
        self.inv_alpha.copy_((self.alpha + SNAKE_EPS).reciprocal())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused and fused.supports(x):
            return fused.half_snake_into(x, self.alpha, self.inv_alpha, LRELU_SLOPE, torch.empty_like(x))
        s = x[:, : self.snake_channels]
        s = s + self.inv_alpha * torch.sin(self.alpha * s).pow(2)
        return torch.cat([s, F.leaky_relu(x[:, self.snake_channels :], LRELU_SLOPE)], dim=1)

    def write(self, x: torch.Tensor, out: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        """``out.copy_(self(x + bias))``, in one kernel when fused (``out`` may be a slice of a larger buffer;
        ``bias``: ``[C]``, the preceding conv's, when that conv ran without it)."""
        if self.fused and fused.supports(x):
            fused.half_snake_into(x, self.alpha, self.inv_alpha, LRELU_SLOPE, out, bias)
        else:
            out.copy_(self(x if bias is None else x + bias.view(1, -1, 1)))


class CausalConv(nn.Module):
    """Conv1d padded ``(k-1)·d`` zeros on the left only: output length = input length."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, dilation: int = 1) -> None:
        super().__init__()
        self.weight = _param(out_channels, in_channels, kernel_size)
        self.bias = _param(out_channels)
        self.dilation = dilation
        self.left_pad = (kernel_size - 1) * dilation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.convolve(F.pad(x, (self.left_pad, 0)))

    def convolve(self, x: torch.Tensor, with_bias: bool = True) -> torch.Tensor:
        """Unpadded conv (``left_pad`` fewer outputs than inputs), in the weights' dtype, out in ``x``'s;
        ``with_bias=False`` leaves the bias to the caller (``streaming`` adds it in the kernel that follows)."""
        y = F.conv1d(x.to(self.weight.dtype), self.weight, self.bias if with_bias else None, dilation=self.dilation)
        return y.to(x.dtype)


class CausalUpsample(nn.Module):
    """Grouped transposed conv (kernel 2r, stride r, one group per output channel), right-trimmed by r."""

    def __init__(self, in_channels: int, rate: int) -> None:
        super().__init__()
        self.weight = _param(in_channels, 1, 2 * rate)
        self.bias = _param(in_channels // 2)
        self.rate = rate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.transpose(x)
        return y[..., : y.shape[-1] - self.rate]

    def transpose(self, x: torch.Tensor) -> torch.Tensor:
        """The untrimmed ``(T+1)·rate`` outputs, in the weights' dtype, out in ``x``'s."""
        w = self.weight
        y = F.conv_transpose1d(x.to(w.dtype), w, self.bias, stride=self.rate, groups=self.bias.shape[0])
        return y.to(x.dtype)


class ResidualUnit(nn.Module):
    """``x + skip_conv(act(input_conv(act(x))))``, the dilated conv first."""

    def __init__(self, channels: int, kernel_size: int, dilation: int) -> None:
        super().__init__()
        self.input_activation = HalfSnake(channels)
        self.input_conv = CausalConv(channels, channels, kernel_size, dilation)
        self.skip_activation = HalfSnake(channels)
        self.skip_conv = CausalConv(channels, channels, kernel_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.skip_conv(self.skip_activation(self.input_conv(self.input_activation(x))))


class ResidualBranch(nn.Module):
    """One kernel size, the dilations applied in sequence."""

    def __init__(self, channels: int, kernel_size: int, dilations: Sequence[int]) -> None:
        super().__init__()
        self.res_blocks = nn.ModuleList(ResidualUnit(channels, kernel_size, d) for d in dilations)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for unit in self.res_blocks:
            x = unit(x)
        return x


class ResidualLayer(nn.Module):
    """Mean of parallel branches (kernel sizes 3, 7, 11).

    The branches stay separate convolutions: stacking them into one grouped conv needs the short
    kernels zero-padded to 11 taps (1.57× the multiply-adds) and gives up bit-exactness with NeMo;
    ``benchmarks/bench_codec.py --fused-branches`` measures it (docs/BENCHMARKS.md).
    """

    def __init__(self, channels: int, kernel_sizes: Sequence[int], dilations: Sequence[int]) -> None:
        super().__init__()
        self.res_blocks = nn.ModuleList(ResidualBranch(channels, k, dilations) for k in kernel_sizes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        total = self.res_blocks[0](x)
        for branch in self.res_blocks[1:]:
            total = total + branch(x)
        # True division, not * (1/n): NeMo's sum(...) / len(...).
        return total / len(self.res_blocks)


class NanoCodecDecoder(nn.Module):
    """Codes → 22,050 Hz audio. Codes are frame-major: ``[B, T, num_codebooks]``, ints in [0, codebook_size).

    Parameter names follow NeMo's module paths under ``audio_decoder.`` (``pre_conv``,
    ``up_sample_conv_layers.{i}``, ``res_layers.{i}.res_blocks.{j}.res_blocks.{m}.input_conv`` …)
    with the weight-norm pair folded into ``.weight`` and ``snake_act.alpha`` shortened to ``.alpha``.
    """

    def __init__(self, config: NanoCodecConfig) -> None:
        super().__init__()
        self.config = config
        self.samples_per_frame = config.samples_per_frame
        self.allow_tf32 = False  # see set_precision
        self.register_buffer("fsq_table", fsq_table(config), persistent=False)
        self.pre_conv = CausalConv(config.latent_dim, config.base_channels, config.in_kernel_size)
        self.activations = nn.ModuleList()
        self.up_sample_conv_layers = nn.ModuleList()
        self.res_layers = nn.ModuleList()
        channels = config.base_channels
        for rate in config.up_sample_rates:
            self.activations.append(HalfSnake(channels))
            self.up_sample_conv_layers.append(CausalUpsample(channels, rate))
            channels //= 2
            self.res_layers.append(ResidualLayer(channels, config.resblock_kernel_sizes, config.resblock_dilations))
        self.post_activation = HalfSnake(channels)
        self.post_conv = CausalConv(channels, 1, config.out_kernel_size)

    def refresh(self) -> None:
        """Recompute derived buffers after the weights were loaded or changed."""
        for module in self.modules():
            if isinstance(module, HalfSnake):
                module.refresh()

    @property
    def device(self) -> torch.device:
        return self.pre_conv.weight.device

    @property
    def dtype(self) -> torch.dtype:
        """The activations' dtype (audio, snake, residual sums); conv weights may be narrower (set_precision)."""
        return self.post_activation.alpha.dtype

    @property
    def precision(self) -> str:
        narrow = {dtype: name for name, dtype in NARROW_CONV_DTYPES.items()}
        return narrow.get(self.pre_conv.weight.dtype, "tf32" if self.allow_tf32 else "fp32")

    def set_precision(self, precision: str) -> NanoCodecDecoder:
        """``fp32``: strict float32 convs (NeMo parity, the CPU default). ``tf32``: cuDNN may run float32 convs on
        TF32 tensor cores (CUDA only; CPUs ignore it). ``bf16`` / ``fp16``: conv weights and conv inputs in
        that dtype with float32 accumulation in cuDNN, everything between the convs (snake, residual sums,
        branch mean) in float32. SNR of each against strict float32: docs/BENCHMARKS.md. Call before capturing
        CUDA graphs.
        """
        if precision not in PRECISIONS:
            raise ValueError(f"codec precision must be one of {', '.join(PRECISIONS)}; got {precision!r}")
        if self.dtype != torch.float32 and precision != "fp32":
            raise ValueError(f"codec precision {precision!r} needs float32 activations, not {self.dtype}")
        weight_dtype = NARROW_CONV_DTYPES.get(precision, self.dtype)
        for module in self.modules():
            if isinstance(module, CausalConv | CausalUpsample):
                module.weight.data = module.weight.data.to(weight_dtype)
                module.bias.data = module.bias.data.to(weight_dtype)
        self.allow_tf32 = precision == "tf32"
        return self

    def set_fused_activations(self, on: bool) -> NanoCodecDecoder:
        """Run the half-snakes as one Triton kernel each where they can (float32 on CUDA; see ``fused``); the
        result equals eager's to float32 rounding. Call before capturing CUDA graphs."""
        for module in self.modules():
            if isinstance(module, HalfSnake):
                module.fused = bool(on)
        return self

    @property
    def fused_activations(self) -> bool:
        return self.post_activation.fused

    def dequantize(self, codes: torch.Tensor) -> torch.Tensor:
        """``[B, T, G]`` codes → ``[B, G·D, T]`` latents; group g fills channels ``g·D … g·D+D-1``."""
        b, t, g = codes.shape
        return self.fsq_table[codes].reshape(b, t, g * self.fsq_table.shape[1]).transpose(1, 2)

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        """``[B, T, G]`` int codes → ``[B, T·samples_per_frame]`` audio in [-1, 1] (no length mask)."""
        return self.decode_latents(self.dequantize(codes).to(self.dtype))

    def decode_latents(self, latents: torch.Tensor) -> torch.Tensor:
        """``[B, latent_dim, T]`` dequantized latents → ``[B, T·spf]`` audio (differentiable, for analysis)."""
        with cudnn_tf32(self.allow_tf32):
            x = self.pre_conv(latents)
            for act, up, res in zip(self.activations, self.up_sample_conv_layers, self.res_layers, strict=True):
                x = res(up(act(x)))
            x = self.post_conv(self.post_activation(x))
        return torch.clamp(x, -1.0, 1.0)[:, 0]

    @torch.inference_mode()
    def decode(self, codes: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        """Decode a right-padded batch, like NeMo's ``decode`` but frame-major.

        codes: ``[B, T, G]`` int (NeMo's ``tokens`` is ``[B, G, T]``: pass ``tokens.transpose(1, 2)``).
        lengths: ``[B]`` valid frames per row, or None for all T. Samples past ``lengths·spf`` are 0.
        Returns float ``[B, T·spf]`` (spf = 1,764). Code values are not validated here (that would
        sync with the device); :meth:`decode_windows` validates them on the CPU.
        """
        if codes.ndim != 3 or codes.shape[-1] != self.config.num_codebooks:
            raise ValueError(f"codes must be [B, T, {self.config.num_codebooks}], got {tuple(codes.shape)}")
        audio = self(codes.to(self.device))
        if lengths is None:
            return audio
        valid = (
            torch.arange(audio.shape[-1], device=audio.device)
            < (lengths.to(audio.device) * self.samples_per_frame)[:, None]
        )
        return audio * valid

    @torch.inference_mode()
    def decode_windows(
        self,
        windows: Sequence[torch.Tensor],
        left_context_frames: Sequence[int],
        max_new_frames: int | None = None,
        forward: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> list[torch.Tensor]:
        """Decode streaming windows ``[left context | new frames]`` in one batched call.

        windows: per request ``[F_i, G]`` int codes on the CPU (as the connector delivers them).
        left_context_frames: per request, frames at the start of the window that were emitted
        before; their samples are decoded but not returned. With at least
        ``config.receptive_field_frames`` (28) of them — or the window starting at frame 0 — the
        result equals the corresponding slice of a full-utterance decode.
        max_new_frames: split longer windows into pieces of this many new frames, each re-decoding
        28 frames of context (exact; bounds activation memory and the set of batch shapes).
        forward: what decodes the padded ``[B, T, G]`` batch (default: this module; ``CodecGraphs`` replays
        captured CUDA graphs of it).
        Returns per request a 1-D float tensor of ``(F_i - left_i)·spf`` samples, on the decoder's device.
        """
        plan = plan_pieces(windows, left_context_frames, self.config, max_new_frames)
        out: list[list[torch.Tensor]] = [[] for _ in windows]
        if plan:
            longest = max(stop - start for _, start, _, stop in plan)
            batch = torch.zeros(len(plan), longest, self.config.num_codebooks, dtype=torch.int64)
            for row, (req, start, _, stop) in enumerate(plan):
                batch[row, : stop - start] = windows[req][start:stop]
            audio = (forward or self)(batch.to(self.device, non_blocking=True))
            spf = self.samples_per_frame
            for row, (req, start, first_new, stop) in enumerate(plan):
                out[req].append(audio[row, (first_new - start) * spf : (stop - start) * spf])
        empty = torch.empty(0, dtype=self.dtype, device=self.device)
        return [torch.cat(pieces) if len(pieces) > 1 else (pieces[0] if pieces else empty) for pieces in out]

    def decode_window(self, codes: torch.Tensor, left_context_frames: int) -> torch.Tensor:
        """One window ``[F, G]`` → the ``(F - left)·spf`` samples of its new frames (see :meth:`decode_windows`)."""
        return self.decode_windows([codes], [left_context_frames])[0]


def plan_pieces(
    windows: Sequence[torch.Tensor],
    left_context_frames: Sequence[int],
    config: NanoCodecConfig,
    max_new_frames: int | None = None,
) -> list[tuple[int, int, int, int]]:
    """Validate windows and cut them into decode pieces ``(request, start, first_new, stop)`` (frame indices).

    A piece decodes frames ``start:stop`` of its request's window and keeps ``first_new:stop``.
    Windows with no new frames produce no piece.
    """
    if len(windows) != len(left_context_frames):
        raise ValueError(f"{len(windows)} windows but {len(left_context_frames)} left-context sizes")
    if max_new_frames is not None and max_new_frames < 1:
        raise ValueError(f"max_new_frames must be positive, got {max_new_frames}")
    context = config.receptive_field_frames
    plan = []
    for req, (codes, left) in enumerate(zip(windows, left_context_frames, strict=True)):
        check_codes(codes, config)
        frames = codes.shape[0]
        if not 0 <= left <= frames:
            raise ValueError(f"left_context_frames={left} outside the {frames}-frame window")
        step = max_new_frames or max(frames - left, 1)
        for first_new in range(left, frames, step):
            start = 0 if first_new == left else max(first_new - context, 0)
            plan.append((req, start, first_new, min(first_new + step, frames)))
    return plan


def check_codes(codes: torch.Tensor, config: NanoCodecConfig) -> None:
    """``[F, G]`` integer codes within ``[0, codebook_size)`` (NeMo would silently wrap others)."""
    if codes.ndim != 2 or codes.shape[1] != config.num_codebooks:
        raise ValueError(f"a window must be [frames, {config.num_codebooks}] codes, got {tuple(codes.shape)}")
    if codes.is_floating_point() or codes.is_complex():
        raise ValueError(f"codes must be integers, got {codes.dtype}")
    if codes.numel():
        low, high = (int(v) for v in torch.aminmax(codes))
        if low < 0 or high >= config.codebook_size:
            raise ValueError(f"codes must be in [0, {config.codebook_size}), got min {low} max {high}")
