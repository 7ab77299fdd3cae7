"""Turning Stage-0 output into codec chunks: pure functions and per-request state.

No engine types here, so every rule is testable on plain lists. The wiring into
vLLM-Omni's async_chunk producer lives in ``kani_tts.py``.

A chunk is a window ``[left context | new frames]`` of ``[F, 4]`` codes: Stage 1 decodes the
window and keeps only the audio of the new frames. With at least the decoder's receptive
field of left context, streamed audio equals a single decode of all frames. With a stateful
codec (``codec_stateful_decode``) Stage 1 keeps each stream's causal state itself, so chunks
carry no context: only their new frames and their sequence number.

With ``codec_chunk_lead_ms`` set, a later chunk also goes out early, with the frames pending (at least half its
size), once a listener who started playing when the stream's first chunk left would run out of the audio sent so far
within that lead: the fixed sizes assume Stage 0 steps faster than the audio plays by a margin, and under load it may
not.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vllm_omni_kani.model_executor.models.kani_tts import token_layout as tl
from vllm_omni_kani.model_executor.models.kani_tts.configuration import FRAME_RATE

# The NanoCodec decoder looks 27.4 frames back; 28 makes chunked audio equal to one decode.
DEFAULT_LEFT_CONTEXT_FRAMES = 28
DEFAULT_INITIAL_CHUNK_FRAMES = 3
DEFAULT_CHUNK_FRAMES = 16
# Seconds of audio one frame plays for: the pace a listener consumes a stream at.
FRAME_SECONDS = 1.0 / FRAME_RATE
LEAD_KEY = "codec_chunk_lead_ms"


@dataclass(frozen=True)
class ChunkPolicy:
    """How many frames each chunk carries; every field is a deploy-YAML connector knob.

    Chunk 0 carries ``initial_chunk_frames``; chunk ``k >= 1`` carries
    ``min(chunk_frames * 2**(k-1), max_chunk_frames)`` (a ramp: 16, 32, 64, ...). With
    ``max_chunk_frames == chunk_frames`` (the default) every later chunk is ``chunk_frames``.
    """

    initial_chunk_frames: int = DEFAULT_INITIAL_CHUNK_FRAMES
    chunk_frames: int = DEFAULT_CHUNK_FRAMES
    left_context_frames: int = DEFAULT_LEFT_CONTEXT_FRAMES
    # None: no ramp (every chunk after the first is chunk_frames).
    max_chunk_frames: int | None = None
    # Stage 1 keeps every stream's decoder state: windows carry no left context.
    stateful: bool = False
    # Paced chunks (``codec_chunk_lead_ms``, in seconds here); None: only the sizes above decide.
    lead_s: float | None = None

    def __post_init__(self) -> None:
        if self.initial_chunk_frames <= 0 or self.chunk_frames <= 0 or self.left_context_frames < 0:
            raise ValueError(
                f"invalid codec chunking: initial_codec_chunk_frames={self.initial_chunk_frames}, "
                f"codec_chunk_frames={self.chunk_frames} (both must be > 0), "
                f"codec_left_context_frames={self.left_context_frames} (must be >= 0)"
            )
        if self.max_chunk_frames is not None and self.max_chunk_frames < self.chunk_frames:
            raise ValueError(
                f"invalid codec chunking: max_codec_chunk_frames={self.max_chunk_frames} must be >= "
                f"codec_chunk_frames={self.chunk_frames} (leave it out for no ramp)"
            )
        if self.lead_s is not None and not self.lead_s >= 0:
            raise ValueError(f"invalid codec chunking: {LEAD_KEY} must be >= 0, got {self.lead_s * 1000!r}")

    @classmethod
    def from_extra(cls, extra: Mapping[str, Any]) -> ChunkPolicy:
        """Read ``codec_chunk_frames`` / ``initial_codec_chunk_frames`` / ``codec_left_context_frames`` /
        ``max_codec_chunk_frames`` (default: ``codec_chunk_frames``, no ramp) / ``codec_stateful_decode`` /
        ``codec_chunk_lead_ms`` (default: none, no paced chunks)."""
        ramp_max = extra.get("max_codec_chunk_frames")
        stateful = extra.get("codec_stateful_decode", False)
        if not isinstance(stateful, bool):
            raise ValueError(f"invalid codec chunking: codec_stateful_decode must be true or false, got {stateful!r}")
        lead_ms = extra.get(LEAD_KEY)
        if lead_ms is not None and (isinstance(lead_ms, bool) or not isinstance(lead_ms, int | float)):
            raise ValueError(f"invalid codec chunking: {LEAD_KEY} must be a number of milliseconds, got {lead_ms!r}")
        return cls(
            initial_chunk_frames=int(extra.get("initial_codec_chunk_frames", DEFAULT_INITIAL_CHUNK_FRAMES)),
            chunk_frames=int(extra.get("codec_chunk_frames", DEFAULT_CHUNK_FRAMES)),
            left_context_frames=int(extra.get("codec_left_context_frames", DEFAULT_LEFT_CONTEXT_FRAMES)),
            max_chunk_frames=None if ramp_max is None else int(ramp_max),
            stateful=stateful,
            lead_s=None if lead_ms is None else lead_ms / 1000.0,
        )

    @property
    def ramp_max(self) -> int:
        """``max_chunk_frames`` as set, else ``chunk_frames`` (no ramp)."""
        return self.chunk_frames if self.max_chunk_frames is None else self.max_chunk_frames

    def chunk_size(self, index: int) -> int:
        """New frames of chunk ``index`` (0 = the first chunk)."""
        if index <= 0:
            return self.initial_chunk_frames
        size = self.chunk_frames
        for _ in range(index - 1):
            if size >= self.ramp_max:
                break
            size *= 2
        return min(size, self.ramp_max)

    def ramp_sizes(self) -> list[int]:
        """The distinct sizes of chunks 1, 2, ...: ``chunk_frames`` doubling up to ``max_chunk_frames``."""
        sizes = [self.chunk_frames]
        while sizes[-1] < self.ramp_max:
            sizes.append(min(sizes[-1] * 2, self.ramp_max))
        return sizes

    @property
    def window_context_frames(self) -> int:
        """Left context a window carries once the stream has that many frames (0 with a stateful codec)."""
        return 0 if self.stateful else self.left_context_frames

    def recurring_windows(self) -> list[int]:
        """Window lengths (context + new frames) every long stream sends: the first chunk, and
        ``window_context_frames + size`` for each ramp size once the context is full. The codec's CUDA
        graphs capture these exactly so the common windows replay unpadded."""
        return sorted({self.initial_chunk_frames, *(self.window_context_frames + n for n in self.ramp_sizes())})


@dataclass
class Chunk:
    window: np.ndarray  # [left + new, 4] int64 codes
    left_context: int  # frames at the start of ``window`` that were already decoded
    finished: bool  # the last chunk of the request
    index: int = 0  # 0 for a stream's first chunk, then 1, 2, ...
    paced: bool = False  # sent before its size was reached, to keep ahead of a listener (``codec_chunk_lead_ms``)

    @property
    def new_frames(self) -> int:
        return int(self.window.shape[0]) - self.left_context


@dataclass
class FrameStream:
    """One request's frames so far and how many of them were already sent as new audio."""

    variant: str
    # one int per frame (token_layout.pack_frame), unpacked only when a window is sent
    frames: list[int] = field(default_factory=list)
    sent: int = 0
    chunks: int = 0
    # When the first chunk went out (the caller's clock, seconds): a listener's playback starts about then.
    first_sent_at: float | None = None
    # parallel: codebooks 2-4 packed as the model sends them (token_layout.pack_codes), one per kept step
    code_rows: list[int] = field(default_factory=list)
    tokens_paired: int = 0
    # flattened: the incremental token grouper and how many output tokens it consumed
    assembler: tl.FlatFrameAssembler = field(default_factory=tl.FlatFrameAssembler)
    tokens_seen: int = 0
    done: bool = False

    def add_step_codes(self, step_codes: Sequence[int] | None) -> None:
        """Parallel: keep the codes of a step whose sampled token vLLM kept.

        ``step_codes`` ``[n_tokens]`` is the step's packed per-token payload for this request;
        only its last entry can belong to a sampled token, and -1 marks "no token this step".
        """
        if not step_codes:
            return
        last = int(step_codes[-1])
        if last != tl.NO_CODES:
            self.code_rows.append(last)

    def add_tokens(self, output_token_ids: Sequence[int]) -> None:
        """Consume the request's output tokens seen so far (append-only, may run ahead)."""
        if self.variant == "parallel":
            upto = min(len(output_token_ids), len(self.code_rows))
            for k in range(self.tokens_paired, upto):
                tok = int(output_token_ids[k])
                if tok == tl.END_OF_SPEECH:
                    self.done = True
                if not self.done and tl.AUDIO_TOKEN_OFFSET <= tok < tl.AUDIO_TOKEN_OFFSET + tl.CODEBOOK_SIZE:
                    self.frames.append((tok - tl.AUDIO_TOKEN_OFFSET) | (self.code_rows[k] << tl.CODE_BITS))
            self.tokens_paired = max(self.tokens_paired, upto)
        else:
            new = [int(t) for t in output_token_ids[self.tokens_seen :]]
            self.tokens_seen += len(new)
            self.frames.extend(tl.pack_frame(frame) for frame in self.assembler.feed(new))
            self.done = self.assembler.ended

    def unpaired_rows(self, output_token_ids: Sequence[int]) -> int:
        """Parallel, once the request finished: code rows minus output tokens (0 when every sampled token got its
        codebooks 2-4; negative: frames without their codes were dropped; positive: codes of tokens not kept)."""
        return len(self.code_rows) - len(output_token_ids) if self.variant == "parallel" else 0

    def behind(self, policy: ChunkPolicy, now: float | None) -> bool:
        """Paced chunks: would a listener who started when the first chunk went out run out of the audio sent so far
        within ``policy.lead_s`` of ``now``?"""
        if policy.lead_s is None or self.first_sent_at is None or now is None:
            return False
        return now >= self.first_sent_at + self.sent * FRAME_SECONDS - policy.lead_s

    def next_chunk(self, policy: ChunkPolicy, finished: bool, now: float | None = None) -> Chunk | None:
        """The next window to decode, or None until enough new frames exist.

        The first chunk is small (``initial_chunk_frames``) for a fast first sound, later ones
        ``chunk_frames``, doubling up to ``max_chunk_frames`` when a ramp is set; when the request
        is finished every remaining frame goes out. ``now`` (seconds, any one clock per stream) paces later chunks
        when ``policy.lead_s`` is set: every pending frame goes out once the stream is ``behind`` and at least half
        the chunk's size is pending.
        """
        pending = len(self.frames) - self.sent
        target = policy.chunk_size(self.chunks)
        if pending <= 0:
            return None
        # A paced chunk carries at least half its size: a stream Stage 0 makes slower than it plays would otherwise
        # go out a frame a chunk, each a codec row, and the listener stalls either way.
        paced = False
        if not finished and pending < target:
            paced = pending >= -(-target // 2) and self.behind(policy, now)
            if not paced:
                return None
        end = len(self.frames) if finished or paced else self.sent + target * (pending // target)
        left = min(policy.window_context_frames, self.sent)
        window = tl.unpack_frames(self.frames[self.sent - left : end])
        self.sent = end
        if self.chunks == 0:
            self.first_sent_at = now
        self.chunks += 1
        return Chunk(
            window=window,
            left_context=left,
            finished=finished and end == len(self.frames),
            index=self.chunks - 1,
            paced=paced,
        )


def frames_from_parallel_output(token_ids: Sequence[int], packed_codes: np.ndarray) -> np.ndarray:
    """Whole-request frames for the parallel layout (non-streaming path).

    ``packed_codes`` ``[n]`` is the request's per-token payload over all steps; the entries
    that are not -1 belong, in order, to the output tokens.
    """
    packed = np.asarray(packed_codes, dtype=np.int64).reshape(-1)
    stream = FrameStream("parallel")
    for code in packed[packed != tl.NO_CODES].tolist():
        stream.add_step_codes([code])
    stream.add_tokens(token_ids)
    return tl.unpack_frames(stream.frames)
