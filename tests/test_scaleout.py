"""Scale-out on vLLM-Omni's own machinery, on CPU over real HTTP on 127.0.0.1 (docs/DEPLOY.md).

- The multi-node layout as two processes on one machine: ``vllm serve --stage-id 0 --omni-master-address ...`` (API
  server and Stage 0, the head) and ``vllm serve --headless --stage-id 1 ...`` (the codec), both reading
  ``kani_tts_cpu.yaml``. Chunks still travel through shared memory (one host); the control plane is the one a real
  multi-node deploy uses: the head's OmniMasterServer (registration), OmniCoordinator (heartbeats) and remote
  engine-core clients.
- Two Stage-1 replicas behind one Stage 0 in one server (``kani_tts_cpu_codec_replicas.yaml``).
- Two full pipelines data-parallel behind one API server (``kani_tts_cpu_dp.yaml``): admission counts both, and the
  start-up warm-up reaches every engine.

Stage 1 is stateful: a request's chunks must all reach the replica that holds its decoder state, which refuses a
stream that does not start at chunk 0 ("starts at chunk N, not 0" in the log). vLLM-Omni binds each request to one
Stage-1 replica when Stage 0 admits it and only that replica reads the request's chunks; these tests check the audio
(concurrent seeded requests equal their solo runs, across replicas) and that no chunk was refused.
Factory checkpoints never stop by themselves, so every request bounds its length with ``max_new_tokens``.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import httpx
import numpy as np
import psutil
import pytest
import soundfile as sf

from tests.server_utils import _BASE_ENV, REPO_ROOT, STAGE_CONFIGS, ServeProcess, free_port, vllm_executable
from tests.server_utils import wait_for as _wait_for
from vllm_omni_kani.benchmarks.server import serve_argv
from vllm_omni_kani.entrypoints.openai.metrics import sample_value
from vllm_omni_kani.model_executor.models.kani_tts.configuration import SAMPLE_RATE, SAMPLES_PER_FRAME

pytestmark = [pytest.mark.server, pytest.mark.engine]

SPLIT_DEPLOY = "kani_tts_cpu.yaml"
REPLICAS_DEPLOY = "kani_tts_cpu_codec_replicas.yaml"
DP_DEPLOY = "kani_tts_cpu_dp.yaml"
TEXT = "Hello world, this is Kani speaking."
# Greedy: the random weights never end it early; a stream of it is still running when it is cancelled or cut.
LONG = {"input": TEXT, "max_new_tokens": 1500, "temperature": 0.0, "response_format": "pcm", "stream_format": "audio"}
# The head marks a replica gone after this long without a heartbeat (vLLM-Omni's default is 30 s; replicas beat
# every 5 s, so 15 s leaves two missed beats of slack on a loaded 2-core box).
HEARTBEAT_TIMEOUT_S = 15
# Logged by the codec stage for a chunk it refuses (a stream that reached a replica without its first chunk, a chunk
# out of order, no free state slot): none may appear.
REFUSED = "Kani codec: request"
# Logged by vLLM-Omni's orchestrator when a stage's last replica died and it stopped the whole pipeline.
ENGINE_STOPPED = "[Orchestrator] Engine dead during shutdown"


# --- helpers --------------------------------------------------------------------------------------------------------


def speech(base_url: str, timeout: float = 300, headers: dict | None = None, **body) -> httpx.Response:
    body.setdefault("max_new_tokens", 8)
    return httpx.post(f"{base_url}/v1/audio/speech", json=body, headers=headers, timeout=timeout)


def pcm_of(response: httpx.Response) -> np.ndarray:
    assert response.status_code == 200, response.text
    data, rate = sf.read(io.BytesIO(response.content), dtype="int16")
    assert rate == SAMPLE_RATE
    return data


def seeded_body(i: int) -> dict:
    return {"input": f"Request {i} says something of its own.", "seed": 1000 + i, "temperature": 0.8, "top_k": 50}


def assert_same_audio(got: np.ndarray, want: np.ndarray, what: str) -> None:
    """The same frames, decoded: equal length and samples, up to float rounding in a batch of another shape (a
    different frame would change ~1,764 samples by far more; tests/test_reliability.py has the same check)."""
    assert got.shape == want.shape, what
    diff = np.abs(got.astype(np.int32) - want.astype(np.int32))
    assert diff.max() <= 2 and (diff == 0).mean() > 0.99, f"{what}: max diff {diff.max()}"


def metrics_text(base_url: str) -> str:
    return httpx.get(f"{base_url}/metrics", timeout=60).text


def stage1_finished(base_url: str, replicas: int) -> list[float]:
    """Requests each Stage-1 replica has finished so far (vLLM's per-engine counter, labelled stage and replica)."""
    text = metrics_text(base_url)
    name = "vllm:e2e_request_latency_seconds_count"
    return [sample_value(text, name, {"stage": "1", "replica": str(r)}) or 0.0 for r in range(replicas)]


def stage1_running(base_url: str, replicas: int) -> list[float | None]:
    text = metrics_text(base_url)
    return [sample_value(text, "vllm:num_requests_running", {"stage": "1", "replica": str(r)}) for r in range(replicas)]


def assert_freed(base_url: str, replicas: int) -> None:
    """Nothing admitted in the API server, nothing running or waiting in the pipeline, and no Stage-1 replica still
    counting a cancelled stream.

    An engine's gauges change only when it steps (on throttled ticks), so the caller has just run one request on every
    replica: a replica's gauge may still count that request, but would count 2 if the cancelled stream were still there.
    """
    text = metrics_text(base_url)
    assert sample_value(text, "kani:speech_requests_active") == 0
    assert sample_value(text, "vllm_omni:num_requests_running") == 0
    assert sample_value(text, "vllm_omni:num_requests_waiting") == 0
    running = stage1_running(base_url, replicas)
    assert all(value is not None and value <= 1 for value in running), running


def wait_for(predicate: Callable[[], bool], timeout_s: float) -> float:
    """``server_utils.wait_for`` polling every 0.2 s: each poll here may read /metrics of a loaded 2-core box."""
    return _wait_for(predicate, timeout_s, interval_s=0.2)


def aborted_in_engine(log_text: str, request_id: str) -> bool:
    """vLLM-Omni's orchestrator aborted ``speech-<request_id>`` (it aborts it on every stage's bound replica)."""
    pattern = rf"\[Orchestrator\] Aborted request\(s\) \[[^\]]*'speech-{re.escape(request_id)}(-[0-9a-f]{{8}})?'"
    return re.search(pattern, log_text) is not None


def connector_files(request_id: str) -> set[str]:
    """The request's chunk segments and lock files in /dev/shm (SharedMemoryConnector: ``<engine id>_<stage>_<n>``)."""
    key = rf"speech-{re.escape(request_id)}-[0-9a-f]{{8}}_\d+_\d+"
    pattern = re.compile(rf"{key}|shm_{key}_lockfile\.lock")
    return {name for name in os.listdir("/dev/shm") if pattern.fullmatch(name)}


def open_stream(client: httpx.Client, base_url: str, request_id: str):
    """A long raw-PCM stream, started: returns (response, its byte iterator) once the first audio has arrived."""
    request = client.build_request(
        "POST", f"{base_url}/v1/audio/speech", json=LONG, headers={"X-Request-Id": request_id}
    )
    response = client.send(request, stream=True)
    assert response.status_code == 200, response.read()
    chunks = response.iter_bytes()
    assert next(chunks)
    return response, chunks


def concurrent_equals_solo(base_url: str, count: int) -> None:
    solo = [pcm_of(speech(base_url, **seeded_body(i))) for i in range(count)]
    with ThreadPoolExecutor(count) as pool:
        together = list(pool.map(lambda i: speech(base_url, **seeded_body(i)), range(count)))
    for i, (response, want) in enumerate(zip(together, solo, strict=True)):
        assert_same_audio(pcm_of(response), want, f"request {i}")
    assert len({a.tobytes() for a in solo}) == count


class Headless:
    """``vllm serve CKPT --omni --headless --stage-id N ...`` in a process group of its own (no HTTP: it registers with
    the head's master and serves the stage through the head's sockets)."""

    def __init__(self, log_path: Path) -> None:
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, ckpt: Path, deploy: str, extra_args: list[str]) -> None:
        # serve_argv's --host/--port are the API server's; a headless process has none and ignores them.
        argv = serve_argv([vllm_executable()], str(ckpt), str(STAGE_CONFIGS / deploy), free_port(), 900, extra_args)
        env = dict(os.environ)
        for key, value in _BASE_ENV.items():
            if value is None:
                env.pop(key, None)
            else:
                env[key] = value
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                argv, cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, process_group=0
            )

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def processes(self) -> list[psutil.Process]:
        found = []
        for p in psutil.process_iter():
            with contextlib.suppress(psutil.Error):
                if self.proc is not None and os.getpgid(p.pid) == self.proc.pid:
                    found.append(p)
        return found

    def kill(self) -> None:
        """SIGKILL every process of the group at once: what the head sees when a codec host goes away."""
        assert self.proc is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        psutil.wait_procs(self.processes(), timeout=10)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)

    def stop(self, grace_s: float = 60.0) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        _, alive = psutil.wait_procs(self.processes(), timeout=grace_s)
        if alive:
            self.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)


