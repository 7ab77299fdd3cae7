"""API keys: `vllm serve --api-key` guards every speech route the way it guards `/v1/audio/speech`.

A real `vllm serve CKPT --omni --deploy-config stage_configs/kani_tts_cpu.yaml --api-key KEY OTHER_KEY` server (two
keys, vLLM accepts several) and real HTTP clients. vLLM's own ``AuthenticationMiddleware`` checks every path under
``/v1``; the plugin's speech middleware sits inside it, so a request without a valid key is answered 401 before it
can take an admission slot, be cancelled or cancel anything. A request belongs to the key it came with: a cancel
with the other key finds nothing. The admission limit is set to 2 so that filling it costs two streams.
"""

from __future__ import annotations

import asyncio
import base64
import io
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import soundfile as sf

from vllm_omni_kani.entrypoints.openai.admission import ENV_MAX_CONCURRENT
from vllm_omni_kani.entrypoints.openai.metrics import REJECT_REASONS, sample_value
from vllm_omni_kani.model_executor.models.kani_tts.configuration import SAMPLE_RATE, SAMPLES_PER_FRAME

pytestmark = [pytest.mark.server, pytest.mark.engine]
DEPLOY = "kani_tts_cpu.yaml"
KEY, OTHER_KEY = "kani-test-key", "kani-other-key"
LIMIT = 2
FRAMES = 4
TEXT = "Hello from Kani."
AUTH = {"Authorization": f"Bearer {KEY}"}
# Turned away by vLLM: no header, a wrong key, the right key under another scheme or without one.
BAD_AUTH = [
    {},
    {"Authorization": "Bearer wrong-key"},
    {"Authorization": f"Bearer {KEY}x"},
    {"Authorization": f"Basic {KEY}"},
    {"Authorization": KEY},
]
ACTIVE = "kani:speech_requests_active"

# Every speech route of the server: (method, path, request arguments). The cancel route is the plugin's.
ROUTES = {
    "speech": ("POST", "/v1/audio/speech", {"json": {"input": TEXT, "max_new_tokens": FRAMES}}),
    "speech-stream": (
        "POST",
        "/v1/audio/speech",
        {"json": {"input": TEXT, "max_new_tokens": FRAMES, "response_format": "pcm", "stream_format": "audio"}},
    ),
    "batch": ("POST", "/v1/audio/speech/batch", {"json": {"items": [{"input": TEXT}], "max_new_tokens": FRAMES}}),
    "cancel": ("POST", "/v1/audio/speech/some-request/cancel", {}),
    "voices": ("GET", "/v1/audio/voices", {}),
    "voice-upload": ("POST", "/v1/audio/voices", {"data": {"name": "mine", "consent": "yes"}}),
    "voice-delete": ("DELETE", "/v1/audio/voices/mine", {}),
}


@pytest.fixture(scope="module")
def server(omni_server, tiny_parallel):
    return omni_server(tiny_parallel, DEPLOY, ("--api-key", KEY, OTHER_KEY), {ENV_MAX_CONCURRENT: str(LIMIT)})


@pytest.fixture(scope="module")
def client():
    with httpx.Client(timeout=300) as c:
        yield c


def guard_counters(client: httpx.Client, server) -> dict[str, float]:
    """The speech middleware's counters: anything it turned away or saw finish, and the slots in use."""
    text = client.get(f"{server.base_url}/metrics").text
    counters = {r: sample_value(text, "kani:speech_requests_rejected_total", {"reason": r}) for r in REJECT_REASONS}
    counters["finished"] = sum(
        sample_value(text, "kani:speech_requests_finished_total", {"outcome": o}) or 0.0
        for o in ("ok", "cancelled", "disconnected", "client_error", "server_error")
    )
    counters[ACTIVE] = sample_value(text, ACTIVE)
    return counters


def assert_unauthorized(response: httpx.Response) -> None:
    assert response.status_code == 401, response.text
    assert response.json() == {"error": "Unauthorized"}  # vLLM's answer, not the speech middleware's
    assert "x-request-id" not in response.headers  # the speech middleware stamps every response it sees


