"""Admission control for speech requests: a bounded number in flight, the rest answered 503 at once.

Below the limit every request goes to the engine, whose scheduler runs ``max_num_seqs`` of them and queues the rest
first come, first served. Past the limit a request waits nowhere: it is rejected before its body is read, so an
overloaded server answers in milliseconds and its queue (and so every admitted request's latency) stays bounded.

The limit (``KANI_MAX_CONCURRENT_SPEECH``) counts engine requests: a ``/v1/audio/speech`` request is one, a batch is
one per item. Unset, it is Stage 0's ``max_num_seqs`` times ``KANI_SPEECH_QUEUE_FACTOR`` (default 4): up to three
waves of requests may wait behind the running one. ``0`` switches admission control off.

Per-request state (``ActiveSpeech``) is keyed by request id and removed on release, which the speech middleware does
when the response has ended, whatever ended it (completion, error, client disconnect, explicit cancel).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from vllm_omni_kani.entrypoints.openai.metrics import speech_metrics

logger = logging.getLogger(__name__)

ENV_MAX_CONCURRENT = "KANI_MAX_CONCURRENT_SPEECH"
ENV_QUEUE_FACTOR = "KANI_SPEECH_QUEUE_FACTOR"
ENV_RETRY_AFTER = "KANI_SPEECH_RETRY_AFTER_S"
DEFAULT_QUEUE_FACTOR = 4
# Used when Stage 0's max_num_seqs cannot be read (vLLM's own default).
FALLBACK_MAX_NUM_SEQS = 256
DEFAULT_RETRY_AFTER_S = 1


def _env_int(env: Mapping[str, str], name: str, default: int, minimum: int) -> int:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {raw!r}") from None
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def resolve_limit(max_num_seqs: int | None, env: Mapping[str, str] = os.environ) -> int:
    """The admission limit: ``KANI_MAX_CONCURRENT_SPEECH``, else ``max_num_seqs × KANI_SPEECH_QUEUE_FACTOR``."""
    explicit = _env_int(env, ENV_MAX_CONCURRENT, -1, 0)
    if explicit >= 0:
        return explicit
    factor = _env_int(env, ENV_QUEUE_FACTOR, DEFAULT_QUEUE_FACTOR, 1)
    return (max_num_seqs or FALLBACK_MAX_NUM_SEQS) * factor


def retry_after_s(env: Mapping[str, str] = os.environ) -> int:
    """Seconds a rejected client is told to wait (``Retry-After``)."""
    return _env_int(env, ENV_RETRY_AFTER, DEFAULT_RETRY_AFTER_S, 0)


class Closable(Protocol):
    """What the request's end closes: an output generator, or an engine request's early first step."""

    async def aclose(self) -> None: ...


@dataclass
class ActiveSpeech:
    """One admitted speech request (a whole batch is one entry holding one slot per item)."""

    request_id: str
    slots: int
    admitted_at: float = field(default_factory=time.perf_counter)
    # Set by an explicit cancel; the middleware then reports a disconnect to the handler, which aborts the engine.
    cancel_requested: asyncio.Event = field(default_factory=asyncio.Event)
    # Set when the entry is released (the response has ended).
    released: asyncio.Event = field(default_factory=asyncio.Event)
    engine_id_taken: bool = False  # the serving layer has named its engine request after this id
    # With vLLM's --api-key: a digest of the key the request came with; only that key may cancel it (None: anyone).
    owner: bytes | None = None
    outcome: str | None = None  # how it ended (metrics.OUTCOMES), set just before release
    # The request's audio generators (one per engine request: a batch has several) and early-started first steps
    # (``early_start.py``), closed when it ends, in order.
    outputs: list[Closable] = field(default_factory=list)
    # Asked for with ``X-Kani-Trace: 1``: ``time.perf_counter()`` of each point of the request's way to its first
    # audio (``speech_guard.TRACE_POINTS``), logged at release; None when not traced.
    trace: dict[str, float] | None = None

    def stamp(self, point: str, at: float | None = None) -> None:
        """Note the first time the request reaches ``point``, now or ``at`` (perf_counter seconds); a no-op unless
        it is traced."""
        if self.trace is not None and point not in self.trace:
            self.trace[point] = time.perf_counter() if at is None else at

    async def close_outputs(self) -> None:
        """Close the request's audio generators, which aborts their engine requests in every stage.

        Needed because neither a cancelled Starlette stream nor a handler that stopped iterating closes the
        generator it was reading: left to the garbage collector, the engine request (its KV blocks, conv state and
        codec windows) would keep running for seconds. A generator that is still running is being unwound by its
        own task's cancellation, which closes it.
        """
        for gen in self.outputs:
            try:
                await gen.aclose()
            except RuntimeError:  # "already running": its own task is unwinding it
                pass
            except Exception:  # the slot must still be released: log, never raise from here
                logger.warning("speech request %s: closing its output failed", self.request_id, exc_info=True)
        self.outputs.clear()

    @property
    def engine_request_id(self) -> str:
        """The id vLLM-Omni gives the engine request (its logs say ``speech-<X-Request-Id>``)."""
        return f"speech-{self.request_id}"


@dataclass(frozen=True)
class Rejection:
    status: int
    reason: str  # one of metrics.REJECT_REASONS
    message: str


class SpeechAdmission:
    """Counts slots of admitted speech requests against ``limit``; one instance per API-server process."""

    def __init__(self, limit: int | None = None, running: int | None = None) -> None:
        self._limit = limit
        self._running = running
        self._active: dict[str, ActiveSpeech] = {}
        self._used = 0

    @property
    def limit(self) -> int | None:
        """The limit, 0 for none, None until ``configure`` (then requests are admitted unlimited)."""
        return self._limit

    def configure(self, limit: int, running: int | None = None) -> None:
        """Set the limit and Stage 0's ``max_num_seqs`` (how many of the admitted the engine runs at once)."""
        self._limit = limit
        self._running = running
        speech_metrics().limit.set(limit)

    @property
    def queued(self) -> int:
        """Admitted requests the engine cannot be running yet: those beyond Stage 0's ``max_num_seqs``.

        Stage 0 runs at most ``max_num_seqs`` requests and queues the rest first come, first served, so this is
        exact at admission granularity and needs nothing from the engine (whose own gauges lag behind aborts).
        """
        return max(0, self._used - self._running) if self._running else 0

    @property
    def used(self) -> int:
        return self._used

    def get(self, request_id: str) -> ActiveSpeech | None:
        return self._active.get(request_id)

    def __len__(self) -> int:
        return len(self._active)

    def admit(self, request_id: str, slots: int = 1, owner: bytes | None = None) -> ActiveSpeech | Rejection:
        """Take ``slots`` for ``request_id`` or say why not. Synchronous: no await between check and take."""
        if request_id in self._active:
            return Rejection(409, "duplicate_request_id", f"Request id '{request_id}' is already in use.")
        limit = self._limit or 0
        if limit and slots > limit:
            return Rejection(
                400,
                "batch_too_large",
                f"A batch of {slots} items exceeds this server's limit of {limit} concurrent speech requests; "
                f"send at most {limit} items per batch.",
            )
        if limit and self._used + slots > limit:
            return Rejection(
                503,
                "overloaded",
                f"The server is at its limit of {limit} concurrent speech requests; retry later.",
            )
        entry = ActiveSpeech(request_id=request_id, slots=slots, owner=owner)
        self._active[request_id] = entry
        self._used += slots
        self._publish()
        return entry

    def _publish(self) -> None:
        metrics = speech_metrics()
        metrics.active.set(self._used)
        metrics.queued.set(self.queued)

    def release(self, entry: ActiveSpeech) -> None:
        """Give the entry's slots back (idempotent)."""
        if self._active.get(entry.request_id) is not entry:
            return
        del self._active[entry.request_id]
        self._used -= entry.slots
        self._publish()
        entry.released.set()
