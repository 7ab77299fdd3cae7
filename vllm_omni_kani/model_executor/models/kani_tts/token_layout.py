"""The Kani token layout: special ids, audio-code offsets and frame packing.

This is the only module that spells the layout's numbers; everything else imports them.
A Kani vocabulary is the text tokenizer (``TOKENISER_LENGTH`` ids) followed by ten
control ids and then the audio codes. Parallel-head checkpoints put only codebook 1 in
the vocabulary (the other three come from extra heads); flattened checkpoints put all four
codebooks there, frame-major, so one audio frame costs four decode steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

TOKENISER_LENGTH = 64400
START_OF_TEXT = 1
END_OF_TEXT = 2
START_OF_SPEECH = TOKENISER_LENGTH + 1
END_OF_SPEECH = TOKENISER_LENGTH + 2
START_OF_HUMAN = TOKENISER_LENGTH + 3
END_OF_HUMAN = TOKENISER_LENGTH + 4
START_OF_AI = TOKENISER_LENGTH + 5
END_OF_AI = TOKENISER_LENGTH + 6
PAD = TOKENISER_LENGTH + 7
NUM_CONTROL_TOKENS = 10
AUDIO_TOKEN_OFFSET = TOKENISER_LENGTH + NUM_CONTROL_TOKENS

NUM_CODEBOOKS = 4
CODEBOOK_SIZE = 4032

# Parallel-head vocabulary: text + control + codebook 1 (68,442 ids).
PARALLEL_VOCAB_SIZE = AUDIO_TOKEN_OFFSET + CODEBOOK_SIZE
# Flattened vocabulary: text + control + 4 codebooks + one trailing id (80,539), as Kani ships it.
FLATTENED_VOCAB_SIZE = AUDIO_TOKEN_OFFSET + NUM_CODEBOOKS * CODEBOOK_SIZE + 1

# Names the tokenizer gives the control ids (index = id - TOKENISER_LENGTH).
CONTROL_TOKEN_NAMES = (
    "<|kani_reserved_0|>",
    "<|start_of_speech|>",
    "<|end_of_speech|>",
    "<|start_of_human|>",
    "<|end_of_human|>",
    "<|start_of_ai|>",
    "<|end_of_ai|>",
    "<|kani_pad|>",
    "<|kani_reserved_1|>",
    "<|kani_reserved_2|>",
)

# What a prompt ends with: the model would generate these two deterministically, so they are
# prefilled and the first decode step already emits audio.
SPEECH_PREFIX = (START_OF_AI, START_OF_SPEECH)


def build_prompt(text_ids_with_bos: Sequence[int], *, prefill_speech_start: bool = True) -> list[int]:
    """Wrap tokenized text (BOS already included) into a Kani prompt.

    ``[SOH] text [EOT] [EOH]`` and, by default, ``[SOA] [SOS]`` so that decoding starts in speech.
    """
    ids = [START_OF_HUMAN, *text_ids_with_bos, END_OF_TEXT, END_OF_HUMAN]
    if prefill_speech_start:
        ids.extend(SPEECH_PREFIX)
    return ids


def speaker_text(text: str, speaker: str | None, language: str | None = None) -> str:
    """Kani selects a voice by prefixing the text with ``"{speaker}: "`` and a language (Kani-TTS-2
    checkpoints with language tags) with ``"{tag}: "``; with both, the language tag comes first."""
    text = f"{speaker.strip()}: {text}" if speaker else text
    return f"{language.strip()}: {text}" if language else text


def text_ids(tokenizer: Any, text: str) -> list[int]:
    """``tokenizer(text, add_special_tokens=True)["input_ids"]``, from the Rust tokenizer directly where there is one.

    The API server tokenizes each request on its event loop. transformers' ``__call__`` wraps one text in a batch of
    one, whose Rust ``encode_batch`` gives up the GIL and waits to take it back from the server's other threads:
    0.4 ms a request on a two-GPU server at 512 streams (docs/BENCHMARKS.md, thirty-ninth set's profile), 0.13 ms
    against 0.02 ms for ``encode`` beside a busy thread on a CPU. The ids are the same (``tests/test_token_layout.py``
    checks them against ``__call__``); a tokenizer without a Rust backend, or one told to split special tokens, goes
    through ``__call__``.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    splits = getattr(tokenizer, "split_special_tokens", False) or getattr(backend, "encode_special_tokens", False)
    if backend is not None and not splits:
        return backend.encode(text, add_special_tokens=True).ids
    return list(tokenizer(text, add_special_tokens=True)["input_ids"])


def text_prompt_ids(tokenizer: Any, text: str, speaker: str | None, language: str | None = None) -> list[int]:
    """Tokenize ``"{speaker}: {text}"`` (BOS included) and wrap it in the Kani prompt."""
    ids = text_ids(tokenizer, speaker_text(text, speaker, language))
    if not ids or ids[0] != START_OF_TEXT:
        ids = [START_OF_TEXT, *ids]
    return build_prompt(ids)


# Kani-TTS-2 inserts a speaker embedding as the prompt's second row (after START_OF_HUMAN). Under vLLM that
# row is this id; the model replaces its embedding with the projected speaker embedding. It is a reserved
# control id, so the grammar never lets the model emit it.
SPEAKER_EMBEDDING_SLOT = TOKENISER_LENGTH + 8
# Key of the vector in the request's additional_information (vLLM-Omni's per-request payload).
SPEAKER_EMBEDDING_KEY = "speaker_embedding"


def with_speaker_slot(prompt_ids: Sequence[int]) -> list[int]:
    """``[SOH, ...]`` → ``[SOH, SPEAKER_EMBEDDING_SLOT, ...]``: the row a speaker embedding goes into."""
    if not prompt_ids or prompt_ids[0] != START_OF_HUMAN:
        raise ValueError("a Kani prompt starts with START_OF_HUMAN")
    return [prompt_ids[0], SPEAKER_EMBEDDING_SLOT, *prompt_ids[1:]]


def cb1_token(code: int | np.ndarray) -> int | np.ndarray:
    """Vocabulary id of a codebook-1 code (parallel-head and flattened layouts agree here)."""
    return code + AUDIO_TOKEN_OFFSET


def flat_token(code: int | np.ndarray, codebook: int | np.ndarray) -> int | np.ndarray:
    """Vocabulary id of ``code`` in ``codebook`` (0-based) in the flattened layout."""
    return AUDIO_TOKEN_OFFSET + code + CODEBOOK_SIZE * codebook


def is_cb1_token(token_ids: np.ndarray) -> np.ndarray:
    """Whether each id is a codebook-1 audio code (the parallel layout's sampled audio token)."""
    return (token_ids >= AUDIO_TOKEN_OFFSET) & (token_ids < AUDIO_TOKEN_OFFSET + CODEBOOK_SIZE)


# Codebooks 2-4 of one frame packed into one int64 (12 bits each), -1 when a row has none:
# a 1-D per-token payload concatenates cleanly across steps in vLLM-Omni's output accumulation.
CODE_BITS = 12
CODE_MASK = (1 << CODE_BITS) - 1
NO_CODES = -1
# Key of the per-token packed codes in vLLM-Omni's multimodal output payload (nested; flat: "codes.audio").
CODES_KEY = ("codes", "audio")


def pack_codes(codes: torch.Tensor) -> torch.Tensor:
    """``[..., NUM_CODEBOOKS - 1]`` codes → ``[...]`` int64."""
    codes = codes.long()
    return codes[..., 0] | (codes[..., 1] << CODE_BITS) | (codes[..., 2] << (2 * CODE_BITS))


def pack_frame(frame: Sequence[int]) -> int:
    """A frame's ``NUM_CODEBOOKS`` codes as one int (codebook k at bits ``k * CODE_BITS``).

    Stage 0's producer keeps every stream's frames as such ints: a list of ints holds no object the garbage
    collector has to walk, where a list per frame made 64k of them at 256 streams of 250 frames.
    """
    value = 0
    for k, code in enumerate(frame):
        value |= int(code) << (k * CODE_BITS)
    return value


def unpack_frames(packed: np.ndarray | Sequence[int]) -> np.ndarray:
    """``[n]`` packed frames (``pack_frame``, or a cb1 code ORed with ``pack_codes`` shifted by ``CODE_BITS``) →
    ``[n, NUM_CODEBOOKS]`` int64 codes."""
    packed = np.asarray(packed, dtype=np.int64).reshape(-1, 1)
    return (packed >> (np.arange(NUM_CODEBOOKS, dtype=np.int64) * CODE_BITS)) & CODE_MASK


def flat_codebook_range(codebook: int) -> tuple[int, int]:
    """Half-open id range of one codebook in the flattened layout."""
    start = AUDIO_TOKEN_OFFSET + CODEBOOK_SIZE * codebook
    return start, start + CODEBOOK_SIZE


@dataclass
class FlatFrames:
    """Frames recovered from a flattened token stream."""

    frames: np.ndarray  # [T, NUM_CODEBOOKS] int64 codes in 0..CODEBOOK_SIZE-1
    dropped_partial: int  # codes of an incomplete trailing frame that were discarded
    ended: bool  # END_OF_SPEECH was seen
    invalid: int  # audio codes discarded because they broke the codebook order


class FlatFrameAssembler:
    """Incremental token → frame grouping for the flattened layout (one per request).

    Speech starts after START_OF_SPEECH (or at the first audio token if the stream has
    none) and ends at END_OF_SPEECH; non-audio tokens are skipped. Frame ``j`` must be
    codebooks 0, 1, 2, 3 in order: a code in the wrong slot discards the frame being built
    (and the code itself, unless it is a codebook-0 code, which starts a new frame).
    """

    def __init__(self) -> None:
        self._partial: list[int] = []
        self.ended = False
        self.invalid = 0

    def feed(self, token_ids: Sequence[int]) -> list[list[int]]:
        """Consume new tokens; return the frames they complete, in order."""
        done: list[list[int]] = []
        for tok in token_ids:
            if self.ended:
                break
            if tok == START_OF_SPEECH:
                self.invalid += len(self._partial)
                self._partial = []
            elif tok == END_OF_SPEECH:
                self.ended = True
            elif AUDIO_TOKEN_OFFSET <= tok < AUDIO_TOKEN_OFFSET + NUM_CODEBOOKS * CODEBOOK_SIZE:
                slot, code = divmod(tok - AUDIO_TOKEN_OFFSET, CODEBOOK_SIZE)
                if slot != len(self._partial):
                    self.invalid += len(self._partial) + (slot != 0)
                    self._partial = []
                    if slot != 0:
                        continue
                self._partial.append(code)
                if len(self._partial) == NUM_CODEBOOKS:
                    done.append(self._partial)
                    self._partial = []
        return done

    @property
    def pending(self) -> int:
        """Codes of the frame being built (dropped if the stream ends now)."""
        return len(self._partial)


def frames_from_flat_tokens(token_ids: Sequence[int] | np.ndarray) -> FlatFrames:
    """Group a whole flattened Kani token stream into frames (see :class:`FlatFrameAssembler`).

    An incomplete last frame (END_OF_SPEECH or the length limit in mid-frame) is dropped
    and reported rather than padded.
    """
    asm = FlatFrameAssembler()
    frames = asm.feed([int(t) for t in token_ids])
    return FlatFrames(
        frames=np.asarray(frames, dtype=np.int64).reshape(-1, NUM_CODEBOOKS),
        dropped_partial=asm.pending,
        ended=asm.ended,
        invalid=asm.invalid,
    )


def flat_tokens_from_frames(frames: np.ndarray) -> np.ndarray:
    """Inverse of :func:`frames_from_flat_tokens` for whole frames: ``[T, 4]`` → ``[4T]`` ids."""
    frames = np.asarray(frames, dtype=np.int64)
    return flat_token(frames, np.arange(NUM_CODEBOOKS)).reshape(-1)
