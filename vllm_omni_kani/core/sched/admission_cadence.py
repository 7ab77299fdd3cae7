"""Under load, Stage 0 admits new prompts every ``kani_admit_every_steps`` steps instead of every step.

A step that admits a prompt runs as a mixed batch: vLLM's CUDA graphs in pieces around the attention and short-conv
layers (LFM2's short-conv backend has full graphs for uniform decode batches only), plus the runners' per-request
set-up. On an H200 such a step took 38-43 ms against 24-31 ms for a decode step of the same rows, whatever the
number of prompts it carried (docs/BENCHMARKS.md, twenty-first and forty-fifth sets); with 64-frame requests at 256
streams ~30% of Stage 0's steps admitted 2-5 prompts each. Admitting on every ``k``-th step carries the same prompts
in fewer mixed steps, at the price of up to ``k - 1`` steps' wait before a prompt's first step.

The cadence applies only while at least ``kani_admit_min_running`` requests run (default 64), so a lightly loaded
engine, where a first audio's latency is what counts, admits every step as vLLM does. It defers through vLLM-Omni's
own hook (``OmniARScheduler._should_defer_waiting_admission``: the waiting queue is set aside for that step), so
requests already running (a chunked prompt in progress among them) are scheduled as before, a preempted request
waits in the same queue as the new ones (held with them), and nothing is reordered.
``kani_admit_every_steps: 1`` (the default) is vLLM's behaviour.

With ``kani_admit_rows_per_step: R`` the cadence follows the load: an engine running ``n`` requests admits every
``min(kani_admit_every_steps, n // R)`` steps, so a lightly loaded engine, whose few prompts a fixed ``k`` would hold
as long as a full engine's, holds them a step or two, and a full one up to ``k - 1``. Served on an H200 (16 / 16 /
R 8 against the shipped 8 / 64) it made no resolved difference (docs/BENCHMARKS.md, fiftieth set). ``0`` (the
default) keeps ``k`` fixed.
"""

from __future__ import annotations

import logging
from typing import Any

from vllm_omni_kani.model_executor.models.kani_tts.configuration import additional_config_int

logger = logging.getLogger(__name__)

# Stage 0 additional_config keys (module docstring).
ADMIT_EVERY_STEPS_KEY = "kani_admit_every_steps"
ADMIT_MIN_RUNNING_KEY = "kani_admit_min_running"
ADMIT_ROWS_PER_STEP_KEY = "kani_admit_rows_per_step"
DEFAULT_ADMIT_EVERY_STEPS = 1
DEFAULT_ADMIT_MIN_RUNNING = 64
DEFAULT_ADMIT_ROWS_PER_STEP = 0


def admission_cadence(vllm_config: Any) -> tuple[int, int, int]:
    """``(every, min_running, rows_per_step)`` from Stage 0's additional_config; ValueError unless ``every >= 1``,
    ``min_running >= 0`` and ``rows_per_step >= 0``."""
    return (
        additional_config_int(vllm_config, ADMIT_EVERY_STEPS_KEY, DEFAULT_ADMIT_EVERY_STEPS, 1),
        additional_config_int(vllm_config, ADMIT_MIN_RUNNING_KEY, DEFAULT_ADMIT_MIN_RUNNING, 0),
        additional_config_int(vllm_config, ADMIT_ROWS_PER_STEP_KEY, DEFAULT_ADMIT_ROWS_PER_STEP, 0),
    )


class AdmissionGate:
    """Decides, step by step, whether waiting prompts wait one more step (module docstring)."""

    def __init__(self, every: int, min_running: int, rows_per_step: int = 0) -> None:
        self.every = every
        self.min_running = min_running
        self.rows_per_step = rows_per_step
        self.held = 0  # steps in a row that set the waiting prompts aside
        self.deferred_steps = 0  # over the engine's life, for its log and the tests

    def defer(self, running: int, waiting: int) -> bool:
        """Whether this step leaves the ``waiting`` prompts where they are, with ``running`` requests in the batch."""
        every = min(self.every, running // self.rows_per_step) if self.rows_per_step else self.every
        if every > 1 and waiting and running >= self.min_running and self.held < every - 1:
            self.held += 1
            self.deferred_steps += 1
            return True
        self.held = 0
        return False


class AdmissionCadence:
    """Scheduler mixin: vLLM-Omni's waiting-admission hook answered by an ``AdmissionGate``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        every, min_running, rows_per_step = admission_cadence(self.vllm_config)
        self.admission_gate = AdmissionGate(every, min_running, rows_per_step)
        if every > 1:
            cadence = f"min({every}, running // {rows_per_step})" if rows_per_step else str(every)
            logger.info(
                "Kani Stage-0 scheduler: new prompts admitted every %s steps while %d or more requests run",
                cadence,
                min_running,
            )

    def _should_defer_waiting_admission(self) -> bool:
        if self.admission_gate.defer(len(self.running), len(self.waiting)):
            return True
        return super()._should_defer_waiting_admission()
