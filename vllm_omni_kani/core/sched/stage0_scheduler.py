"""Stage 0's scheduler: a stream's outputs leave the engine every ``kani_output_every_steps`` steps, not every step.

vLLM-Omni's AR scheduler returns one output per running request per step. Served, Stage 0's audio codes go to the
codec through the connector, not through these outputs, yet each one still crosses to the API server, where the
orchestrator thread processes it under the GIL the event loop needs (~7 µs an output, ~10,000 outputs a second at
256 streams; docs/BENCHMARKS.md, eighteenth set). Here a running request's outputs are merged on the engine side
and sent every ``kani_output_every_steps``-th step instead, so the orchestrator sees a stream's tokens in a few
outputs of several tokens each, as it would under speculative decoding.

Nothing a client or the next stage reads changes: a request's first output (its first token, for the time to
first token) and its last (with every token held back, for ``async_chunk: false`` and the final stats) leave at
once; merged outputs carry the held tokens, and their codes concatenated in step order (what the orchestrator's
accumulator would have built from them one by one). Any output that carries more than tokens and codes (logprobs,
events, KV-transfer or streaming-input fields) leaves at once with what was held before it. A request's held
outputs are dropped when it is aborted; the pool of held outputs is keyed by request id and empties as requests
finish.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import torch
from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs
from vllm.v1.request import RequestStatus
from vllm_omni.core.sched.omni_ar_scheduler import OmniARAsyncScheduler, OmniARScheduler
from vllm_omni.engine import OmniEngineCoreOutput

from vllm_omni_kani.core.sched.admission_cadence import AdmissionCadence
from vllm_omni_kani.core.sched.decode_slots import FastDecodeSlots
from vllm_omni_kani.core.sched.finished_tokens import FinishedTokensLog
from vllm_omni_kani.core.sched.first_outputs import FirstOutputTracing
from vllm_omni_kani.core.sched.request_ids import forget_requests
from vllm_omni_kani.core.sched.step_kinds import StepKinds
from vllm_omni_kani.model_executor.models.kani_tts.configuration import additional_config_int

logger = logging.getLogger(__name__)

# Stage 0 additional_config key: a running request's outputs leave the engine every this many steps (1: every step,
# as stock vLLM-Omni). At 8, 256 streams send ~32 outputs a step instead of 256.
OUTPUT_EVERY_STEPS_KEY = "kani_output_every_steps"
DEFAULT_OUTPUT_EVERY_STEPS = 8


def output_every_steps(vllm_config: Any) -> int:
    """``kani_output_every_steps`` from Stage 0's additional_config; raises ValueError unless a positive int."""
    return additional_config_int(vllm_config, OUTPUT_EVERY_STEPS_KEY, DEFAULT_OUTPUT_EVERY_STEPS, 1)


def _may_wait(o: EngineCoreOutput) -> bool:
    """A plain decode step's output: not finished, nothing but tokens (no logprobs, events, pooling, KV or EC
    transfer, prefill stats, routed experts, streaming-input fields), and codes a merge can concatenate (flat keys of
    1-D tensors) if any. Attribute by attribute: ~0.2 µs, a third of ``operator.attrgetter``'s tuple."""
    if not (
        type(o) is OmniEngineCoreOutput
        and o.finish_reason is None
        and o.new_logprobs is None
        and o.new_prompt_logprobs_tensors is None
        and o.pooling_output is None
        and o.events is None
        and o.kv_transfer_params is None
        and o.ec_transfer_params is None
        and o.prefill_stats is None
        and o.routed_experts is None
        and o.is_segment_finished is False
        and o.new_prompt_len_snapshot is None
    ):
        return False
    payload = o.multimodal_output
    return payload is None or all(isinstance(v, torch.Tensor) and v.dim() == 1 for v in payload.values())


def _merge(held: list[EngineCoreOutput], output: EngineCoreOutput) -> None:
    """Put the held outputs' tokens and codes, in step order, in front of ``output``'s own (it is the one sent)."""
    tokens: list[int] = []
    codes: dict[str, list[torch.Tensor]] = {}
    for earlier in held:
        tokens += earlier.new_token_ids
        for key, value in (earlier.multimodal_output or {}).items():
            codes.setdefault(key, []).append(value)
    output.new_token_ids = tokens + list(output.new_token_ids)
    if not codes or not hasattr(output, "multimodal_output"):
        return  # a plain vLLM output (an abort's) carries no codes
    payload = dict(output.multimodal_output or {})
    for key, parts in codes.items():
        if isinstance(payload.get(key), torch.Tensor):
            parts.append(payload[key])
        payload[key] = parts[0] if len(parts) == 1 else torch.cat(parts)
    output.multimodal_output = payload


