"""Sample-rate conversion that gives the same samples streamed in chunks as all at once.

The NanoCodec decoder speaks 22,050 Hz; clients may ask for another rate (and Opus only
accepts 8/12/16/24/48 kHz). ``torchaudio.functional.resample`` is a polyphase FIR: output
block ``b`` (``new`` samples) reads input ``[b*orig - width, (b+1)*orig + width)`` with
``orig/new`` the reduced ratio. A stream therefore emits a block once its right context has
arrived and recomputes a little left context per chunk; ``flush`` zero-pads the end exactly
as the one-shot call does.
"""

from __future__ import annotations

import math

import torch
import torchaudio.functional as AF

# An empty tensor made once: every stream's starting buffer (only ever replaced, never written) and a passthrough
# stream's flush (its callers only read it), so a stream at the codec's own rate makes no tensor at all.
_EMPTY = torch.zeros(0)

# torchaudio's defaults (lowpass_filter_width=6, rolloff=0.99), restated to size the context.
_LOWPASS_WIDTH = 6
_ROLLOFF = 0.99


def resample(audio: torch.Tensor, orig_sr: int, new_sr: int) -> torch.Tensor:
    """One-shot resampling of 1-D float audio."""
    if orig_sr == new_sr or audio.numel() == 0:
        return audio
    return AF.resample(audio.float(), orig_sr, new_sr)


class StreamingResampler:
    """Resample 1-D float audio arriving in pieces; output equals :func:`resample` of the whole."""

    def __init__(self, orig_sr: int, new_sr: int):
        g = math.gcd(orig_sr, new_sr)
        self.orig_sr, self.new_sr = orig_sr, new_sr
        self._orig, self._new = orig_sr // g, new_sr // g
        # Filter half-width in input samples, as torchaudio computes it.
        self._width = math.ceil(_LOWPASS_WIDTH * self._orig / (min(self._orig, self._new) * _ROLLOFF))
        self._context_blocks = math.ceil(self._width / self._orig)
        self._buf = _EMPTY
        self._buf_start = 0  # absolute input index of _buf[0], a multiple of _orig
        self._total_in = 0
        self._next_block = 0  # first output block not emitted yet

    @property
    def passthrough(self) -> bool:
        return self.orig_sr == self.new_sr

    def push(self, audio: torch.Tensor) -> torch.Tensor:
        """Add input samples; return every output sample that is now final."""
        if self.passthrough:
            return audio
        self._buf = torch.cat([self._buf, audio.detach().float().cpu().reshape(-1)])
        self._total_in += audio.numel()
        ready = (self._total_in - self._width) // self._orig  # blocks whose right context has arrived
        return self._emit(ready, final=False)

    def flush(self) -> torch.Tensor:
        """Emit the remaining output (the stream has ended)."""
        if self.passthrough:
            return _EMPTY
        total_out = math.ceil(self._new * self._total_in / self._orig)
        return self._emit(math.ceil(total_out / self._new), final=True)

    def _emit(self, end_block: int, final: bool) -> torch.Tensor:
        if end_block <= self._next_block:
            return torch.zeros(0)
        first = max(0, self._next_block - self._context_blocks)
        offset = first * self._orig - self._buf_start
        segment = self._buf[offset:]
        out = AF.resample(segment, self.orig_sr, self.new_sr)
        lo = (self._next_block - first) * self._new
        hi = (end_block - first) * self._new
        if final:
            hi = math.ceil(self._new * self._total_in / self._orig) - first * self._new
        piece = out[lo:hi]
        self._next_block = end_block
        # Drop input no later block will read.
        keep_from = max(0, self._next_block - self._context_blocks) * self._orig
        if keep_from > self._buf_start:
            self._buf = self._buf[keep_from - self._buf_start :]
            self._buf_start = keep_from
        return piece
