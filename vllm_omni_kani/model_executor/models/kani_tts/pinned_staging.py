"""Copies through pinned host memory that never wait for the device: small host-to-device copies through a ring of
pinned buffers that live across steps, and a step's device output into new pinned memory (``to_host_in_stream_order``).

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


def to_host_in_stream_order(values: torch.Tensor) -> torch.Tensor:
    """``values`` in new pinned host memory, copied without waiting for the device.

    A ``.cpu()`` / ``.to("cpu")`` waits for the step's kernels; under async scheduling that wait is the only one
    between two steps. For a caller whose host tensor is read only after a later wait on the same stream: Stage 0's
    codes are read after the step's sampled tokens reach the host (the sync runner waits for those before building
    outputs, the async one before the scheduler sees the step, and those copies are queued after this one; not for
    vLLM-Omni's deferred output building, which clones host tensors at once), the codec's audio after vLLM's
    ``AsyncGPUModelRunnerOutput.get_output()`` syncs its copy stream, which waits for this one.
    """
    host = torch.empty(values.shape, dtype=values.dtype, pin_memory=True)
    host.copy_(values, non_blocking=True)
    return host
