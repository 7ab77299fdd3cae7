"""When an engine core's output thread takes a traced request's first output, and when it has sent it.

A stage's first output leaves its scheduler (``[KaniFirstOutput]``'s ``output``), goes on the engine core's output
queue, and vLLM's output thread (``EngineCoreProc.process_output_sockets``) takes it, encodes the step's outputs
(the codec's PCM among them) and sends them to the API-server process, where the orchestrator reads them
(``[KaniTTFA]``'s ``read``). At 256 streams that way from the codec to the read was the most variable segment of a
first audio (31-62 ms p50, p95 to 212; docs/BENCHMARKS.md, fifty-second set). With ``KANI_TRACE_FIRST_OUTPUTS=1``
the output thread's ``output_queue.get`` is wrapped: for each request whose first output the scheduler has just let
out (``FirstOutputTrace.leaving``) it notes when the thread took the message, and when the thread came back for the
next one (its send done), and logs

    [KaniFirstSent] stage=S request_id=ID taken=T sent=T

(``time.perf_counter()``, the clock of every point). The line of a message is logged when the thread asks for the
next; its times are those of the message. ``benchmarks/first_outputs.py`` splits the segment with them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)

TAG = "[KaniFirstSent]"


class OutputThreadTrace:
    """The output thread's ``output_queue.get``, noting the traced first outputs of each message it takes.

    ``leaving`` is the scheduler's set of request ids whose first output has left it (added on the step's thread,
    taken here on the output thread: single set operations, atomic under the GIL)."""

    def __init__(self, get: Callable[..., Any], stage: int, leaving: set[str]) -> None:
        self._get = get
        self.stage = stage
        self.leaving = leaving
        # (request id, when the thread took its message) of the message in hand.
        self.carrying: list[tuple[str, float]] = []

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.carrying:
            sent = time.perf_counter()
            for request_id, taken in self.carrying:
                logger.info("%s stage=%d request_id=%s taken=%.6f sent=%.6f", TAG, self.stage, request_id, taken, sent)
            self.carrying = []
        item = self._get(*args, **kwargs)
        if self.leaving and isinstance(item, tuple):
            taken = time.perf_counter()
            for output in getattr(item[-1], "outputs", None) or ():
                request_id = getattr(output, "request_id", None)
                if request_id in self.leaving:
                    self.leaving.discard(request_id)
                    self.carrying.append((request_id, taken))
        return item


def trace_output_thread(engine: Any) -> bool:
    """Wrap ``engine.output_queue.get`` when its scheduler traces first outputs; returns whether it did."""
    trace = getattr(getattr(engine, "scheduler", None), "first_output_trace", None)
    queue = getattr(engine, "output_queue", None)
    if trace is None or queue is None or isinstance(queue.get, OutputThreadTrace):
        return False
    if trace.leaving is None:
        trace.leaving = set()
    queue.get = OutputThreadTrace(queue.get, trace.stage, trace.leaving)
    return True
