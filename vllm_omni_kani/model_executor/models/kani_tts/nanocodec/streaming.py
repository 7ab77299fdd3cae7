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
"""

from __future__ import annotations

import torch

from vllm_omni_kani.model_executor.models.kani_tts.nanocodec.decoder import (
    CausalConv,
    CausalUpsample,
    HalfSnake,
    NanoCodecDecoder,
    ResidualLayer,
    cudnn_tf32,
)


class SlotsExhaustedError(RuntimeError):
    """Every state slot holds a live stream."""


class StreamingCodec:
    """Per-request causal state of a :class:`NanoCodecDecoder` in a pool of ``num_slots`` slots.

    ``scratch_rows`` extra slots absorb the state writes of padded batch rows (one per row, so no two
    rows of a step write the same slot). Which request holds which slot is host-side, keyed by request id.
    """

    def __init__(self, decoder: NanoCodecDecoder, num_slots: int, scratch_rows: int = 64) -> None:
        if num_slots < 1 or scratch_rows < 1:
            raise ValueError(f"num_slots ({num_slots}) and scratch_rows ({scratch_rows}) must be positive")
        self.decoder = decoder
        self.num_slots = num_slots
        self.scratch_rows = scratch_rows
        # Forward order of the stateful layers; pool[i] is [slots + scratch, in_channels, context].
        self.layers: list[CausalConv | CausalUpsample] = [
            m for m in decoder.modules() if isinstance(m, CausalConv | CausalUpsample)
        ]
        self._index = {id(m): i for i, m in enumerate(self.layers)}
        rows = num_slots + scratch_rows
        self.pool = [
            torch.zeros(
                rows,
                m.weight.shape[0 if isinstance(m, CausalUpsample) else 1],
                self.context(m),
                dtype=decoder.dtype,
                device=decoder.device,
            )
            for m in self.layers
        ]
        self._scratch = torch.arange(num_slots, rows, dtype=torch.int64, device=decoder.device)
        self._free = list(range(num_slots - 1, -1, -1))  # pop() hands out slot 0 first
        self.slot_of: dict[str, int] = {}

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
        """A zeroed slot for a new stream (its state is the one-shot decode's zero padding)."""
        if request_id in self.slot_of:
            raise ValueError(f"request {request_id!r} already holds slot {self.slot_of[request_id]}")
        if not self._free:
            raise SlotsExhaustedError(f"all {self.num_slots} codec state slots hold live streams")
        slot = self._free.pop()
        for state in self.pool:
            state[slot].zero_()
        self.slot_of[request_id] = slot
        return slot

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
    def step(self, codes: torch.Tensor, lengths: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        """Decode the next frames of ``B`` streams and advance their states.

        codes: ``[B, T, G]`` int64 on the decoder's device, row ``b`` valid for its first ``lengths[b]`` frames.
        lengths: ``[B]`` int64 (device), 0..T. slots: ``[B]`` int64 (device), distinct.
        Returns ``[B, T·spf]`` audio; samples past ``lengths[b]·spf`` of a row are meaningless.
        """
        d = self.decoder
        with cudnn_tf32(d.allow_tf32):
            x = self._conv(d.pre_conv, d.dequantize(codes).to(d.dtype), lengths, slots)
            rate = 1
            for act, up, res in zip(d.activations, d.up_sample_conv_layers, d.res_layers, strict=True):
                x = self._upsample(up, act, x, lengths * rate, slots)
                rate *= up.rate
                x = self._residual_layer(res, x, lengths * rate, slots)
            x = self._conv(d.post_conv, x, lengths * rate, slots, d.post_activation)
        return torch.clamp(x, -1.0, 1.0)[:, 0]

    def _with_state(
        self,
        module: CausalConv | CausalUpsample,
        x: torch.Tensor,
        lengths: torch.Tensor,
        slots: torch.Tensor,
        act: HalfSnake | None = None,
    ) -> torch.Tensor:
        """``[state | act(x)]``, after saving each row's last ``context`` valid inputs as its new state.

        The activation writes straight into the joined buffer (one fused kernel on CUDA), so the conv input is
        assembled without a ``cat`` of a separately materialised activation.
        """
        pool = self.pool[self._index[id(module)]]
        context = pool.shape[-1]
        joined = x.new_empty(x.shape[0], x.shape[1], context + x.shape[-1])
        joined[..., :context].copy_(pool.index_select(0, slots))
        if act is None:
            joined[..., context:].copy_(x)
        else:
            act.write(x, joined[..., context:])
        # Row b's valid inputs end at context + lengths[b]: its new state is joined[b, :, lengths[b] : +context].
        take = (lengths[:, None] + torch.arange(context, device=x.device))[:, None, :].expand(-1, x.shape[1], -1)
        pool.index_copy_(0, slots, torch.gather(joined, 2, take))
        return joined

    def _conv(
        self,
        conv: CausalConv,
        x: torch.Tensor,
        lengths: torch.Tensor,
        slots: torch.Tensor,
        act: HalfSnake | None = None,
    ) -> torch.Tensor:
        return conv.convolve(self._with_state(conv, x, lengths, slots, act))

    def _upsample(
        self, up: CausalUpsample, act: HalfSnake, x: torch.Tensor, lengths: torch.Tensor, slots: torch.Tensor
    ) -> torch.Tensor:
        # With the previous input prepended, output r·(i+1) + j is the one-shot output r·i + j: drop r at each end.
        y = up.transpose(self._with_state(up, x, lengths, slots, act))
        return y[..., up.rate : up.rate * (x.shape[-1] + 1)]

    def _residual_layer(
        self, layer: ResidualLayer, x: torch.Tensor, lengths: torch.Tensor, slots: torch.Tensor
    ) -> torch.Tensor:
        total = None
        for branch in layer.res_blocks:
            y = x
            for unit in branch.res_blocks:
                h = self._conv(unit.input_conv, y, lengths, slots, unit.input_activation)
                y = y + self._conv(unit.skip_conv, h, lengths, slots, unit.skip_activation)
            total = y if total is None else total + y
        return total / len(layer.res_blocks)