# --- the multi-node layout as two processes on loopback --------------------------------------------------------------


@pytest.fixture(scope="class")
def split(tiny_parallel, tmp_path_factory):
    """A head (API server + Stage 0) and a headless Stage-1 process on one machine; the head is healthy only once the
    headless replica has registered, connected and started."""
    logs = tmp_path_factory.mktemp("scaleout-split")
    master = ["--omni-master-address", "127.0.0.1", "--omni-master-port", str(free_port())]
    headless = Headless(logs / "headless.log")
    head = ServeProcess(logs / "head.log")
    # Started first: it waits (up to 300 s) for the head's master to answer its registration.
    headless.start(tiny_parallel, SPLIT_DEPLOY, [*master, "--headless", "--stage-id", "1"])
    try:
        try:
            head.start(
                tiny_parallel,
                SPLIT_DEPLOY,
                [*master, "--stage-id", "0", "--omni-heartbeat-timeout", str(HEARTBEAT_TIMEOUT_S)],
            )
        except Exception as exc:
            raise AssertionError(f"{exc}\n--- headless log tail ---\n{headless.log_text()[-6000:]}") from exc
        yield SimpleNamespace(head=head, headless=headless, url=head.base_url)
    finally:
        headless.stop()
        # With its Stage-1 replica gone the head takes up to a minute to stop (its orchestrator waits for that
        # replica's client); a slow stop is tolerated, a process left behind is not.
        try:
            head.stop(grace_s=120)
        except RuntimeError as exc:
            if "survived" in str(exc):
                raise


