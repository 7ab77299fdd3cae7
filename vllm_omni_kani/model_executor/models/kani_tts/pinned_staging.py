"""Small host-to-device copies through a ring of pinned buffers that live across steps.

A copy from pageable memory waits for the stream to reach it (it stages through the driver's buffer), which costs a
step its overlap with the forward pass; pinning a new tensor every step, as vLLM's penalties do, cost 4.8% of a
served Stage-0 step's main-thread samples (docs/BENCHMARKS.md, "Eleventh set").
"""

from __future__ import annotations

import numpy as np
import torch


class PinnedStaging:
    """Copies arrays to a device through ``slots`` pinned buffers; a buffer is reused ``slots`` copies later, after
    its copy's event (no host sync in the steady state)."""

    def __init__(self, slots: int = 4) -> None:
        self._buffers: list[torch.Tensor | None] = [None] * slots
        self._events: list[torch.cuda.Event | None] = [None] * slots
        self._next = 0

    def to_device(self, array: np.ndarray, device: torch.device) -> torch.Tensor:
        """``array`` on ``device`` (stream-ordered on CUDA: use it on the current stream)."""
        if device.type != "cuda":
            return torch.from_numpy(array).to(device)
        i, self._next = self._next, (self._next + 1) % len(self._buffers)
        buffer, event = self._buffers[i], self._events[i]
        if buffer is None or buffer.numel() < array.size or buffer.dtype != torch.from_numpy(array[:0]).dtype:
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
