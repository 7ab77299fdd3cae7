"""Request ids and explicit cancellation of speech requests.

Every speech response carries ``X-Request-Id``: the client's own (checked: 1-128 characters of ``A-Z a-z 0-9 . _ :
-``, starting with a letter or digit, not in use by another active request) or a generated one. The engine request
is named ``speech-<X-Request-Id>``, so server logs and the engine's abort messages can be matched to a client's id.

``POST /v1/audio/speech/{request_id}/cancel`` cancels an active request the same way a client disconnect does: the
handler sees ``http.disconnect`` on its receive channel, vLLM's cancellation machinery cancels the handler (or the
streaming body), and vLLM-Omni's ``generate`` aborts the request in every stage. One mechanism for both means an
explicit cancel frees exactly what a disconnect frees. The cancelled request's own response then ends: a
non-streaming one with 499 ("client closed request", gRPC's CANCELLED), a stream cleanly after the audio already
sent (an SSE stream first gets a ``speech.audio.error`` event with code 499).

With ``vllm serve --api-key`` every route under ``/v1`` (these included) is checked by vLLM's own
``AuthenticationMiddleware`` before the speech middleware sees it. Several keys may be given; a request then belongs
to the key it came with, and a cancel with another key finds nothing (404, as for an id that is not active).
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import secrets
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse
from starlette.datastructures import Headers
from starlette.types import Message, Receive

from vllm_omni_kani.entrypoints.openai.admission import ActiveSpeech

REQUEST_ID_HEADER = "x-request-id"
MAX_REQUEST_ID_CHARS = 128
_REQUEST_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]*")
CANCEL_PATH = "/v1/audio/speech/{request_id}/cancel"
# How long the cancel endpoint waits for the request to be gone before answering 202 instead of 200.
CANCEL_WAIT_S = 10.0
CANCELLED_STATUS = 499


def check_request_id(value: str) -> str | None:
    """Why ``value`` cannot be a request id, or None when it can."""
    if not value or len(value) > MAX_REQUEST_ID_CHARS or not _REQUEST_ID.fullmatch(value):
        return (
            f"Invalid X-Request-Id: use 1-{MAX_REQUEST_ID_CHARS} characters of A-Z, a-z, 0-9, '.', '_', ':' "
            "and '-', starting with a letter or digit."
        )
    return None


def key_digest(headers: Headers) -> bytes:
    """SHA-256 of the request's ``Authorization: Bearer`` token (b"" without one), hashed as vLLM's auth hashes it.

    Behind vLLM's ``AuthenticationMiddleware``, which has already checked the token against ``--api-key``, it says
    which key a request came with, without keeping the key itself.
    """
    scheme, _, token = headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer":
        return b""
    return hashlib.sha256(token.encode("utf-8")).digest()


def error_body(status: int, message: str, err_type: str) -> dict[str, Any]:
    """vLLM's error shape, so OpenAI clients read these like any other API error."""
    return {"error": {"message": message, "type": err_type, "param": None, "code": status}}


class CancellableReceive:
    """An ASGI ``receive`` that reports ``http.disconnect`` once the request is cancelled.

    The real ``receive`` runs in a task of its own that is kept across calls, so a cancelled wait (vLLM's
    ``with_cancellation`` and Starlette's streaming response both cancel their disconnect listener) loses no message.
    ``close()`` must be called when the request ends, to cancel that task.
    """

    def __init__(self, receive: Receive, entry: ActiveSpeech) -> None:
        self._receive = receive
        self._entry = entry
        self._pending: asyncio.Future[Message] | None = None
        self.disconnected = False  # the client itself went away

    async def __call__(self) -> Message:
        cancel = self._entry.cancel_requested
        if cancel.is_set():
            return {"type": "http.disconnect"}
        if self._pending is None:
            self._pending = asyncio.ensure_future(self._receive())
        cancelled = asyncio.ensure_future(cancel.wait())
        try:
            await asyncio.wait((self._pending, cancelled), return_when=asyncio.FIRST_COMPLETED)
        finally:
            cancelled.cancel()
        if not self._pending.done():
            return {"type": "http.disconnect"}
        message, self._pending = self._pending.result(), None
        if message["type"] == "http.disconnect":
            self.disconnected = True
        elif message["type"] == "http.request" and not message.get("more_body", False):
            self._entry.stamp("body")  # traced requests: when the app had the whole body
        return message

    def close(self) -> None:
        if self._pending is not None and not self._pending.done():
            self._pending.cancel()
        self._pending = None


async def cancel_speech(request_id: str, raw_request: Request) -> JSONResponse:
    """Cancel an active speech request by its ``X-Request-Id``; waits (up to 10 s) until it is gone.

    200 ``{"id", "status"}`` once released (status ``cancelled``, or ``ok`` when it finished first), 202 while still
    cancelling, 404 for an id that is not active, not a valid request id, or (with several API keys) another key's.
    """
    admission = raw_request.app.state.kani_speech_admission
    entry = admission.get(request_id) if check_request_id(request_id) is None else None
    owner = entry.owner if entry is not None else None
    if owner is not None and not secrets.compare_digest(owner, key_digest(raw_request.headers)):
        entry = None  # another key's request: answered as one that does not exist
    if entry is None:
        message = "No active speech request with this id."  # the id is not echoed: it may not be a valid one
        return JSONResponse(error_body(404, message, "NotFoundError"), status_code=404)
    entry.cancel_requested.set()
    try:
        await asyncio.wait_for(entry.released.wait(), CANCEL_WAIT_S)
    except TimeoutError:
        return JSONResponse({"id": request_id, "status": "cancelling"}, status_code=202)
    return JSONResponse({"id": request_id, "status": entry.outcome or "cancelled"})
