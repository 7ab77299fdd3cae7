"""Where a request's first output waits inside a stage: one log line per request, from its scheduler.

The API server's ``[KaniTTFA]`` points end at the engines' door (the engine request queued) and pick up at the
orchestrator's put of the first audio; between them both stages run. With ``KANI_TRACE_FIRST_OUTPUTS=1`` each stage's
scheduler notes, per request, when it was added to the scheduler, when a step first scheduled it (for the codec: its
first chunk) and when its first output left the scheduler, and logs them at that output as

    [KaniFirstOutput] stage=S request_id=ID added=T scheduled=T output=T arrival_lag_ms=MS

in ``time.perf_counter()`` seconds (CLOCK_MONOTONIC on Linux, one clock for every process of the host, as the API
server's points use). ``arrival_lag_ms`` is the wall-clock time from the request's arrival as the API server stamped
it to its addition here: the orchestrator's and the transport's share. ``benchmarks/first_outputs.py`` joins the lines
with the ``[KaniTTFA]`` ones by request id. Entries are keyed by request id and removed at the first output or when
the request finishes or is aborted before it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from vllm_omni_kani.core.sched.request_ids import forget_requests
from vllm_omni_kani.envs import trace_first_outputs

logger = logging.getLogger(__name__)

TAG = "[KaniFirstOutput]"


@dataclass
class _Pending:
    added: float
    arrival_lag_ms: float
    scheduled: float | None = None


class FirstOutputTrace:
    """The pending requests of one stage's scheduler (module docstring)."""

    def __init__(self, stage: int) -> None:
        self.stage = stage
        self.pending: dict[str, _Pending] = {}
        # Requests whose first output has left, until the engine's output thread takes its message: kept only once
        # that thread's trace is installed (``engine/output_thread_trace.py``, which sets it and removes them).
        self.leaving: set[str] | None = None

    def added(self, request: Any) -> None:
        arrival = getattr(request, "arrival_time", None)
        lag_ms = (time.time() - arrival) * 1000.0 if isinstance(arrival, (int, float)) and arrival > 0 else -1.0
        self.pending[request.request_id] = _Pending(time.perf_counter(), lag_ms)

    def scheduled(self, request_ids: Iterable[str]) -> None:
        """Requests a step has just scheduled (the first such step is noted)."""
        now = None
        for request_id in request_ids:
            entry = self.pending.get(request_id)
            if entry is not None and entry.scheduled is None:
                entry.scheduled = now = now or time.perf_counter()

    def outputs(self, request_ids: Iterable[str]) -> None:
        """Requests whose outputs leave the scheduler now: the first one of each is logged."""
        if not self.pending:
            return
        now = None
        for request_id in request_ids:
            entry = self.pending.pop(request_id, None)
            if entry is None:
                continue
            now = now or time.perf_counter()
            scheduled = entry.scheduled if entry.scheduled is not None else now
            if self.leaving is not None:
                self.leaving.add(request_id)
            logger.info(
                "%s stage=%d request_id=%s added=%.6f scheduled=%.6f output=%.6f arrival_lag_ms=%.1f",
                TAG,
                self.stage,
                request_id,
                entry.added,
                scheduled,
                now,
                entry.arrival_lag_ms,
            )

    def forget(self, request_ids: str | Iterable[str] | None) -> None:
        ids = None if request_ids is None else [request_ids] if isinstance(request_ids, str) else list(request_ids)
        forget_requests(self.pending, ids)
        if self.leaving is None:
            return
        if ids is None:
            self.leaving.clear()
        else:
            self.leaving.difference_update(ids)


class FirstOutputTracing:
    """A scheduler mixin: ``FirstOutputTrace`` of its stage (``trace_stage``) when ``KANI_TRACE_FIRST_OUTPUTS`` is on,
    else nothing per step but one attribute check."""

    trace_stage: int = -1

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.first_output_trace = FirstOutputTrace(self.trace_stage) if trace_first_outputs() else None

    def add_request(self, request: Any) -> None:
        super().add_request(request)
        if self.first_output_trace is not None:
            self.first_output_trace.added(request)

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        scheduler_output = super().schedule(*args, **kwargs)
        if self.first_output_trace is not None:
            self.first_output_trace.scheduled(getattr(scheduler_output, "num_scheduled_tokens", None) or ())
        return scheduler_output

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
        outputs = super().update_from_output(scheduler_output, model_runner_output)
        if self.first_output_trace is not None:
            for batch in outputs.values():
                self.first_output_trace.outputs(o.request_id for o in batch.outputs)
        return outputs

    def finish_requests(self, request_ids: Any, finished_status: Any) -> Any:
        if self.first_output_trace is not None:
            self.first_output_trace.forget(request_ids)
        return super().finish_requests(request_ids, finished_status)
