"""Omni stage workers on vLLM's CPU worker.

vLLM-Omni's GPU workers refuse any device but cuda/musa and build on process-scoped NVML memory accounting and the
CuMem sleep pool, none of which exists on CPU. These workers are vLLM's ``CPUWorker`` (NUMA memory node, gloo,
KV sizing from node memory, OpenMP binding) plus Omni's worker mixin (Omni plugins in the worker process), with
Omni's model runners in place of vLLM's.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from typing import Any

import torch
import vllm.v1.worker.cpu_worker as cpu_worker_module
from vllm.v1.worker.cpu_worker import CPUWorker
from vllm_omni.diffusion.data import OmniACK
from vllm_omni.worker.mixins import OmniWorkerMixin

from vllm_omni_kani.platforms.cpu.model_runner import CPUARModelRunner, CPUGenerationModelRunner

logger = logging.getLogger(__name__)


@contextlib.contextmanager
def _runner_class(runner_cls: type) -> Iterator[None]:
    """Make ``CPUWorker.init_device`` build ``runner_cls`` instead of vLLM's ``CPUModelRunner``.

    ``init_device`` looks the class up in its module when it runs; swapping it there for the call builds one runner
    with everything vLLM sets up around it, instead of building vLLM's and throwing it away.
    """
    original = cpu_worker_module.CPUModelRunner
    cpu_worker_module.CPUModelRunner = runner_cls
    try:
        yield
    finally:
        cpu_worker_module.CPUModelRunner = original


class _CPUOmniWorker(OmniWorkerMixin, CPUWorker):
    runner_cls: type

    def init_device(self) -> None:
        # Omni's hooks exist only in the v1 runners (the v2 one is also never picked on CPU without Triton).
        self.use_v2_model_runner = False
        with _runner_class(self.runner_cls):
            super().init_device()
        logger.info(
            "stage %s worker: %d torch threads on CPUs %s",
            getattr(self.model_config, "stage_id", None),
            torch.get_num_threads(),
            sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else "?",
        )

    # The Omni sleep/wake RPCs (/v1/omni/sleep) release device memory through the CuMem pool; there is none on CPU.
    def handle_sleep_task(self, task: Any) -> OmniACK:
        return self._unsupported(task, "sleep")

    def handle_wake_task(self, task: Any) -> OmniACK:
        return self._unsupported(task, "wake-up")

    def _unsupported(self, task: Any, what: str) -> OmniACK:
        task_id = task.get("task_id") if isinstance(task, dict) else getattr(task, "task_id", "unknown")
        return OmniACK(
            task_id=str(task_id),
            status="ERROR",
            stage_id=getattr(self.model_config, "stage_id", None),
            rank=self.rank,
            error_msg=f"{what} is not supported on the CPU platform",
        )


class CPUARWorker(_CPUOmniWorker):
    """Worker of an autoregressive Omni stage on CPU."""

    runner_cls = CPUARModelRunner


class CPUGenerationWorker(_CPUOmniWorker):
    """Worker of a non-autoregressive (generation) Omni stage on CPU."""

    runner_cls = CPUGenerationModelRunner
