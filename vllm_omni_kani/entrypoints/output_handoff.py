"""When a traced request's outputs cross from vLLM-Omni's orchestrator thread to the API server's event loop.

The orchestrator (a thread of the API-server process) processes each engine step's outputs as one batch and puts a
message per request on a queue; the API server's loop polls that queue (every 1 ms while it is empty), hands each
message to its request's queue, and the request's generator turns it into the output the speech handler sees. On an
H200 at 64 streams ~35 ms p50 lay between the orchestrator recording a request's first audio and the handler seeing
it, ~170 ms at 256 (docs/BENCHMARKS.md, "Eighteenth set"). For a request traced with ``X-Kani-Trace``
(``speech_guard``) this module keeps, per message, when it was put and when the loop took it, keyed by the request id
and by the message's engine output, until the handler has seen the first audio; ``[KaniTTFA]`` then places
``orchestrated`` and ``dequeued`` between ``submitted`` and ``first_audio`` (``benchmarks/ttfa_breakdown.py``).

It also keeps when the engine request itself was queued for the orchestrator (``queued``): the speech handler has the
request's output generator at ``submitted``, but vLLM-Omni queues the request only at the generator's first step, once
the response has started streaming, on the same busy loop. vLLM-Omni's own ``serving_time_to_first_output_ms`` counts
from there, so without this point its difference from ``orchestrated`` could not be split (nineteenth set). And it
keeps when the orchestrator's read of each stage's first message for the request ended (``read``, noted by
``engine/replica_outputs.py``): between the codec's first output and ``orchestrated`` lie the crossing to the
orchestrator's thread and its pass over the stages' messages (fifty-first set: 36-167 ms p50 at 256 streams).

The orchestrator's messages name vLLM-Omni's internal request id, ``<external id>-<8 hex>``; requests are watched by
the external id the speech server submitted. ``patch.trace_output_handoff`` installs the three hooks.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

# vLLM-Omni names an engine request "<external id>-<8 hex digits>" (AsyncOmni._get_unique_request_id).
_INTERNAL_SUFFIX = 9
# Watched requests are released at their first audio or when their stream ends; one whose stream never started is
# dropped once this many newer ones are watched.
MAX_WATCHED = 4096


@dataclass
class _Crossings:
    """One watched request's messages: put times not yet taken (in queue order), and (put, taken) per engine output."""

    puts: deque[float] = field(default_factory=deque)
    taken: dict[int, tuple[float, float]] = field(default_factory=dict)
    queued: float | None = None
    # Stage id -> when the orchestrator's read of that stage's first message for the request ended.
    reads: dict[int, float] = field(default_factory=dict)


_watched: dict[str, _Crossings] = {}


def watch(request_id: str) -> None:
    """Keep the crossings of the engine request submitted as ``request_id`` (call before submitting it)."""
    _watched[request_id] = _Crossings()
    while len(_watched) > MAX_WATCHED:
        del _watched[next(iter(_watched))]


def release(request_id: str) -> None:
    """Stop watching ``request_id`` (its first audio was seen, or it ended without one)."""
    _watched.pop(request_id, None)


def crossing(request_id: str, engine_output: Any) -> tuple[float, float] | None:
    """``(put, taken)`` perf_counter seconds of the message that carried ``engine_output`` (the output's
    ``request_output``) for a watched request; None if it was not seen."""
    crossings = _watched.get(request_id)
    return crossings.taken.get(id(engine_output)) if crossings is not None else None


def queued_at(request_id: str) -> float | None:
    """perf_counter seconds at which a watched request's engine request was queued for the orchestrator."""
    crossings = _watched.get(request_id)
    return crossings.queued if crossings is not None else None


def read_at(request_id: str) -> float | None:
    """perf_counter seconds at which the orchestrator had read the first message of the latest stage that sent one
    for a watched request (at its first audio: the codec's first output)."""
    crossings = _watched.get(request_id)
    if crossings is None or not crossings.reads:
        return None
    return crossings.reads[max(crossings.reads)]


def watching() -> bool:
    """Whether any request is watched (the orchestrator's per-message notes cost nothing otherwise)."""
    return bool(_watched)


def note_read(stage_id: int, engine_outputs: Any, at: float) -> None:
    """The orchestrator's read of a message of stage ``stage_id`` ended at ``at``: kept, for each watched request
    in its ``engine_outputs``, if it is that stage's first for the request (``engine/replica_outputs.py``)."""
    for output in engine_outputs:
        crossings = _of_id(getattr(output, "request_id", None))
        if crossings is not None:
            crossings.reads.setdefault(stage_id, at)


def _of_id(internal: Any) -> _Crossings | None:
    if not _watched or not isinstance(internal, str) or len(internal) <= _INTERNAL_SUFFIX:
        return None
    return _watched.get(internal[:-_INTERNAL_SUFFIX])


def _of(message: Any) -> _Crossings | None:
    return _of_id(getattr(message, "request_id", None))


def note_queued(internal_id: str) -> None:
    """vLLM-Omni queued the engine request ``internal_id`` for the orchestrator (``AsyncOmniEngine.add_request``)."""
    crossings = _of_id(internal_id)
    if crossings is not None and crossings.queued is None:
        crossings.queued = time.perf_counter()


def note_put(message: Any) -> None:
    """The orchestrator is putting ``message`` on its output queue (noted first, so the loop never takes a message
    whose put is not yet noted)."""
    crossings = _of(message)
    if crossings is not None:
        crossings.puts.append(time.perf_counter())


def note_taken(message: Any) -> None:
    """The API server's loop took ``message`` off the orchestrator's queue (messages of one request come off in the
    order they were put)."""
    crossings = _of(message)
    if crossings is None or not crossings.puts:
        return
    put = crossings.puts.popleft()
    output = getattr(message, "engine_outputs", None)
    if output is not None:
        crossings.taken[id(output)] = (put, time.perf_counter())


class NotingQueue:
    """The orchestrator's output queue, noting each put (``note_put``); everything else is the queue's own."""

    def __init__(self, queue: Any) -> None:
        self._queue = queue

    async def put(self, item: Any) -> None:
        note_put(item)
        await self._queue.put(item)

    def put_nowait(self, item: Any) -> None:
        note_put(item)
        self._queue.put_nowait(item)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._queue, name)