class TestHeadAndHeadlessStage1:
    """The head and the headless process live as long as this class: the last test kills the headless one."""

    def test_a_headless_stage_1_serves_concurrent_seeded_requests_equal_to_their_solo_audio(self, split):
        assert "Remote LLM replica attached stage=1" in split.head.log_text()
        before = stage1_finished(split.url, 1)
        concurrent_equals_solo(split.url, 6)
        assert stage1_finished(split.url, 1)[0] - before[0] == 12
        assert REFUSED not in split.headless.log_text()

    def test_a_cancel_on_the_head_frees_the_request_on_the_headless_stage_too(self, split):
        request_id = "split-cancel"
        with httpx.Client(timeout=120) as client:
            stream, chunks = open_stream(client, split.url, request_id)
            try:
                cancel = client.post(f"{split.url}/v1/audio/speech/{request_id}/cancel")
                assert cancel.json() == {"id": request_id, "status": "cancelled"}
                rest = b"".join(chunks)
            finally:
                stream.close()
        assert len(rest) < 1500 * SAMPLES_PER_FRAME * 2
        wait_for(lambda: aborted_in_engine(split.head.log_text(), request_id), 10)
        wait_for(lambda: not connector_files(request_id), 10)
        # An engine's gauges are refreshed by its steps: one more request runs on both stages.
        assert pcm_of(speech(split.url, input=TEXT, max_new_tokens=12)).size == 12 * SAMPLES_PER_FRAME
        assert_freed(split.url, replicas=1)
        assert REFUSED not in split.headless.log_text()

    def test_killing_the_headless_process_ends_its_streams_with_an_error_and_the_head_reports_unhealthy(self, split):
        """No hang: the stream in flight fails once the head misses the replica's heartbeats, /health turns 503 and new
        requests are answered at once with an error. vLLM-Omni 0.26.0 does not recover by itself (docs/DEPLOY.md,
        "When a replica dies"): take the server out of the load balancer on /health and restart it."""
        request_id = "split-killed"
        with httpx.Client(timeout=120) as client:
            stream, chunks = open_stream(client, split.url, request_id)
            killed = time.monotonic()
            split.headless.kill()
            error: Exception | None = None
            try:
                rest = b"".join(chunks)
            except httpx.HTTPError as exc:  # the server closes the chunked body unfinished
                error, rest = exc, b""
            finally:
                stream.close()
            ended_s = time.monotonic() - killed
        assert error is not None or len(rest) < 1500 * SAMPLES_PER_FRAME * 2
        assert ended_s < HEARTBEAT_TIMEOUT_S + 30, ended_s
        assert "stage replica disappeared" in split.head.log_text() or ENGINE_STOPPED in split.head.log_text()
        assert httpx.get(f"{split.url}/health", timeout=30).status_code == 503
        started = time.monotonic()
        r = speech(split.url, timeout=30, input=TEXT, max_new_tokens=3)
        assert r.status_code >= 500 and time.monotonic() - started < 10, (r.status_code, r.text)
        assert split.head.running
        # Two ways this ends, by which notices the loss first: the heartbeat watcher detaches the replica and the
        # request is aborted on Stage 0 (the orchestrator stays up, the engine errored), or the orchestrator's poll of
        # the now-closed replica client raises EngineDeadError with no replica left for the stage and the orchestrator
        # stops every stage. Either way none of the request's chunks is left for a reader that is gone.
        log = split.head.log_text
        wait_for(lambda: aborted_in_engine(log(), request_id) or ENGINE_STOPPED in log(), 10)
        wait_for(lambda: not connector_files(request_id), 30)


