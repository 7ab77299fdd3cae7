"""The penalties' output-token counts kept on the device across steps, fed with each request's new tokens only.

Kani's default sampling has a repetition penalty, so every sampled step vLLM turns every request's whole output list
into a padded ``[R, longest]`` host array, pins it, copies it and bin-counts it on the device
(``penalties.apply_all_penalties``): host work that grows with requests x length and was 15.8% of a served Stage-0
step's main-thread samples at 256 streams (docs/BENCHMARKS.md, "Eleventh set").

``OutputTokenCounts`` keeps a row of counts per live request on the device (``[rows, vocab]`` int32) and sends only
what is new since the previous step: one small host array, one copy, one scatter-add, one row gather. The counts
equal vLLM's bin counts of the same lists, so the penalised logits are vLLM's.

A request is recognised by its live output list (vLLM appends to the same list object every step); the row holds a
reference to the list, so its address is never another list's while the row lives. Rows of lists absent from a step
are freed at that step. vLLM may rewrite the end of a list (async scheduling's -1 placeholders get their tokens, a
step's tokens are trimmed): the last ``REWRITABLE_TAIL`` counted tokens are compared every step and a row whose tail
changed, or that got shorter, is counted again from zero. Placeholders are not counted (vLLM pads them out).
Installed by a Kani Stage-0 process (``patch.apply_stage0_sampling``) unless ``KANI_STAGE0_SAMPLER_PATCHES=0``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from vllm_omni_kani import sampler_ab
from vllm_omni_kani.model_executor.models.kani_tts.pinned_staging import PinnedStaging

# Counted tokens at the end of a list checked again every step: vLLM writes placeholders and trims there.
NAME = "penalty_counts"  # its name in KANI_STAGE0_SAMPLER_PATCHES and KANI_SAMPLER_AB_PATCHES
REWRITABLE_TAIL = 8
PLACEHOLDER = -1
_MIN_ROWS = 64

ApplyPenalties = Callable[[torch.Tensor, Any, list[list[int]]], torch.Tensor]


@dataclass
class _Row:
    source: list[int]
    slot: int
    counted: int = 0
    tail: list[int] = field(default_factory=list)


class OutputTokenCounts:
    """Per-request output-token counts on ``device``, updated from each list's new tokens."""

    def __init__(self, vocab_size: int, device: torch.device | str, rows: int = _MIN_ROWS) -> None:
        self.vocab_size = vocab_size
        self.device = torch.device(device)
        self._counts = torch.zeros((rows, vocab_size), dtype=torch.int32, device=self.device)
        self._ones = torch.ones(1024, dtype=torch.int32, device=self.device)
        self._rows: dict[int, _Row] = {}
        self._free = list(range(rows - 1, -1, -1))
        self._staging = PinnedStaging()

    @property
    def rows_held(self) -> int:
        return len(self._rows)

    def gather(self, lists: list[list[int]]) -> tuple[torch.Tensor, bool]:
        """``([len(lists), vocab] int32, exact)``: row i counts each token of ``lists[i]``, placeholders excluded.

        ``exact`` is False when a list holds a real token after a placeholder (vLLM never writes one): the counts
        then stop at the placeholder, and the caller should take vLLM's own path for this step."""
        live = {id(source) for source in lists}
        for key in [key for key in self._rows if key not in live]:
            self._free.append(self._rows.pop(key).slot)
        self._reserve(len(live) - len(self._rows))
        slots = np.empty(len(lists), dtype=np.int64)
        clear: list[int] = []
        flat: list[int] = []
        exact = True
        vocab = self.vocab_size
        for i, source in enumerate(lists):
            row = self._rows.get(id(source))
            if row is None:
                row = self._rows[id(source)] = _Row(source, self._free.pop())
                clear.append(row.slot)
            elif len(source) < row.counted or source[row.counted - len(row.tail) : row.counted] != row.tail:
                clear.append(row.slot)
                row.counted, row.tail = 0, []
            if len(source) > row.counted:
                new = source[row.counted :]
                if PLACEHOLDER in new:
                    cut = new.index(PLACEHOLDER)
                    exact = exact and all(token == PLACEHOLDER for token in new[cut:])
                    new = new[:cut]
                if new:
                    base = row.slot * vocab
                    flat.extend([base + token for token in new])
                    row.counted += len(new)
                    row.tail = source[max(row.counted - REWRITABLE_TAIL, 0) : row.counted]
            slots[i] = row.slot
        return self._update(slots, clear, flat), exact

    def _update(self, slots: np.ndarray, clear: list[int], flat: list[int]) -> torch.Tensor:
        """Clear the ``clear`` rows, add one to each ``flat`` index, and gather the ``slots`` rows: one copy."""
        packed = np.concatenate([slots, np.asarray(clear, dtype=np.int64), np.asarray(flat, dtype=np.int64)])
        on_device = self._staging.to_device(packed, self.device)
        n, z = len(slots), len(clear)
        if z:
            self._counts.index_fill_(0, on_device[n : n + z], 0)
        if flat:
            if self._ones.numel() < len(flat):
                self._ones = torch.ones(2 * len(flat), dtype=torch.int32, device=self.device)
            self._counts.view(-1).index_add_(0, on_device[n + z :], self._ones[: len(flat)])
        return self._counts.index_select(0, on_device[:n])

    def _reserve(self, new_rows: int) -> None:
        """Room for ``new_rows`` more rows beside the held ones."""
        capacity = self._counts.shape[0]
        needed = len(self._rows) + new_rows
        if needed <= capacity:
            return
        grown = max(2 * capacity, needed)
        counts = torch.zeros((grown, self.vocab_size), dtype=torch.int32, device=self.device)
        counts[:capacity] = self._counts
        self._counts = counts
        self._free.extend(range(grown - 1, capacity - 1, -1))


