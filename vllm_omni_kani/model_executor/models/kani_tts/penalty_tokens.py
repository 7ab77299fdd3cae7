"""vLLM's padded output-token tensor for the penalties, built from each request's new tokens only.

Every sampled step with a repetition, frequency or presence penalty (Kani's default has a repetition penalty), vLLM
turns every request's whole output-token list into a padded ``[R, longest]`` array and pins it
(``penalties._convert_to_tensors``): at 256 streams of 250 frames that was 11.8% of a served Stage-0 step's
main-thread samples, and it grows with the length of the requests (docs/BENCHMARKS.md, "Eleventh set").

``OutputTokenRows`` keeps each request's tokens in a row of one host array across steps and copies only what is new
(and the last few tokens again, which vLLM may still rewrite: async scheduling's placeholders), then gathers the
step's rows in one indexing operation. A request is recognised by its live output list (vLLM appends to the same
list every step); the row keeps a reference to that list, so a list is never mistaken for another one at the same
address. Rows not seen in a step are freed. The result is the same array vLLM builds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

# Tokens at the end of a list copied again every step: vLLM writes async scheduling's -1 placeholders (and
# speculative tokens) there first and the sampled tokens later.
REWRITABLE_TAIL = 8
_MIN_ROWS, _MIN_WIDTH = 64, 256


@dataclass
class _Row:
    source: list[int]
    slot: int
    filled: int = 0


class OutputTokenRows:
    """Padded output-token arrays for a sequence of steps, copying each list's new tokens once."""

    def __init__(self) -> None:
        self._tokens = np.zeros((_MIN_ROWS, _MIN_WIDTH), dtype=np.int64)
        self._rows: dict[int, _Row] = {}
        self._free: list[int] = list(range(_MIN_ROWS - 1, -1, -1))

    def padded(self, lists: list[list[int]], pad: int) -> np.ndarray:
        """``[len(lists), longest]`` int64: row i holds ``lists[i]``, then ``pad``."""
        lengths = np.fromiter(map(len, lists), dtype=np.int64, count=len(lists))
        width = int(lengths.max()) if len(lists) else 0
        self._reserve(len(lists), width)
        seen: dict[int, _Row] = {}
        slots = np.empty(len(lists), dtype=np.int64)
        for i, source in enumerate(lists):
            row = self._rows.pop(id(source), None) or seen.get(id(source))
            if row is None or row.source is not source:
                if row is not None and id(source) not in seen:
                    self._free.append(row.slot)
                row = _Row(source, self._free.pop())
            length = int(lengths[i])
            # A list that got shorter (a rewind) is copied whole again.
            start = max(row.filled - REWRITABLE_TAIL, 0) if length >= row.filled else 0
            if length > start:
                self._tokens[row.slot, start:length] = source[start:length]
            row.filled = length
            seen[id(source)] = row
            slots[i] = row.slot
        self._free.extend(row.slot for row in self._rows.values())
        self._rows = seen
        out = self._tokens[slots, :width]
        out[np.arange(width) >= lengths[:, None]] = pad
        return out

    def _reserve(self, rows: int, width: int) -> None:
        """Room for ``rows`` new rows beside the kept ones, each ``width`` long."""
        capacity, room = self._tokens.shape
        needed = len(self._rows) + rows
        if needed <= capacity and width <= room:
            return
        new_capacity, new_room = max(capacity, 2 * needed), max(room, 2 * width)
        tokens = np.zeros((new_capacity, new_room), dtype=np.int64)
        tokens[:capacity, :room] = self._tokens
        self._tokens = tokens
        self._free.extend(range(new_capacity - 1, capacity - 1, -1))


def convert_to_tensors_with(rows: OutputTokenRows):
    """A stand-in for vLLM's ``penalties._convert_to_tensors`` (same values, same device) fed by ``rows``."""

    def _convert_to_tensors(output_token_ids: list[list[int]], vocab_size: int, device: torch.device) -> torch.Tensor:
        # vocab_size pads, as in vLLM: no token has that id. From pageable memory CUDA stages the copy before the
        # call returns, without waiting for the device; vLLM pinned a new tensor every step instead.
        padded = torch.from_numpy(rows.padded(output_token_ids, pad=vocab_size))
        return padded.to(device, non_blocking=True)

    return _convert_to_tensors
