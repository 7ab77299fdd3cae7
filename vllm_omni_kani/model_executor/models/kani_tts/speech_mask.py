"""Which ids codebook 1 may take next, as a function of the previous token.

A Kani sequence has a fixed grammar: after END_OF_HUMAN comes START_OF_AI, then
START_OF_SPEECH, then audio codes until END_OF_SPEECH. In the flattened layout the codes
also cycle through the four codebooks. Every rule depends only on the last token, so the
mask for a batch is a table lookup — no per-request state, no host synchronisation, and the
same rule is shared by the vLLM models and the transformers reference.
"""

from __future__ import annotations

from enum import IntEnum

import torch

from vllm_omni_kani.model_executor.models.kani_tts import token_layout as tl


class Phase(IntEnum):
    """What the next token must be. ``SPEECH_K`` = an audio code of codebook K (or END_OF_SPEECH)."""

    AFTER_HUMAN = 0
    AFTER_AI = 1
    SPEECH_0 = 2
    SPEECH_1 = 3
    SPEECH_2 = 4
    SPEECH_3 = 5


NUM_PHASES = len(Phase)


def phase_of_token_table(vocab_size: int, variant: str) -> torch.Tensor:
    """``[vocab]`` int64: the phase that follows each id.

    Parallel checkpoints only ever emit codebook 1 through the vocabulary, so every speech
    phase is ``SPEECH_0``. Ids that are not part of the grammar (text, other controls) are
    treated as "speech starts now", which makes a prompt that already ends in
    START_OF_SPEECH and one that ends in any text token behave the same.
    """
    table = torch.full((vocab_size,), Phase.SPEECH_0, dtype=torch.long)
    table[tl.END_OF_HUMAN] = Phase.AFTER_HUMAN
    table[tl.START_OF_AI] = Phase.AFTER_AI
    if variant == "flattened":
        for k in range(tl.NUM_CODEBOOKS):
            lo, hi = tl.flat_codebook_range(k)
            table[lo:hi] = Phase.SPEECH_0 + (k + 1) % tl.NUM_CODEBOOKS
    return table


def allowed_table(vocab_size: int, variant: str) -> torch.Tensor:
    """``[NUM_PHASES, vocab]`` bool: the ids each phase allows."""
    allowed = torch.zeros((NUM_PHASES, vocab_size), dtype=torch.bool)
    allowed[Phase.AFTER_HUMAN, tl.START_OF_AI] = True
    allowed[Phase.AFTER_AI, tl.START_OF_SPEECH] = True
    for k in range(tl.NUM_CODEBOOKS):
        phase = Phase.SPEECH_0 + k
        if variant == "flattened":
            lo, hi = tl.flat_codebook_range(k)
        else:
            lo, hi = tl.AUDIO_TOKEN_OFFSET, tl.AUDIO_TOKEN_OFFSET + tl.CODEBOOK_SIZE
        allowed[phase, lo:hi] = True
        # END_OF_SPEECH may come at any slot; a flattened stream that ends mid-frame
        # loses only the partial frame (see token_layout.frames_from_flat_tokens).
        allowed[phase, tl.END_OF_SPEECH] = True
    return allowed


def no_text_mask(vocab_size: int) -> torch.Tensor:
    """``[vocab]`` bool: the union of every phase (used when the previous token is unknown)."""
    return allowed_table(vocab_size, "flattened").any(dim=0) | allowed_table(vocab_size, "parallel").any(dim=0)


class SpeechMask(torch.nn.Module):
    """Batched lookup of the allowed ids, kept on the model's device as buffers."""

    def __init__(self, vocab_size: int, variant: str):
        super().__init__()
        self.register_buffer("phase_of_token", phase_of_token_table(vocab_size, variant), persistent=False)
        self.register_buffer("allowed", allowed_table(vocab_size, variant), persistent=False)
        self.register_buffer("fallback", no_text_mask(vocab_size), persistent=False)
        # Every id a masked row can keep is at or after this column, whatever its phase (the sampler's open columns).
        self.first_open = int(torch.nonzero(self.allowed.any(dim=0) | self.fallback).min())

    def phases(self, last_tokens: torch.Tensor) -> torch.Tensor:
        """Phase per row for ``last_tokens`` ``[N]`` (any integer dtype)."""
        return self.phase_of_token[last_tokens.long()]

    def apply(self, logits: torch.Tensor, phases: torch.Tensor | None) -> torch.Tensor:
        """Mask ``logits`` ``[R, V]`` in place; ``phases`` ``[R]`` or None when unknown."""
        vocab = self.allowed.shape[1]
        allowed = self.fallback.expand(logits.shape[0], vocab) if phases is None else self.allowed[phases]
        logits[:, :vocab].masked_fill_(~allowed, float("-inf"))
        return logits
