"""vLLM's padded output-token tensor for the penalties, built from each request's new tokens only.

Every sampled step with a repetition, frequency or presence penalty (Kani's default has a repetition penalty), vLLM
turns every request's whole output-token list into a padded ``[R, longest]`` array and pins it
(``penalties._convert_to_tensors``): at 256 streams of 250 frames that was 11.8% of a served Stage-0 step's
main-thread samples, and it grows with the length of the requests (docs/BENCHMARKS.md, "Eleventh set").

``OutputTokenRows`` keeps each request's tokens in a row of one host array across steps and copies only what is new
(and the last few tokens again, which vLLM may still rewrite: async scheduling's placeholders), then gathers the
step's rows in one indexing operation. A request is recognised by its live output list (vLLM appends to the same
list every step); the row keeps a reference to that list, so a list is never mistaken for another one at the same
address. Rows not seen in a step are freed. The result is the same array vLLM builds. Experimental, off unless
``KANI_STAGE0_SAMPLER_PATCHES`` is on (``patch.apply_stage0_sampling``).
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


class PinnedStaging:
    """Host-to-device copies through a ring of pinned buffers that live across steps.

    A copy from pageable memory waits for the stream to reach it (it stages through the driver's buffer), which
    cost the step its overlap with the forward pass; pinning a new tensor every step, as vLLM does, cost 4.8% of a
    served step's main-thread samples. A buffer is reused ``slots`` copies later, after its copy's event.
    """

    def __init__(self, slots: int = 4) -> None:
        self._buffers: list[torch.Tensor | None] = [None] * slots
        self._events: list[torch.cuda.Event | None] = [None] * slots
        self._next = 0

    def to_device(self, array: np.ndarray, device: torch.device) -> torch.Tensor:
        if device.type != "cuda":
            return torch.from_numpy(array).to(device)
        i, self._next = self._next, (self._next + 1) % len(self._buffers)
        buffer, event = self._buffers[i], self._events[i]
        if buffer is None or buffer.numel() < array.size:
            size = max(array.size, 2 * (0 if buffer is None else buffer.numel()), 1)
            buffer = self._buffers[i] = torch.empty(size, dtype=torch.from_numpy(array[:0]).dtype, pin_memory=True)
        elif event is not None:
            event.synchronize()  # the copy out of this buffer, several steps ago
        host = buffer[: array.size].view(array.shape)
        host.numpy()[...] = array
        out = host.to(device, non_blocking=True)
        event = self._events[i] = torch.cuda.Event()
        event.record()
        return out


def convert_to_tensors_with(rows: OutputTokenRows, staging: PinnedStaging | None = None):
    """A stand-in for vLLM's ``penalties._convert_to_tensors`` (same values, same device) fed by ``rows``."""
    staging = staging or PinnedStaging()

    def _convert_to_tensors(output_token_ids: list[list[int]], vocab_size: int, device: torch.device) -> torch.Tensor:
        # vocab_size pads, as in vLLM: no token has that id.
        return staging.to_device(rows.padded(output_token_ids, pad=vocab_size), torch.device(device))

    return _convert_to_tensors
