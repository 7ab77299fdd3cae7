"""Stateful streaming NanoCodec decode: every chunk decodes only its new frames.

Every layer of the decoder is causal, so a chunk's audio depends on its own frames and on the last
``(kernel-1)·dilation`` inputs of every convolution (one input of every transposed conv), at that layer's
rate. :class:`StreamingCodec` keeps exactly those inputs per request in a preallocated slot pool — the way
vLLM keeps Mamba and short-conv state — so a batched step gathers the rows' states, prepends them to the
new inputs, convolves without padding, and scatters each row's last inputs back. Zero states reproduce the
zero left padding of a one-shot decode, so streamed audio equals one decode of the whole utterance up to
float rounding (the stateless window path re-decodes 28 frames of context per chunk instead).

:meth:`StreamingCodec.step` has fixed shapes, no host syncs and no data-dependent control flow: rows may be
right-padded (each row's state is taken at its own length), padded rows point at scratch slots, so a step
captures in a CUDA graph per (batch, frames) bucket.

**Channels-last narrow layers (CUDA).** cuDNN runs the narrow residual layers' convs (108, 54 and 27 channels)
1.02-2.56× faster as 2-D convs in channels-last with the channels zero-padded to a multiple of 8 than as
channel-major conv1d (``benchmarks/codec_layers.py``, docs/BENCHMARKS.md); those layers were 81% of the step.
So residual layers narrower than ``channels_last_below`` keep their activations and states as ``[B, T, C_padded]``:
the padded channels hold zeros throughout (zero weights and bias in, half-snake(0) = 0), and the layer's input and
output are converted once each. CPUs keep every layer channel-major unless asked.

**Half-precision narrow convs (CUDA, TF32 precision).** cuDNN runs the channels-last convs' TF32 kernels after
converting each input (a pass the size of the activation, 40-60% of the conv's own time), and in float16 it runs them
without that pass, on half the bytes: 2x faster for these 54 convs (``benchmarks/conv_engines.py``). float16 keeps
TF32's 10-bit mantissa; the conv still accumulates in float32. So with the between-conv kernels and TF32 precision
the channels-last layers' conv inputs, weights, states and outputs are float16 (``channels_last_dtype``), while the
residual stream, biases, half-snake arithmetic and every sum between the convs stay float32: the kernels read and
write float16 where a conv does and compute in float32. SNR against strict float32: docs/BENCHMARKS.md.

**Between the convs (CUDA, float32).** With ``fuse_between_convs`` the convs run without their bias, and Triton
kernels (``between_convs``) do the rest: the input conv's bias goes into the half-snake after it, the skip conv's
bias and the residual add are one pass (with the branch mean on the layer's last unit, written channel-major for
the next up-sampler), and each up-sampler's grouped transposed conv writes the next layer's layout directly, so the
layout copies and cuDNN's separate bias adds and direct dgrad kernels go. Within a branch the residual add also writes
the next unit's input half-snake into that unit's ``[state | new]`` buffer (``fuse_next_activation``), so the
float32 residual stream is not read back by a half-snake kernel of its own.

**The states' copies (CUDA).** With ``fuse_state_copies`` (default: wherever the kernels run) each layer's rows'
states go into its buffer and its new states out in one Triton kernel each way (:mod:`.state_copies`) instead of
PyTorch's four kernels and two temporaries: the same bytes.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from vllm_omni_kani.model_executor.models.kani_tts.nanocodec import between_convs, state_copies
from vllm_omni_kani.model_executor.models.kani_tts.nanocodec.decoder import (
    LRELU_SLOPE,
    CausalConv,
    CausalUpsample,
    HalfSnake,
    NanoCodecDecoder,
    ResidualLayer,
    cudnn_tf32,
)

# What the channels-last convs may run in (StreamingCodec.channels_last_dtype).
CHANNELS_LAST_DTYPES = (torch.float32, torch.float16)
# Residual layers narrower than this run channels-last on CUDA (StreamingCodec's channels_last_below), with their
# channels padded to a multiple of CHANNEL_MULTIPLE: the fastest cuDNN choice measured for 27, 54 and 108 channels
# (multiples of 16 made the dilated 54-channel convs 1.6-2x slower than 8).
CHANNELS_LAST_BELOW = 128
CHANNEL_MULTIPLE = 8


def padded_channels(channels: int) -> int:
    return -(-channels // CHANNEL_MULTIPLE) * CHANNEL_MULTIPLE


class SlotsExhaustedError(RuntimeError):
    """Every state slot holds a live stream."""


class StreamingCodec:
    """Per-request causal state of a :class:`NanoCodecDecoder` in a pool of ``num_slots`` slots.

    ``scratch_rows`` extra slots absorb the state writes of padded batch rows (one per row, so no two
    rows of a step write the same slot). Which request holds which slot is host-side, keyed by request id.
    """

    def __init__(
        self,
        decoder: NanoCodecDecoder,
        num_slots: int,
        scratch_rows: int = 64,
        channels_last_below: int | None = None,
        fuse_between_convs: bool | None = None,
        channels_last_dtype: torch.dtype | None = None,
        fuse_next_activation: bool = True,
        fuse_state_copies: bool | None = None,
    ) -> None:
        if num_slots < 1 or scratch_rows < 1:
            raise ValueError(f"num_slots ({num_slots}) and scratch_rows ({scratch_rows}) must be positive")
        self.decoder = decoder
        self.num_slots = num_slots
        self.scratch_rows = scratch_rows
        if channels_last_below is None:
            channels_last_below = CHANNELS_LAST_BELOW if decoder.device.type == "cuda" else 0
        # Residual layers (by index) that run channels-last, and the padded width of each of their convs.
        self.channels_last_layers = {i for i, c in enumerate(decoder.config.stage_channels) if c < channels_last_below}
        # The between-conv kernels (module docstring); they apply only while the decoder's activations are fused
        # and its weights float32 (``between_fused``). Default: wherever they can run.
        if fuse_between_convs is None:
            fuse_between_convs = decoder.device.type == "cuda" and between_convs.available()
        self.fuse_between_convs = bool(fuse_between_convs)
        if channels_last_dtype not in (None, *CHANNELS_LAST_DTYPES):
            raise ValueError(f"channels_last_dtype must be float32 or float16; got {channels_last_dtype}")
        self._channels_last_dtype = channels_last_dtype
        # With the between-conv kernels: each residual add also writes the next unit's input half-snake.
        self.fuse_next_activation = bool(fuse_next_activation)
        # The rows' states into and out of each [state | new] buffer in one Triton kernel each way (state_copies).
        self._state_kernels = decoder.device.type == "cuda" and state_copies.available()
        self.fuse_state_copies = self._state_kernels if fuse_state_copies is None else bool(fuse_state_copies)
        self._padded: dict[int, int] = {
            id(m): padded_channels(m.weight.shape[1])
            for i in self.channels_last_layers
            for m in decoder.res_layers[i].modules()
            if isinstance(m, CausalConv)
        }
        # Forward order of the stateful layers; pool[i] is [slots + scratch, in_channels, context], or
        # [slots + scratch, context, padded channels] for a channels-last conv.
        self.layers: list[CausalConv | CausalUpsample] = [
            m for m in decoder.modules() if isinstance(m, CausalConv | CausalUpsample)
        ]
        self._index = {id(m): i for i, m in enumerate(self.layers)}
        rows = num_slots + scratch_rows
        self.pool = [self._new_state(m, rows) for m in self.layers]
        self._scratch = torch.arange(num_slots, rows, dtype=torch.int64, device=decoder.device)
        self._free = list(range(num_slots - 1, -1, -1))  # pop() hands out slot 0 first
        self._unzeroed: list[int] = []  # slots acquired since the last zeroing pass (zero_acquired)
        self.slot_of: dict[str, int] = {}
        self._weights_2d: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._spans: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}  # one step's, see _span
        self.refresh()

    def _new_state(self, module: CausalConv | CausalUpsample, rows: int) -> torch.Tensor:
        d = self.decoder
        if id(module) in self._padded:
            shape = (rows, self.context(module), self._padded[id(module)])
        else:
            shape = (rows, module.weight.shape[0 if isinstance(module, CausalUpsample) else 1], self.context(module))
        return torch.zeros(shape, dtype=d.dtype, device=d.device)

    @torch.no_grad()
    def refresh(self) -> None:
        """Rebuild the channels-last convs' padded 2-D weights from the decoder's; call after loading weights or
        changing the precision (the codec stage does, before capturing graphs)."""
        self._weights_2d.clear()
        dtype = self.channels_last_dtype
        for module in self.decoder.modules():
            if id(module) not in self._padded:
                continue
            out_channels, in_channels, kernel = module.weight.shape
            width = self._padded[id(module)]
            weight = module.weight.new_zeros(width, width, 1, kernel)
            weight[:out_channels, :in_channels, 0] = module.weight
            bias = module.bias.new_zeros(width)
            bias[:out_channels] = module.bias
            self._weights_2d[id(module)] = (weight.to(dtype).contiguous(memory_format=torch.channels_last), bias)
            # The states hold the conv's inputs, so they take its dtype (their contents start over: call before
            # streams start, as the codec stage does).
            index = self._index[id(module)]
            if self.pool[index].dtype != dtype:
                self.pool[index] = self.pool[index].to(dtype)

    @property
    def channels_last_dtype(self) -> torch.dtype:
        """The dtype of the channels-last convs' inputs, weights, states and outputs now. Half precision needs the
        between-conv kernels (they read and write it, computing in float32) and TF32 as the decoder's precision:
        float16 has TF32's 10-bit mantissa, and these convs run 2x faster in it without cuDNN's conversion of
        every input (docs/BENCHMARKS.md). Default (``channels_last_dtype=None``): float16 wherever that holds."""
        d = self.decoder
        if not (self.between_fused and d.precision == "tf32"):
            return d.dtype
        return torch.float16 if self._channels_last_dtype is None else self._channels_last_dtype

    @property
    def between_fused(self) -> bool:
        """Whether a step now runs the between-conv kernels: asked for, activations fused (the input conv's bias
        rides on the half-snake kernel), float32 weights and activations on CUDA."""
        d = self.decoder
        return (
            self.fuse_between_convs
            and d.fused_activations
            and d.device.type == "cuda"
            and d.dtype == torch.float32
            and d.pre_conv.weight.dtype == torch.float32
        )

    @property
    def state_copies_fused(self) -> bool:
        """Whether a step moves the states with :mod:`.state_copies`' kernels: asked for, on CUDA with Triton."""
        return self.fuse_state_copies and self._state_kernels

    @staticmethod
    def context(module: CausalConv | CausalUpsample) -> int:
        """Inputs a layer needs from before the chunk: ``(k-1)·d`` for a conv, one for a transposed conv."""
        return 1 if isinstance(module, CausalUpsample) else module.left_pad

    @property
    def state_bytes_per_slot(self) -> int:
        return sum(p[0].numel() * p.element_size() for p in self.pool)

    # -- slots ---------------------------------------------------------------------------------------
    @property
    def live(self) -> int:
        return len(self.slot_of)

    def acquire(self, request_id: str) -> int:
        """A slot for a new stream, zeroed (the one-shot decode's zero padding) before the next step reads it.

        The zeroing is deferred to :meth:`zero_acquired`, one pass for every slot acquired since the last step: the
        pool is ~100 tensors, and zeroing each per stream cost ~100 kernel launches per new stream (0.7-1 ms on an
        H200: 26 ms of a served 65-ms step of 36 first chunks, docs/BENCHMARKS.md fifteenth set).
        """
        if request_id in self.slot_of:
            raise ValueError(f"request {request_id!r} already holds slot {self.slot_of[request_id]}")
        if not self._free:
            raise SlotsExhaustedError(f"all {self.num_slots} codec state slots hold live streams")
        slot = self._free.pop()
        self._unzeroed.append(slot)
        self.slot_of[request_id] = slot
        return slot

    def zero_acquired(self) -> None:
        """Zero the state of every slot acquired since the last call: one ``index_fill_`` per pool tensor, however
        many slots. :meth:`step` and the graphs' replays call it first; never inside a graph capture (the slots
        would be baked into the graph)."""
        if not self._unzeroed:
            return
        slots = torch.tensor(self._unzeroed, dtype=torch.int64).to(self.decoder.device, non_blocking=True)
        for state in self.pool:
            state.index_fill_(0, slots, 0)
        self._unzeroed.clear()

    def release(self, request_id: str) -> bool:
        """Free a request's slot (finished, aborted, or broken); False when it held none."""
        slot = self.slot_of.pop(request_id, None)
        if slot is None:
            return False
        self._free.append(slot)
        return True

    def scratch_slots(self, rows: int) -> torch.Tensor:
        """Slot ids (on the device) for ``rows`` padded rows: distinct scratch slots no stream holds."""
        if rows > self.scratch_rows:
            raise ValueError(f"{rows} padded rows but only {self.scratch_rows} scratch slots")
        return self._scratch[:rows]

    # -- the decode ------------------------------------------------------------------------------------
    @torch.inference_mode()
    def step(
        self,
        codes: torch.Tensor,
        lengths: torch.Tensor,
        slots: torch.Tensor,
        on_section: Callable[[str], None] | None = None,
    ) -> torch.Tensor:
        """Decode the next frames of ``B`` streams and advance their states.

        codes: ``[B, T, G]`` int64 on the decoder's device, row ``b`` valid for its first ``lengths[b]`` frames.
        lengths: ``[B]`` int64 (device), 0..T. slots: ``[B]`` int64 (device), distinct.
        Returns ``[B, T·spf]`` audio; samples past ``lengths[b]·spf`` of a row are meaningless.
        ``on_section``: called with a section's name after each (pre-conv, up-sampler, residual layer, post-conv) is
        issued, for ``benchmarks/codec_layers.py``'s timings.
        """
        d = self.decoder
        mark = on_section or (lambda _: None)
        if self._unzeroed and not (d.device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
            self.zero_acquired()
        self._spans.clear()
        between = self.between_fused
        try:
            with cudnn_tf32(d.allow_tf32):
                x = self._conv(d.pre_conv, d.dequantize(codes).to(d.dtype), lengths, slots)
                mark("pre_conv")
                rate, at_rate = 1, lengths  # valid inputs per row at the current layer's rate: one tensor per rate
                for i, (act, up, res) in enumerate(
                    zip(d.activations, d.up_sample_conv_layers, d.res_layers, strict=True)
                ):
                    channels, channels_last = up.bias.shape[0], i in self.channels_last_layers
                    padded = padded_channels(channels) if channels_last else None
                    if between:
                        x = self._upsample_fused(up, act, x, at_rate, slots, padded)
                    else:
                        x = self._upsample(up, act, x, at_rate, slots)
                    rate, at_rate = rate * up.rate, at_rate * up.rate
                    mark(f"upsample {i} (x{up.rate}, {channels} ch)")
                    if between:
                        x = self._residual_layer_fused(res, x, at_rate, slots, channels, channels_last)
                    else:
                        if channels_last:
                            x = to_channels_last(x, padded)
                        x = self._residual_layer(res, x, at_rate, slots)
                        if channels_last:
                            x = x[..., :channels].transpose(1, 2).contiguous()
                    mark(f"residual layer {i} ({channels} ch, {rate} samples/frame)")
                x = self._conv(d.post_conv, x, at_rate, slots, d.post_activation)
                mark("post_conv")
        finally:
            self._spans.clear()
        return torch.clamp(x, -1.0, 1.0)[:, 0]

    def _span(self, lengths: torch.Tensor, context: int) -> torch.Tensor:
        """``[B, context]`` positions of each row's last ``context`` valid inputs in its joined buffer, made once per
        (rate, context) in a step: the 18 convs of a residual layer share 6 contexts, so 2 of each conv's ~9 kernels
        (in every graph replay) go."""
        key = (id(lengths), context)
        if key not in self._spans:
            # The entry keeps lengths alive, so its id names the same tensor until the step clears the cache.
            self._spans[key] = (lengths, lengths[:, None] + torch.arange(context, device=lengths.device))
        return self._spans[key][1]

    def _with_state(
        self,
        module: CausalConv | CausalUpsample,
        x: torch.Tensor,
        lengths: torch.Tensor,
        slots: torch.Tensor,
        act: HalfSnake | None = None,
        time_dim: int = 2,
        act_bias: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``[state | act(x + act_bias)]`` along ``time_dim``, after saving each row's last ``context`` valid inputs
        as its new state (``time_dim`` 2: ``[B, C, T]``; 1: channels-last ``[B, T, C]``). ``act_bias`` (with
        ``act``): the bias of the conv that produced ``x`` without it.

        The activation writes straight into the joined buffer (one fused kernel on CUDA), so the conv input is
        assembled without a ``cat`` of a separately materialised activation.
        """
        joined, new = self._joined(module, x, slots, time_dim)
        if act is None:
            new.copy_(x)
        elif time_dim == 2:
            act.write(x, new, act_bias)
        else:  # the activation works on [B, C, T] views
            act.write(x.transpose(1, 2), new.transpose(1, 2), act_bias)
        self._save_state(module, joined, lengths, slots, time_dim)
        return joined

    def _joined(
        self, module: CausalConv | CausalUpsample, x: torch.Tensor, slots: torch.Tensor, time_dim: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A new ``[state | new]`` buffer for ``module``'s input (``x``'s shape and the state's dtype) with the rows'
        states in place, and its ``new`` part for the caller to fill."""
        pool = self.pool[self._index[id(module)]]
        context = pool.shape[time_dim]
        shape = list(x.shape)
        shape[time_dim] += context
        joined = torch.empty(shape, dtype=pool.dtype, device=x.device)
        if self.state_copies_fused:
            state_copies.load_states(pool, slots, joined, time_dim)
        else:
            state_copies.load_states_torch(pool, slots, joined, time_dim)
        return joined, joined.narrow(time_dim, context, x.shape[time_dim])

    def _save_state(
        self,
        module: CausalConv | CausalUpsample,
        joined: torch.Tensor,
        lengths: torch.Tensor,
        slots: torch.Tensor,
        time_dim: int,
    ) -> None:
        """Each row's last ``context`` valid inputs of a filled ``joined`` buffer become its new state."""
        pool = self.pool[self._index[id(module)]]
        if self.state_copies_fused:
            state_copies.save_states(pool, slots, joined, lengths, time_dim)
        else:
            # Row b's valid inputs end at context + lengths[b]: its new state is joined[b, lengths[b] : +context].
            span = self._span(lengths, pool.shape[time_dim])
            state_copies.save_states_torch(pool, slots, joined, span, time_dim)

    def _conv(
        self,
        conv: CausalConv,
        x: torch.Tensor,
        lengths: torch.Tensor,
        slots: torch.Tensor,
        act: HalfSnake | None = None,
        with_bias: bool = True,
        act_bias: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``conv(act(x + act_bias))`` with the stream states: ``[B, C, T]`` in and out, or ``[B, T, C_padded]`` for a
        conv of a channels-last layer (one 2-D conv over the joined ``[B, T', C_padded]``); ``with_bias=False``
        leaves the conv's bias (:meth:`conv_bias`) to the caller."""
        time_dim = 1 if id(conv) in self._padded else 2
        return self._convolve(conv, self._with_state(conv, x, lengths, slots, act, time_dim, act_bias), with_bias)

    def _convolve(self, conv: CausalConv, joined: torch.Tensor, with_bias: bool = True) -> torch.Tensor:
        """The conv over a filled ``[state | new]`` buffer (:meth:`_with_state`'s), as :meth:`_conv` returns it."""
        if id(conv) not in self._padded:
            return conv.convolve(joined, with_bias)
        weight, bias = self._weights_2d[id(conv)]
        # [B, T', C] contiguous is [B, C, 1, T'] in channels-last: no copy on the way in or out.
        y = F.conv2d(
            joined.transpose(1, 2).unsqueeze(2).to(weight.dtype),
            weight,
            bias.to(weight.dtype) if with_bias else None,
            dilation=(1, conv.dilation),
        )
        y = y.squeeze(2).transpose(1, 2)
        # The between-conv kernels read a half-precision output as it is; eager ops get the activations' dtype.
        return y if self.between_fused else y.to(self.decoder.dtype)

    def conv_bias(self, conv: CausalConv) -> torch.Tensor:
        """A conv's bias as its output carries channels: padded for a channels-last conv."""
        return self._weights_2d[id(conv)][1] if id(conv) in self._padded else conv.bias

    def _upsample(
        self, up: CausalUpsample, act: HalfSnake, x: torch.Tensor, lengths: torch.Tensor, slots: torch.Tensor
    ) -> torch.Tensor:
        # With the previous input prepended, output r·(i+1) + j is the one-shot output r·i + j: drop r at each end.
        y = up.transpose(self._with_state(up, x, lengths, slots, act))
        return y[..., up.rate : up.rate * (x.shape[-1] + 1)]

    def _upsample_fused(
        self,
        up: CausalUpsample,
        act: HalfSnake,
        x: torch.Tensor,
        lengths: torch.Tensor,
        slots: torch.Tensor,
        padded: int | None,
    ) -> torch.Tensor:
        """:meth:`_upsample` in one kernel, out as the next layer takes it: ``[B, C, T·r]``, or channels-last
        ``[B, T·r, padded]`` (padding zero) when ``padded`` is given."""
        joined = self._with_state(up, x, lengths, slots, act)
        batch, steps = x.shape[0], x.shape[-1] * up.rate
        out = x.new_empty(batch, up.bias.shape[0], steps) if padded is None else x.new_empty(batch, steps, padded)
        return between_convs.upsample_into(joined, up.weight, up.bias, up.rate, out, channel_major=padded is None)

    def _residual_layer_fused(
        self,
        layer: ResidualLayer,
        x: torch.Tensor,
        lengths: torch.Tensor,
        slots: torch.Tensor,
        channels: int,
        channels_last: bool,
    ) -> torch.Tensor:
        """:meth:`_residual_layer` with every conv's bias, the residual adds and the branch mean in the
        between-conv kernels; ``x`` as :meth:`_upsample_fused` returns it, out channel-major ``[B, C, T]``."""
        channel_major = not channels_last
        time_dim = 2 if channel_major else 1
        branches = layer.res_blocks
        total = None
        for i, branch in enumerate(branches):
            y = x
            joined = None  # the unit's input conv's [state | act(y)], when the residual add before it wrote it
            for j, unit in enumerate(branch.res_blocks):
                if joined is None:
                    h = self._conv(unit.input_conv, y, lengths, slots, unit.input_activation, with_bias=False)
                else:
                    h = self._convolve(unit.input_conv, joined, with_bias=False)
                s = self._conv(
                    unit.skip_conv,
                    h,
                    lengths,
                    slots,
                    unit.skip_activation,
                    with_bias=False,
                    act_bias=self.conv_bias(unit.input_conv),
                )
                bias = self.conv_bias(unit.skip_conv)
                branch_end = j == len(branch.res_blocks) - 1
                if not (branch_end and i == len(branches) - 1):
                    # In place of the conv output, unless that is half precision: the residual stream stays float32.
                    out = s if s.dtype == y.dtype else torch.empty_like(y)
                    act, joined = None, None
                    if self.fuse_next_activation and not branch_end:
                        following = branch.res_blocks[j + 1]
                        joined, new = self._joined(following.input_conv, y, slots, time_dim)
                        snake = following.input_activation
                        act = between_convs.NextActivation(new, snake.alpha, snake.inv_alpha, LRELU_SLOPE)
                    y = between_convs.residual_into(y, s, bias, out, channel_major, activation=act)
                    if joined is not None:
                        self._save_state(following.input_conv, joined, lengths, slots, time_dim)
                    if branch_end:
                        total = y if total is None else total + y
                else:  # the layer's last unit: the branch mean, written channel-major without the padding
                    steps = y.shape[2] if channel_major else y.shape[1]
                    out = y.new_empty(y.shape[0], channels, steps)
                    between_convs.residual_into(
                        y,
                        s,
                        bias,
                        out if channel_major else out.transpose(1, 2),
                        channel_major,
                        total=total,  # None for a one-branch layer, whose mean is itself
                        divisor=len(branches),
                        channels=channels,
                    )
                    return out
        raise ValueError("a residual layer without units")

    def _residual_layer(
        self,
        layer: ResidualLayer,
        x: torch.Tensor,
        lengths: torch.Tensor,
        slots: torch.Tensor,
    ) -> torch.Tensor:
        """The layer's branches on ``x`` (``[B, C, T]``, or ``[B, T, C_padded]`` for a channels-last layer)."""
        total = None
        for branch in layer.res_blocks:
            y = x
            for unit in branch.res_blocks:
                h = self._conv(unit.input_conv, y, lengths, slots, unit.input_activation)
                y = y + self._conv(unit.skip_conv, h, lengths, slots, unit.skip_activation)
            total = y if total is None else total + y
        return total / len(layer.res_blocks)


def to_channels_last(x: torch.Tensor, padded: int) -> torch.Tensor:
    """``[B, C, T]`` → contiguous ``[B, T, padded]``, the channels past ``C`` zero."""
    out = x.new_empty(x.shape[0], x.shape[2], padded)
    out[..., x.shape[1] :].zero_()
    out[..., : x.shape[1]].copy_(x.transpose(1, 2))
    return out