def test_health_and_metrics_stay_open_as_vllm_decides(server, client):
    from vllm.entrypoints.serve.utils.server_utils import GUARDED_PREFIX

    # vLLM checks keys on these prefixes only; /health and /metrics are outside them, and answer without a key.
    assert "/v1" in GUARDED_PREFIX
    assert not "/health".startswith(GUARDED_PREFIX) and not "/metrics".startswith(GUARDED_PREFIX)
    assert client.get(f"{server.base_url}/health").status_code == 200
    metrics = client.get(f"{server.base_url}/metrics")
    assert metrics.status_code == 200
    assert sample_value(metrics.text, "kani:speech_max_concurrent_requests") == LIMIT
    # Everything under /v1 needs the key, vLLM's own routes included.
    assert_unauthorized(client.get(f"{server.base_url}/v1/models"))
    assert client.get(f"{server.base_url}/v1/models", headers=AUTH).status_code == 200


@pytest.mark.parametrize("route", list(ROUTES))
def test_every_speech_route_answers_401_without_the_key(server, client, route):
    before = guard_counters(client, server)
    method, path, kwargs = ROUTES[route]
    for headers in BAD_AUTH:
        # An invalid X-Request-Id too: auth answers first, the request-id check (a 400) is never reached.
        for extra in ({}, {"X-Request-Id": "not a valid id"}):
            assert_unauthorized(client.request(method, server.base_url + path, headers={**headers, **extra}, **kwargs))
    assert guard_counters(client, server) == before  # nothing was admitted, rejected or finished


def test_with_the_key_every_speech_route_works(server, client):
    url = server.base_url
    wav = client.post(url + "/v1/audio/speech", headers=AUTH, json={"input": TEXT, "max_new_tokens": FRAMES})
    assert wav.status_code == 200 and wav.headers["content-type"] == "audio/wav", wav.text
    assert wav.headers["x-request-id"]
    data, rate = sf.read(io.BytesIO(wav.content), dtype="int16")
    assert rate == SAMPLE_RATE and len(data) == FRAMES * SAMPLES_PER_FRAME

    method, path, kwargs = ROUTES["speech-stream"]
    with client.stream(method, url + path, headers={**AUTH, "X-Request-Id": "streamed-1"}, **kwargs) as stream:
        assert stream.status_code == 200 and stream.headers["x-request-id"] == "streamed-1"
        pcm = b"".join(stream.iter_bytes())
    assert len(pcm) == FRAMES * SAMPLES_PER_FRAME * 2  # 16-bit mono

    method, path, kwargs = ROUTES["batch"]
    batch = client.request(method, url + path, headers=AUTH, **kwargs)
    assert batch.status_code == 200, batch.text
    (item,) = batch.json()["results"]
    assert len(sf.read(io.BytesIO(base64.b64decode(item["audio_data"])))[0]) == FRAMES * SAMPLES_PER_FRAME

    voices = client.get(url + "/v1/audio/voices", headers=AUTH)
    assert voices.status_code == 200 and "katie" in voices.json()["voices"]
    # vLLM-Omni's voice upload and delete get past auth and answer for themselves (Kani has no uploaded voices).
    method, path, kwargs = ROUTES["voice-upload"]
    upload = client.request(method, url + path, headers=AUTH, **kwargs)
    assert upload.status_code == 400 and "audio_sample" in upload.json()["error"]["message"]
    assert client.delete(url + "/v1/audio/voices/mine", headers=AUTH).status_code == 404

    # The cancel route gets past auth too: an id that is not active is a 404, an invalid one is not echoed back.
    missing = client.post(url + "/v1/audio/speech/some-request/cancel", headers=AUTH)
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "NotFoundError"
    odd = client.post(url + "/v1/audio/speech/a%0Ab%3Cscript%3E/cancel", headers=AUTH)
    assert odd.status_code == 404 and "script" not in odd.text
    # The other key is as good as the first.
    other = client.get(url + "/v1/audio/voices", headers={"Authorization": f"Bearer {OTHER_KEY}"})
    assert other.status_code == 200


