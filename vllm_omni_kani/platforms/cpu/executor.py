"""Per-stage environment for a stage's worker processes on CPU.

Each stage's engine core starts its own ``MultiprocExecutor``, and vLLM's CPU thread binding
(``VLLM_CPU_OMP_THREADS_BIND``, ``OMP_NUM_THREADS``…) is computed from the environment at that moment, the same for
every stage. With two stages on a small machine that means both model workers bind to the same cores. A deploy
YAML's per-stage ``env:`` block would be the place to say otherwise, but vLLM-Omni 0.26.0 parses it and never applies
it. This executor applies a stage's ``additional_config.kani_stage_env`` (an ordinary engine argument, so it reaches
the stage's own ``VllmConfig``) while the stage's workers are spawned, so vLLM's own binding code sees it.

Select it with ``distributed_executor_backend: vllm_omni_kani.platforms.cpu.executor.CPUStageExecutor`` in the
deploy YAML. Nothing here is CUDA-specific, but only the CPU deploy YAMLs name it.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator, Mapping
from typing import Any

from vllm.v1.executor.multiproc_executor import MultiprocExecutor

logger = logging.getLogger(__name__)

STAGE_ENV_KEY = "kani_stage_env"


def stage_env(vllm_config: Any) -> dict[str, str]:
    """The ``additional_config.kani_stage_env`` mapping of one stage's config, values as strings."""
    extra = getattr(vllm_config, "additional_config", None)
    raw = extra.get(STAGE_ENV_KEY) if isinstance(extra, Mapping) else None
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise ValueError(f"additional_config.{STAGE_ENV_KEY} must be a mapping of variable → value, got {raw!r}")
    return {str(k): str(v) for k, v in raw.items()}


@contextlib.contextmanager
def scoped_env(env: Mapping[str, str]) -> Iterator[None]:
    """Set ``env`` in ``os.environ`` for the duration of the block, then restore the previous values."""
    previous = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for key, old in previous.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old


class CPUStageExecutor(MultiprocExecutor):
    """vLLM's multiprocess executor, spawning workers under the stage's own environment."""

    def _init_executor(self) -> None:
        env = stage_env(self.vllm_config)
        if env:
            stage_id = getattr(self.vllm_config.model_config, "stage_id", None)
            logger.info("stage %s workers start with %s", stage_id, env)
        with scoped_env(env):
            super()._init_executor()
