"""Every request's output tokens as one padded array per step, copying only what each request added since.

vLLM's penalties (``apply_all_penalties``) rebuild an ``[R, L]`` array of all output tokens from Python lists every
step and pin a fresh host tensor of a new shape: at 256 streams of 250 frames that was 12% of a served Stage-0
step on an H200 host (docs/BENCHMARKS.md, eighth set). A request's output list only grows, and vLLM hands the same
list object to the sampler every step, so each list keeps a numpy copy here that takes its new tail only. Under
async scheduling a list ends in ``-1`` placeholders that vLLM overwrites in place a step later: those are copied
for the step that shows them and read again the next time.
"""

from __future__ import annotations

import numpy as np


class OutputTokenArrays:
    """Per-list numpy copies, kept for the lists seen in the last call (a finished request's copy goes with it)."""

    def __init__(self) -> None:
        # id(list) -> (the list itself, so a reused id is never mistaken for it; its copy; how much is copied)
        self._copies: dict[int, tuple[list[int], np.ndarray, int]] = {}

    def padded(self, lists: list[list[int]], pad: int) -> np.ndarray:
        """``[len(lists), longest]`` int64, each row a list's tokens then ``pad``: what vLLM's padding builds."""
        longest = max(map(len, lists), default=0)
        out = np.full((len(lists), longest), pad, dtype=np.int64)
        copies: dict[int, tuple[list[int], np.ndarray, int]] = {}
        for row, tokens in enumerate(lists):
            size = len(tokens)
            entry = self._copies.get(id(tokens))
            if entry is None or entry[0] is not tokens or entry[2] > size:
                copy, done = np.empty(max(size, 16), dtype=np.int64), 0
            else:
                _, copy, done = entry
            if size > done:
                if size > len(copy):
                    grown = np.empty(max(2 * len(copy), size), dtype=np.int64)
                    grown[:done] = copy[:done]
                    copy = grown
                copy[done:size] = tokens[done:size]
                placeholders = np.flatnonzero(copy[done:size] < 0)
                kept = done + int(placeholders[0]) if placeholders.size else size
            else:
                kept = size
            copies[id(tokens)] = (tokens, copy, kept)
            out[row, :size] = copy[:size]
        self._copies = copies
        return out
