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

import numpy as np

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


def speaker_text(text: str, speaker: str | None) -> str:
    """Kani selects a voice by prefixing the text with ``"{speaker}: "``."""
    return f"{speaker}: {text}" if speaker else text


def cb1_token(code: int | np.ndarray) -> int | np.ndarray:
    """Vocabulary id of a codebook-1 code (parallel-head and flattened layouts agree here)."""
    return code + AUDIO_TOKEN_OFFSET


def flat_token(code: int | np.ndarray, codebook: int | np.ndarray) -> int | np.ndarray:
    """Vocabulary id of ``code`` in ``codebook`` (0-based) in the flattened layout."""
    return AUDIO_TOKEN_OFFSET + code + CODEBOOK_SIZE * codebook


def is_cb1_token(token_ids: np.ndarray) -> np.ndarray:
    return (token_ids >= AUDIO_TOKEN_OFFSET) & (token_ids < AUDIO_TOKEN_OFFSET + CODEBOOK_SIZE)


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
    invalid: int  # audio-range tokens in the wrong codebook slot (frame discarded)


def frames_from_flat_tokens(token_ids: Sequence[int] | np.ndarray) -> FlatFrames:
    """Group a flattened Kani token stream into frames.

    Only tokens after START_OF_SPEECH (or all tokens, if it is absent) and before
    END_OF_SPEECH count; non-audio tokens are skipped. Token ``j`` of the speech must belong
    to codebook ``j % 4``; a frame with a token in the wrong slot is discarded and counted.
    An incomplete last frame (END_OF_SPEECH or the length limit in mid-frame) is dropped
    and reported rather than padded.
    """
    ids = np.asarray(token_ids, dtype=np.int64)
    sos = np.flatnonzero(ids == START_OF_SPEECH)
    if sos.size:
        ids = ids[sos[0] + 1 :]
    eos = np.flatnonzero(ids == END_OF_SPEECH)
    ended = bool(eos.size)
    if ended:
        ids = ids[: eos[0]]
    lo, hi = AUDIO_TOKEN_OFFSET, AUDIO_TOKEN_OFFSET + NUM_CODEBOOKS * CODEBOOK_SIZE
    audio = ids[(ids >= lo) & (ids < hi)] - AUDIO_TOKEN_OFFSET
    n_full = audio.size // NUM_CODEBOOKS
    grid = audio[: n_full * NUM_CODEBOOKS].reshape(n_full, NUM_CODEBOOKS)
    slot = grid // CODEBOOK_SIZE
    ok = (slot == np.arange(NUM_CODEBOOKS)).all(axis=1)
    frames = (grid % CODEBOOK_SIZE)[ok]
    return FlatFrames(
        frames=frames.astype(np.int64),
        dropped_partial=int(audio.size - n_full * NUM_CODEBOOKS),
        ended=ended,
        invalid=int((~ok).sum()),
    )


def flat_tokens_from_frames(frames: np.ndarray) -> np.ndarray:
    """Inverse of :func:`frames_from_flat_tokens` for whole frames: ``[T, 4]`` → ``[4T]`` ids."""
    frames = np.asarray(frames, dtype=np.int64)
    return flat_token(frames, np.arange(NUM_CODEBOOKS)).reshape(-1)