class OutputCoalescer:
    """Holds running requests' outputs back and sends them merged, every ``every`` steps (module docstring).

    ``held`` has an entry for every request that has sent its first output and not finished: the outputs it holds
    (often none). A request's first output is the one that finds no entry."""

    def __init__(self, every: int) -> None:
        self.every = every
        self.held: dict[str, list[EngineCoreOutput]] = {}

    def filter(self, outputs: dict[int, EngineCoreOutputs]) -> dict[int, EngineCoreOutputs]:
        """Hold back what may wait, merge what leaves. A client's outputs object is dropped only when nothing else
        rides on it (no stats, no finished set)."""
        if self.every <= 1:
            return outputs
        every, held_by_id = self.every, self.held
        for client, batch in list(outputs.items()):
            kept = []
            for output in batch.outputs:
                held = held_by_id.get(output.request_id)
                if held is None:  # its first output (or an aborted request's last)
                    if output.finish_reason is None:
                        held_by_id[output.request_id] = []
                else:
                    if len(held) + 1 < every and _may_wait(output):
                        held.append(output)
                        continue
                    if held:
                        _merge(held, output)
                        held.clear()
                    if output.finish_reason is not None:
                        del held_by_id[output.request_id]
                kept.append(output)
            batch.outputs = kept
            if not kept and _empty(batch):
                del outputs[client]
        return outputs

    def drop(self, request_ids: str | Iterable[str] | None) -> None:
        """Forget aborted requests' held outputs (None: every request's)."""
        forget_requests(self.held, request_ids)


def _empty(batch: EngineCoreOutputs) -> bool:
    return (
        batch.scheduler_stats is None
        and batch.utility_output is None
        and not batch.finished_requests
        and batch.wave_complete is None
        and batch.start_wave is None
    )


class _CoalescingOutputs:
    """The AR scheduler with its step outputs passed through an ``OutputCoalescer``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.output_coalescer = OutputCoalescer(output_every_steps(self.vllm_config))
        logger.info(
            "Kani Stage-0 scheduler (%s): a running request's outputs every %d steps",
            type(self).__name__,
            self.output_coalescer.every,
        )

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> dict[int, EngineCoreOutputs]:
        outputs = super().update_from_output(scheduler_output, model_runner_output)
        return self.output_coalescer.filter(outputs)

    def finish_requests(self, request_ids: Any, finished_status: RequestStatus) -> Any:
        self.output_coalescer.drop(request_ids)
        return super().finish_requests(request_ids, finished_status)


class KaniStage0Scheduler(
    StepKinds,
    FirstOutputTracing,
    FinishedTokensLog,
    FastDecodeSlots,
    AdmissionCadence,
    _CoalescingOutputs,
    OmniARScheduler,
):
    """vLLM-Omni's AR scheduler with coalesced outputs; with async scheduling on it builds the async one instead,
    so one ``scheduler_cls`` serves both (vLLM-Omni picks the async class from the YAML only when none is named).
    ``KANI_TRACE_FIRST_OUTPUTS`` traces each request's first output as it leaves, after the coalescer;
    ``KANI_STEP_STATS_S`` logs its steps by kind (decode, prefill; ``step_kinds.py``); ``KANI_LOG_STAGE0_FINISHED``
    logs each freed request's output tokens (``finished_tokens.py``); a decode step that needs no new KV block skips
    vLLM's slot allocation (``decode_slots.py``); ``kani_admit_every_steps`` admits new prompts every few steps under
    load (``admission_cadence.py``)."""

    trace_stage = 0

    def __new__(cls, vllm_config: Any, *args: Any, **kwargs: Any) -> Any:
        if cls is KaniStage0Scheduler and vllm_config.scheduler_config.async_scheduling:
            cls = KaniStage0AsyncScheduler
        return super().__new__(cls)


class KaniStage0AsyncScheduler(KaniStage0Scheduler, OmniARAsyncScheduler):
    """The same, on vLLM-Omni's async-scheduling AR scheduler."""
