"""The speech guard: one ASGI middleware around ``/v1/audio/speech`` and ``/v1/audio/speech/batch``.

For each speech request, before FastAPI reads the body, it

1. takes the client's ``X-Request-Id`` (checked, see ``cancellation.py``) or makes one;
2. admits the request or answers at once: 503 + ``Retry-After`` past the limit, 409 for an id in use
   (``admission.py``); a batch is admitted as a whole, one slot per item (its body is read here to count them);
3. runs the app with a receive channel that an explicit cancel turns into a disconnect, and a send channel that
   stamps ``X-Request-Id`` on the response and notes how it ended;
4. releases the slots when the app returns, which for a streaming response is when the stream has ended or the
   client has gone, and counts the outcome.

A request sent with ``X-Kani-Trace: 1`` also logs, at release, one ``[KaniTTFA]`` line with the
``time.perf_counter()`` of each point on its way to its first audio (``TRACE_POINTS``). On Linux that clock is
``CLOCK_MONOTONIC``, shared by every process of the host, so a client on the same host can place its own send and
first-byte times among them (``benchmarks/ttfa_breakdown.py``).

It sits innermost among the app's middleware (after CORS, API-key auth and vLLM's own), so a request that auth turns
away never takes a slot. With ``--api-key`` an admitted request remembers a digest of its key, and only that key can
cancel it (``cancellation.py``). ``patch.install_speech_guard`` installs it from the plugin, in the API-server process.
The first request through it (health checks included) also starts ``KANI_LOOP_LAG_S``'s event-loop lag meter.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import logging
import uuid
from dataclasses import dataclass
from typing import Any

from starlette._utils import get_route_path
from starlette.datastructures import Headers
from starlette.middleware import Middleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from vllm_omni_kani.entrypoints.loop_lag import LoopLagMeter
from vllm_omni_kani.entrypoints.openai.admission import (
    ActiveSpeech,
    Rejection,
    SpeechAdmission,
    resolve_limit,
    retry_after_s,
)
from vllm_omni_kani.entrypoints.openai.cancellation import (
    CANCEL_PATH,
    CANCELLED_STATUS,
    REQUEST_ID_HEADER,
    CancellableReceive,
    cancel_speech,
    check_request_id,
    error_body,
    key_digest,
)
from vllm_omni_kani.entrypoints.openai.metrics import speech_metrics
from vllm_omni_kani.envs import TRUTHY

logger = logging.getLogger(__name__)

SPEECH_PATH = "/v1/audio/speech"
BATCH_PATH = "/v1/audio/speech/batch"
# How long the end of a cancelled stream may wait for a client that does not read; then the connection is dropped.
END_STREAM_TIMEOUT_S = 5.0
_ERROR_TYPES = {400: "BadRequestError", 409: "ConflictError", 503: "ServiceUnavailableError"}
TRACE_HEADER = "x-kani-trace"
# In order: admitted by this middleware (its headers are in); its body received in full (``CancellableReceive``); the
# speech handler preparing it; its output generator made ("submitted"); its engine request queued for the
# orchestrator, at that generator's first step (``early_start``); the orchestrator's read of the codec's message with
# its first audio ended; that message put on the orchestrator's output queue and taken off it by the API loop
# (``output_handoff``); that audio at the speech handler (``kani_speech``); the first audio bytes handed to the server;
# the response ended.
TRACE_POINTS = (
    "arrived",
    "body",
    "handler",
    "submitted",
    "queued",
    "read",
    "orchestrated",
    "dequeued",
    "first_audio",
    "first_body",
    "end",
)
TRACE_TAG = "[KaniTTFA]"


@dataclass(frozen=True)
class SpeechContext:
    """What the serving code of one speech request can see of its admission (a context variable)."""

    admission: SpeechAdmission
    entry: ActiveSpeech


_CURRENT: contextvars.ContextVar[SpeechContext | None] = contextvars.ContextVar("kani_speech_request", default=None)


def current_speech() -> SpeechContext | None:
    """The admitted speech request this code runs for, or None outside the guard."""
    return _CURRENT.get()


def take_engine_uuid() -> str | None:
    """The current request's id, the first time it is asked for (it names the engine request), else None."""
    ctx = _CURRENT.get()
    if ctx is None or ctx.entry.engine_id_taken:
        return None
    ctx.entry.engine_id_taken = True
    return ctx.entry.request_id