def penalise(
    logits: torch.Tensor,
    prompt_token_ids: torch.Tensor,
    output_counts: torch.Tensor,
    presence: torch.Tensor,
    frequency: torch.Tensor,
    repetition: torch.Tensor,
) -> torch.Tensor:
    """vLLM's penalties (OpenAI's presence and frequency, and the repetition penalty over prompt and output) given
    the output tokens as counts; in place on ``logits`` ``[R, vocab]``."""
    from vllm._custom_ops import apply_repetition_penalties
    from vllm.model_executor.layers.utils import get_token_bin_counts_and_mask

    rows, vocab = logits.shape
    _, prompt_mask = get_token_bin_counts_and_mask(prompt_token_ids, vocab, rows)
    output_mask = output_counts > 0
    apply_repetition_penalties(logits, prompt_mask, output_mask, repetition)
    logits -= frequency.unsqueeze(dim=1) * output_counts
    logits -= presence.unsqueeze(dim=1) * output_mask
    return logits


def with_counted_penalties(original: ApplyPenalties) -> ApplyPenalties:
    """A stand-in for vLLM's ``Sampler.apply_penalties`` that reads the output tokens from ``OutputTokenCounts``."""
    stores: dict[tuple[int, torch.device], OutputTokenCounts] = {}

    def apply_penalties(logits: torch.Tensor, sampling_metadata: Any, output_token_ids: list[list[int]]) -> Any:
        if sampling_metadata.no_penalties or not sampler_ab.patched_now(NAME):
            return original(logits, sampling_metadata, output_token_ids)
        key = (logits.shape[1], logits.device)
        store = stores.get(key) or stores.setdefault(key, OutputTokenCounts(*key))
        counts, exact = store.gather(output_token_ids)
        if not exact:
            return original(logits, sampling_metadata, output_token_ids)
        m = sampling_metadata
        return penalise(
            logits, m.prompt_token_ids, counts, m.presence_penalties, m.frequency_penalties, m.repetition_penalties
        )

    apply_penalties.__wrapped__ = original  # type: ignore[attr-defined]
    return apply_penalties
