"""One torch-profiler window in every engine process of a server at once, opened by a file while it serves.

Held alone, Stage 0's sampled step keeps an H200 busy ~4.6 ms at batch 256 and the codec decodes ~15,000 new
frames/s, yet served with two Stage-0 engines the GPU is busy 83–94% at 6,300 frames/s (docs/BENCHMARKS.md,
thirteenth set): where the served GPU time goes can only be measured while serving, in every process at once.

With ``KANI_KERNEL_TRACE=DIR`` each Stage-0 and codec engine looks for ``DIR/start`` from its step (a ``stat`` at
most every ``POLL_S``). The first step after it appears starts torch's profiler (the GPU's activity on a GPU, the
CPU ops without one; no stacks or shapes: they distort host time; ``KANI_KERNEL_TRACE_HOST`` adds the host's ops or
its every Python call where a step's host time is the question); the first step ``KANI_KERNEL_TRACE_S`` seconds
later stops it and writes a Chrome trace to ``DIR/LABEL-PID.json``. So two Stage-0 replicas and the codec record
the same stretch of the same load, each in its own file. One window per process. ``benchmarks/kernel_share.py``
reads the traces.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import torch

from vllm_omni_kani.envs import kernel_trace_dir, kernel_trace_host, kernel_trace_seconds

logger = logging.getLogger(__name__)

TRIGGER = "start"
POLL_S = 0.1


class KernelTrace:
    """``tick()`` once per engine step; a no-op (one attribute test) unless ``KANI_KERNEL_TRACE`` names a folder."""

    def __init__(
        self,
        label: str,
        folder: str | None = None,
        seconds: float | None = None,
        cuda: bool | None = None,
        host: str | None = None,
    ) -> None:
        """``cuda``: whether this process's work runs on a CUDA device (default: whether one is present); ``host``:
        ``""``, ``"ops"`` or ``"python"`` (default ``KANI_KERNEL_TRACE_HOST``), what of the host a GPU window adds."""
        folder = kernel_trace_dir() if folder is None else folder
        self.folder = Path(folder) if folder else None
        self.seconds = kernel_trace_seconds() if seconds is None else seconds
        self.host = (kernel_trace_host(label) if self.folder else "") if host is None else host
        self.label = label
        self.cuda = torch.cuda.is_available() if cuda is None else cuda
        self.path: Path | None = None
        self._profiler: torch.profiler.profile | None = None
        self._until = 0.0
        self._next_poll = 0.0

    @property
    def pending(self) -> bool:
        """Whether a window is still to be opened or closed in this process."""
        return self.folder is not None and self.path is None

    def tick(self) -> None:
        if self.folder is None or self.path is not None:
            return
        now = time.monotonic()
        if self._profiler is not None:
            if now >= self._until:
                self._close()
            return
        if now < self._next_poll:
            return
        self._next_poll = now + POLL_S
        if (self.folder / TRIGGER).exists():
            self._open(now)

    def _open(self, now: float) -> None:
        # On a GPU only its activity (kernels, copies, the runtime calls) unless the host is asked for: CPU ops add
        # thousands of events a step and slow the step they describe. Without a GPU, the CPU ops are what there is.
        kinds = ["CUDA", "CPU"] if self.cuda and self.host else ["CUDA" if self.cuda else "CPU"]
        activities = [getattr(torch.profiler.ProfilerActivity, kind) for kind in kinds]
        # with_stack turns on torch's Python tracer: every Python call becomes an event of the trace.
        self._profiler = torch.profiler.profile(
            activities=activities, record_shapes=False, with_stack=self.host == "python"
        )
        self._profiler.start()
        self._until = now + self.seconds
        logger.info("Kani kernel trace: %s (pid %d) recording %.1f s", self.label, os.getpid(), self.seconds)

    def _close(self) -> None:
        assert self._profiler is not None
        self._profiler.stop()
        path = self.folder / f"{self.label}-{os.getpid()}.json"
        self._profiler.export_chrome_trace(str(path))
        self._profiler = None
        self.path = path
        logger.info("Kani kernel trace: %s wrote %s", self.label, path)