# --- two Stage-1 replicas behind one Stage 0 -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def replicas(omni_server, tiny_parallel):
    return omni_server(tiny_parallel, REPLICAS_DEPLOY)


def test_two_codec_replicas_share_the_streams_and_each_request_keeps_its_solo_audio(replicas):
    url = replicas.base_url
    assert "Stage 1: 2 replicas" in replicas.log_text()
    # The same seeded request twice in a row: round robin sends it to each replica once, and both decode it alike.
    before = stage1_finished(url, 2)
    first, second = (pcm_of(speech(url, **seeded_body(0))) for _ in range(2))
    after = stage1_finished(url, 2)
    assert [a - b for a, b in zip(after, before, strict=True)] == [1, 1]
    assert_same_audio(second, first, "the same request on the other replica")
    concurrent_equals_solo(url, 8)
    final = stage1_finished(url, 2)
    assert [a - b for a, b in zip(final, after, strict=True)] == [8, 8]
    assert REFUSED not in replicas.log_text()


def test_a_cancel_frees_the_request_on_stage_0_and_on_its_codec_replica(replicas):
    url = replicas.base_url
    ids = ["replica-cancel-0", "replica-cancel-1"]  # consecutive: one per replica
    with httpx.Client(timeout=120) as client:
        streams = [open_stream(client, url, request_id) for request_id in ids]
        wait_for(lambda: stage1_running(url, 2) == [1, 1], 10)
        try:
            for request_id in ids:
                cancel = client.post(f"{url}/v1/audio/speech/{request_id}/cancel")
                assert cancel.json() == {"id": request_id, "status": "cancelled"}
            for _, chunks in streams:
                b"".join(chunks)
        finally:
            for stream, _ in streams:
                stream.close()
    for request_id in ids:
        wait_for(lambda rid=request_id: aborted_in_engine(replicas.log_text(), rid), 10)
        wait_for(lambda rid=request_id: not connector_files(rid), 10)
    # One more request per replica (round robin) refreshes both replicas' gauges.
    for _ in range(2):
        assert pcm_of(speech(url, input=TEXT, max_new_tokens=12)).size == 12 * SAMPLES_PER_FRAME
    assert_freed(url, replicas=2)
    assert REFUSED not in replicas.log_text()


# --- two full pipelines, data-parallel behind one API server ---------------------------------------------------------


@pytest.fixture(scope="module")
def data_parallel(omni_server, tiny_parallel):
    return omni_server(tiny_parallel, DP_DEPLOY)


def stage_finished(base_url: str, stage: int, replicas: int) -> list[float]:
    text = metrics_text(base_url)
    name = "vllm:e2e_request_latency_seconds_count"
    return [sample_value(text, name, {"stage": str(stage), "replica": str(r)}) or 0.0 for r in range(replicas)]


def test_every_engine_serves_one_warm_up_request_before_the_server_listens(data_parallel):
    """At start-up the speech server sends one short request per replica (``warmup.py``), which round robin spreads
    over both pipelines: each of the four engines has finished exactly one before any client request, and none of
    them shows in the speech metrics. Runs before the module's other data-parallel test, on its fresh server."""
    text = metrics_text(data_parallel.base_url)
    for stage in (0, 1):
        assert stage_finished(data_parallel.base_url, stage, 2) == [1, 1], f"stage {stage}"
    assert "[KaniWarmup] 2 of 2 requests" in data_parallel.log_text()
    assert sample_value(text, "kani:speech_requests_finished_total", {"outcome": "ok"}) in (None, 0.0)
    for stream in ("true", "false"):
        assert not sample_value(text, "kani:speech_time_to_first_audio_seconds_count", {"stream": stream})
    assert not sample_value(text, "kani:speech_audio_seconds_total")


def test_data_parallel_pipelines_share_requests_and_admit_for_both(data_parallel):
    url = data_parallel.base_url
    # Stage 0 runs max_num_seqs (8) per replica: the API server admits for both (2 x 8 x queue factor 4).
    assert sample_value(metrics_text(url), "kani:speech_max_concurrent_requests") == 2 * 8 * 4
    assert "Stage 0 max_num_seqs=8 x 2 replicas" in data_parallel.log_text()
    before = [stage_finished(url, stage, 2) for stage in (0, 1)]
    concurrent_equals_solo(url, 6)  # 6 solo + 6 concurrent, alternating between the pipelines
    after = [stage_finished(url, stage, 2) for stage in (0, 1)]
    for stage in (0, 1):
        done = [a - b for a, b in zip(after[stage], before[stage], strict=True)]
        assert done == [6, 6], f"stage {stage} per replica: {done}"
    assert REFUSED not in data_parallel.log_text()
