"""Stage 1's stateful streams: which request holds which state slot, chunk order, and batching by length.

A stream's chunks must decode whole and in order, since each advances the stream's decoder state: the
producer numbers them (``meta.chunk_seq``) and a chunk out of order is refused loudly, never decoded into
wrong audio. Chunks longer than ``max_piece_frames`` decode as consecutive pieces (exact: the state carries
over), which bounds activation memory. Within a step, rows are grouped by length bucket, so a 3-frame first
chunk never pads to a 64-frame one.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from vllm_omni_kani.model_executor.models.kani_tts.nanocodec.graphs import StreamingGraphs, round_up
from vllm_omni_kani.model_executor.models.kani_tts.nanocodec.streaming import SlotsExhaustedError, StreamingCodec

logger = logging.getLogger(__name__)


@dataclass
class StreamChunk:
    """One request's chunk of new frames in a step."""

    request_id: str
    frames: torch.Tensor  # [F, G] int64 codes on the CPU, new frames only
    seq: int  # 0 for the stream's first chunk
    finished: bool  # the stream's last chunk: its slot is freed after the decode


class CodecStreams:
    """Decodes chunks of many streams per step on a :class:`StreamingCodec`, CUDA graphs where captured."""

    def __init__(self, codec: StreamingCodec, max_piece_frames: int, graphs: StreamingGraphs | None = None) -> None:
        if max_piece_frames < 1:
            raise ValueError(f"max_piece_frames must be positive, got {max_piece_frames}")
        self.codec = codec
        self.graphs = graphs
        self.max_piece_frames = max_piece_frames
        self.next_seq: dict[str, int] = {}

    @property
    def live(self) -> int:
        return self.codec.live

    def release(self, request_ids: Iterable[str]) -> None:
        """Free the slots of requests that finished or were aborted (unknown ids are ignored)."""
        for rid in request_ids:
            self.codec.release(rid)
            self.next_seq.pop(rid, None)

    def _admit(self, chunk: StreamChunk) -> bool:
        """Whether ``chunk`` is the next one of its stream (acquiring a slot for a first chunk)."""
        expected = self.next_seq.get(chunk.request_id)
        if expected is None:
            if chunk.seq != 0:
                logger.error("Kani codec: request %s starts at chunk %d, not 0; no audio", chunk.request_id, chunk.seq)
                return False
            try:
                self.codec.acquire(chunk.request_id)
            except SlotsExhaustedError as exc:
                logger.error(
                    "Kani codec: request %s gets no audio: %s (raise codec_state_slots)", chunk.request_id, exc
                )
                return False
        elif chunk.seq != expected:
            logger.error(
                "Kani codec: request %s sent chunk %d where %d was due; its stream ends here",
                chunk.request_id,
                chunk.seq,
                expected,
            )
            self.release([chunk.request_id])
            return False
        self.next_seq[chunk.request_id] = chunk.seq + 1
        return True

    def _bucket(self, frames: int) -> int:
        """Rows sharing a bucket decode in one call: the graph's frame bucket, else the exact length."""
        if self.graphs is not None and self.graphs.max_frames is not None:
            return round_up(frames, self.graphs.frame_buckets) or frames
        return frames

    @torch.inference_mode()
    def decode(self, chunks: Sequence[StreamChunk]) -> list[torch.Tensor | None]:
        """Audio of every chunk (``F·spf`` float samples on the device), None for a refused chunk."""
        admitted = [i for i, c in enumerate(chunks) if self._admit(c)]
        pieces: dict[int, list[torch.Tensor]] = defaultdict(list)
        step = self.max_piece_frames
        rounds = max((-(-int(chunks[i].frames.shape[0]) // step) for i in admitted), default=0)
        for k in range(rounds):
            groups: dict[int, list[tuple[int, torch.Tensor]]] = defaultdict(list)
            for i in admitted:
                piece = chunks[i].frames[k * step : (k + 1) * step]
                if piece.shape[0]:
                    groups[self._bucket(int(piece.shape[0]))].append((i, piece))
            for frames, rows in groups.items():
                for i, audio in zip((i for i, _ in rows), self._run(frames, rows, chunks), strict=True):
                    pieces[i].append(audio)
        out: list[torch.Tensor | None] = [None] * len(chunks)
        for i in admitted:
            out[i] = torch.cat(pieces[i]) if len(pieces[i]) != 1 else pieces[i][0]
        self.release(c.request_id for c in chunks if c.finished)
        return out

    def _run(
        self, frames: int, rows: list[tuple[int, torch.Tensor]], chunks: Sequence[StreamChunk]
    ) -> list[torch.Tensor]:
        """One batched step of ``rows`` (right-padded to ``frames``); one transfer in, views of one output."""
        codec = self.codec
        batch = torch.zeros(len(rows), frames, codec.decoder.config.num_codebooks, dtype=torch.int64)
        lengths = torch.empty(len(rows), dtype=torch.int64)
        slots = torch.empty(len(rows), dtype=torch.int64)
        for row, (i, piece) in enumerate(rows):
            batch[row, : piece.shape[0]] = piece
            lengths[row] = piece.shape[0]
            slots[row] = codec.slot_of[chunks[i].request_id]
        device = codec.decoder.device
        args = tuple(t.to(device, non_blocking=True) for t in (batch, lengths, slots))
        audio = self.graphs(*args) if self.graphs is not None else codec.step(*args)
        spf = codec.decoder.samples_per_frame
        return [audio[row, : int(piece.shape[0]) * spf] for row, (_, piece) in enumerate(rows)]