async def _respond(send: Send, status: int, body: dict[str, Any], headers: dict[str, str]) -> None:
    payload = json.dumps(body).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    raw += [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": payload, "more_body": False})


async def _read_body(receive: Receive) -> tuple[bytes, Receive]:
    """The whole request body, and a receive that replays it to the app."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    body, replayed = b"".join(chunks), False

    async def replay() -> Message:
        nonlocal replayed
        if replayed:
            return await receive()
        replayed = True
        return {"type": "http.request", "body": body, "more_body": False}

    return body, replay


def _batch_items(body: bytes) -> int:
    """Items in a batch body; 1 when it cannot be read (the app then answers 4xx for it)."""
    try:
        items = json.loads(body).get("items")
    except (ValueError, AttributeError):
        return 1
    return max(1, len(items)) if isinstance(items, list) else 1


class _Exchange:
    """The send side of one admitted request: stamps the id, notes status and completion, ends cancelled streams."""

    def __init__(self, send: Send, entry: ActiveSpeech, receive: CancellableReceive) -> None:
        self._send = send
        self._entry = entry
        self.receive = receive
        self.status: int | None = None
        self.complete = False
        self._sse = False
        self._replaced = False  # our 499 went out instead of the handler's response
        self._cut = False  # a cancelled stream was ended by us

    @property
    def _cancelled(self) -> bool:
        return self._entry.cancel_requested.is_set() and not self.receive.disconnected

    async def send(self, message: Message) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            if self._cancelled:
                # A non-streaming handler that was cancelled returns nothing useful: answer for it.
                self._replaced = True
                self.status = CANCELLED_STATUS
                message = f"Speech request '{self._entry.request_id}' was cancelled."
                body = error_body(CANCELLED_STATUS, message, "RequestCancelled")
                await _respond(self._send, CANCELLED_STATUS, body, {REQUEST_ID_HEADER: self._entry.request_id})
                self.complete = True
                return
            self.status = message["status"]
            headers = list(message.get("headers", []))
            self._sse = Headers(raw=headers).get("content-type", "").startswith("text/event-stream")
            headers.append((REQUEST_ID_HEADER.encode(), self._entry.request_id.encode()))
            message = {**message, "headers": headers}
        elif kind == "http.response.body":
            if self._replaced:
                return
            if message.get("body"):
                self._entry.stamp("first_body")
            if not message.get("more_body", False):
                self.complete = True
        await self._send(message)

    async def end_cancelled_stream(self) -> None:
        """Close a stream that an explicit cancel cut short, so the client sees a well-formed end."""
        if self.status is None or self.complete or not self._cancelled:
            return
        tail = b""
        if self._sse:
            error = error_body(CANCELLED_STATUS, "cancelled", "RequestCancelled")["error"]
            event = json.dumps({"type": "speech.audio.error", "error": error}, separators=(",", ":"))
            tail = b"event: speech.audio.error\ndata: " + event.encode() + b"\n\n"
        self._cut = True
        await self._send({"type": "http.response.body", "body": tail, "more_body": False})
        self.complete = True

    def outcome(self) -> str:
        """How the request ended, one of ``metrics.OUTCOMES``."""
        if self._replaced or self._cut:
            return "cancelled"
        if self.receive.disconnected:
            return "disconnected"
        if self._entry.cancel_requested.is_set() and not self.complete:
            return "cancelled"
        if self.status is None or self.status >= 500 or not self.complete:
            return "server_error"
        return "client_error" if self.status >= 400 else "ok"


class SpeechGuardMiddleware:
    """Pure ASGI (no extra task per request, streaming passes through untouched)."""

    def __init__(self, app: ASGIApp, admission: SpeechAdmission, keyed: bool = False) -> None:
        self.app = app
        self.admission = admission
        self.keyed = keyed  # vLLM checks API keys (outside this middleware): requests belong to their key
        self.loop_lag = LoopLagMeter()  # KANI_LOOP_LAG_S; runs from the first request on (health checks included)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.loop_lag.ensure_started()
        if scope["type"] != "http" or scope.get("method") != "POST":
            return await self.app(scope, receive, send)
        path = get_route_path(scope)
        if path not in (SPEECH_PATH, BATCH_PATH):
            return await self.app(scope, receive, send)

        metrics = speech_metrics()
        request_headers = Headers(scope=scope)
        request_id = request_headers.get(REQUEST_ID_HEADER)
        if request_id is None:
            request_id = uuid.uuid4().hex
        elif error := check_request_id(request_id):
            metrics.rejected.labels(reason="invalid_request_id").inc()
            return await _respond(send, 400, error_body(400, error, "BadRequestError"), {})
        slots = 1
        if path == BATCH_PATH:
            body, receive = await _read_body(receive)
            slots = _batch_items(body)

        admitted = self.admission.admit(request_id, slots, owner=key_digest(request_headers) if self.keyed else None)
        if isinstance(admitted, Rejection):
            metrics.rejected.labels(reason=admitted.reason).inc()
            headers = {REQUEST_ID_HEADER: request_id}
            if admitted.status == 503:
                headers["retry-after"] = str(retry_after_s())
            body = error_body(admitted.status, admitted.message, _ERROR_TYPES[admitted.status])
            return await _respond(send, admitted.status, body, headers)

        entry = admitted
        if request_headers.get(TRACE_HEADER, "").strip().lower() in TRUTHY:
            entry.trace = {"arrived": entry.admitted_at}
        exchange = _Exchange(send, entry, CancellableReceive(receive, entry))
        token = _CURRENT.set(SpeechContext(self.admission, entry))
        returned = False
        try:
            await self.app(scope, exchange.receive, exchange.send)
            returned = True
        finally:
            _CURRENT.reset(token)
            exchange.receive.close()
            # Engine requests first, then the slot: a cancel answers 200 only once the engine has dropped them.
            await entry.close_outputs()
            entry.outcome = exchange.outcome()
            if entry.outcome == "client_error":
                metrics.rejected.labels(reason="bad_request").inc()
            metrics.finished.labels(outcome=entry.outcome).inc()
            self.admission.release(entry)
            _log_trace(entry)
        if returned:
            # After the release: a client that is not reading must not hold the slot (or the cancel) hostage.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(exchange.end_cancelled_stream(), END_STREAM_TIMEOUT_S)


def _log_trace(entry: ActiveSpeech) -> None:
    if entry.trace is None:
        return
    entry.stamp("end")
    points = " ".join(f"{point}={entry.trace[point]:.6f}" for point in TRACE_POINTS if point in entry.trace)
    logger.info("%s request_id=%s outcome=%s %s", TRACE_TAG, entry.request_id, entry.outcome, points)


def install(app: Any) -> SpeechAdmission:
    """Put the guard and the cancel route on a freshly built FastAPI app (before it serves anything)."""
    from vllm.entrypoints.serve.utils.server_utils import AuthenticationMiddleware

    admission = SpeechAdmission()
    app.state.kani_speech_admission = admission
    # vLLM's --api-key / VLLM_API_KEY check, when configured, is already on the stack: it guards every path under /v1
    # (the cancel route included) and answers 401 before the guard is reached.
    keyed = any(middleware.cls is AuthenticationMiddleware for middleware in app.user_middleware)
    # Appended, not add_middleware(): innermost, so CORS/auth/vLLM middleware run first.
    app.user_middleware.append(Middleware(SpeechGuardMiddleware, admission=admission, keyed=keyed))
    # vLLM's SageMaker bootstrap already built the stack once; Starlette rebuilds it on the first call when unset.
    app.middleware_stack = None
    app.add_api_route(
        CANCEL_PATH,
        cancel_speech,
        methods=["POST"],
        summary="Cancel an active speech request by its X-Request-Id",
        tags=["audio"],
    )
    speech_metrics()
    return admission


def configure(state: Any) -> int | None:
    """Size the admission limit from the served pipeline, once the app state (the speech server) exists.

    Stage 0 runs ``max_num_seqs`` requests per replica, so data-parallel pipelines (``num_replicas`` on Stage 0)
    admit that many times more.
    """
    admission: SpeechAdmission | None = getattr(state, "kani_speech_admission", None)
    if admission is None:
        return None
    max_num_seqs = None
    speech = getattr(state, "openai_serving_speech", None)
    stage = getattr(speech, "_tts_stage", None)
    if stage is None:
        stages = getattr(getattr(state, "engine_client", None), "stage_configs", None) or []
        stage = stages[0] if stages else None
    if stage is not None:
        max_num_seqs = getattr(getattr(stage, "engine_args", None), "max_num_seqs", None)
    replicas = next(iter(stage_replicas(getattr(state, "engine_client", None))), 1)
    running = int(max_num_seqs) * replicas if max_num_seqs else None
    limit = resolve_limit(running)
    admission.configure(limit, running=running)
    logger.info(
        "speech admission: %s concurrent speech requests (Stage 0 max_num_seqs=%s x %d replica%s)",
        f"at most {limit}" if limit else "no limit on",
        max_num_seqs,
        replicas,
        "" if replicas == 1 else "s",
    )
    return limit


def stage_replicas(engine_client: Any) -> list[int]:
    """Each stage's configured replica count, in stage order (vLLM-Omni's stage pools; a pool that does not say counts
    1, and an engine without pools gives an empty list)."""
    pools = getattr(getattr(engine_client, "engine", None), "stage_pools", None) or []
    counts = [getattr(pool, "num_replicas", 1) for pool in pools]
    return [count if isinstance(count, int) and count > 0 else 1 for count in counts]