def test_the_openai_client_streams_with_the_key(server):
    from openai import AuthenticationError, OpenAI

    def speak(api_key: str) -> bytes:
        client = OpenAI(base_url=f"{server.base_url}/v1", api_key=api_key, max_retries=0)
        with client.audio.speech.with_streaming_response.create(
            model=server.model,
            voice="katie",
            input=TEXT,
            response_format="pcm",
            stream_format="audio",
            extra_body={"max_new_tokens": FRAMES},
        ) as response:
            return response.read()

    assert len(speak(KEY)) == FRAMES * SAMPLES_PER_FRAME * 2
    with pytest.raises(AuthenticationError):
        speak("EMPTY")


def test_the_speech_websocket_needs_the_key_too(server):
    """vLLM-Omni's streaming-speech WebSocket is under /v1: vLLM refuses the handshake without a key."""
    websockets = pytest.importorskip("websockets.asyncio.client")
    from websockets.exceptions import InvalidStatus

    url = server.base_url.replace("http://", "ws://") + "/v1/audio/speech/stream"

    async def handshake(headers: dict[str, str]) -> int:
        try:
            async with websockets.connect(url, additional_headers=headers, open_timeout=60):
                return 101
        except InvalidStatus as error:
            return error.response.status_code

    assert asyncio.run(handshake({})) == 401
    assert asyncio.run(handshake({"Authorization": "Bearer wrong-key"})) == 401
    assert asyncio.run(handshake(AUTH)) == 101


def test_without_the_key_nothing_takes_a_slot_or_cancels(server, client):
    """Fill the admission limit with two keyed streams, then knock without a key and cancel with the wrong ones.

    Every unauthenticated request is 401, never the 503 a keyed request gets at the full limit: auth runs before
    admission. The streams survive cancels without a key, with a wrong key and with the other key (404: the
    request is not that key's), and end on a cancel with their own key.
    """
    url = server.base_url
    deadline = time.monotonic() + 30
    while (before := guard_counters(client, server))[ACTIVE] != 0:  # earlier requests are released
        assert time.monotonic() < deadline, before
        time.sleep(0.1)
    long = {"input": TEXT, "max_new_tokens": 1500, "temperature": 0.0, "response_format": "pcm"}
    ids = [f"held-{i}" for i in range(LIMIT)]
    streams, readers = [], []
    try:
        for request_id in ids:
            request = client.build_request(
                "POST",
                url + "/v1/audio/speech",
                json={**long, "stream_format": "audio"},
                headers={**AUTH, "X-Request-Id": request_id},
            )
            streams.append(client.send(request, stream=True))
            readers.append(streams[-1].iter_bytes())  # kept: a dropped iterator closes its stream
            assert streams[-1].status_code == 200 and next(readers[-1])  # admitted, audio flowing
        assert guard_counters(client, server)[ACTIVE] == LIMIT

        with httpx.Client(timeout=60) as other, ThreadPoolExecutor(8) as pool:
            futures = [
                pool.submit(other.request, method, url + path, headers=headers, **kwargs)
                for method, path, kwargs in list(ROUTES.values()) * 2
                for headers in BAD_AUTH[:2]
            ]
            for future in futures:
                assert_unauthorized(future.result())
        full = client.post(url + "/v1/audio/speech", headers=AUTH, json={"input": TEXT, "max_new_tokens": FRAMES})
        assert full.status_code == 503 and full.headers["retry-after"], full.text

        for request_id, reader in zip(ids, readers, strict=True):
            cancel_url = f"{url}/v1/audio/speech/{request_id}/cancel"
            for headers in BAD_AUTH:
                assert_unauthorized(client.post(cancel_url, headers=headers))
            foreign = client.post(cancel_url, headers={"Authorization": f"Bearer {OTHER_KEY}"})
            assert foreign.status_code == 404, foreign.text
            assert next(reader)  # still streaming
            cancel = client.post(cancel_url, headers=AUTH)
            assert cancel.status_code == 200 and cancel.json() == {"id": request_id, "status": "cancelled"}
            b"".join(reader)  # the stream ends cleanly
    finally:
        for stream in streams:
            stream.close()

    after = guard_counters(client, server)
    assert after[ACTIVE] == 0
    assert after["overloaded"] == before["overloaded"] + 1  # the keyed probe only
    assert all(after[reason] == before[reason] for reason in REJECT_REASONS if reason != "overloaded")
    assert after["finished"] == before["finished"] + LIMIT  # the two streams, nothing else
