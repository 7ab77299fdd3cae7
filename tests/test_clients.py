"""The example clients as a person runs them: each script in its own process, against the CPU server, over real HTTP.

`examples/online_serving/text_to_speech/kani_tts/`: ``speech_client.py`` (openai SDK), ``streaming_speech_client.py``
(raw PCM via httpx), ``llm_to_speech.py`` (sentence-by-sentence voice agent) and ``run_server.sh``. Every request
bounds its length with ``--max-new-tokens`` (factory checkpoints never end by themselves), so each file holds exactly
that many frames of 1,764 samples at 22,050 Hz.
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import shlex
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType

import httpx
import numpy as np
import pytest
import soundfile as sf

from tests.conftest import REPO_ROOT
from tests.server_utils import free_port

EXAMPLES = REPO_ROOT / "examples" / "online_serving" / "text_to_speech" / "kani_tts"
# The same deploy argument as tests/test_serving.py, so the session's one server is shared, not restarted.
DEPLOY = "kani_tts_cpu.yaml"
SAMPLE_RATE = 22050
SAMPLES_PER_FRAME = 1764
FRAMES = 20


@pytest.fixture(scope="module")
def server(omni_server, tiny_parallel):
    return omni_server(tiny_parallel, DEPLOY)


def run_example(
    script: str, *args: str, cwd: Path, timeout: float = 180, ok: bool = True
) -> subprocess.CompletedProcess:
    """Run one example script the way its README says; fail with its output when it fails unexpectedly."""
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / script), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    if ok:
        assert proc.returncode == 0, f"{script} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


def load_example(name: str) -> ModuleType:
    """Import an example script as a module (the examples folder is not a package)."""
    spec = importlib.util.spec_from_file_location(f"kani_example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def assert_frames(path: Path, frames: int, rate: int = SAMPLE_RATE) -> np.ndarray:
    data, sr = sf.read(path, dtype="int16")
    assert sr == rate
    assert data.ndim == 1
    assert len(data) == frames * SAMPLES_PER_FRAME * rate // SAMPLE_RATE
    assert np.abs(data).max() > 0
    return data


def pcm_frames(path: Path) -> int:
    size = path.stat().st_size
    assert size % (2 * SAMPLES_PER_FRAME) == 0
    return size // (2 * SAMPLES_PER_FRAME)


# -- speech_client.py (openai SDK) -----------------------------------------------------------------------------------
@pytest.mark.parametrize(("fmt", "rate"), [("wav", 22050), ("flac", 22050), ("mp3", 22050), ("opus", 24000)])
@pytest.mark.server
@pytest.mark.engine
def test_speech_client_writes_a_file_in_each_format(server, tmp_path, fmt, rate):
    out = tmp_path / f"hello.{fmt}"
    proc = run_example(
        "speech_client.py",
        *("--api-base", server.base_url, "--format", fmt, "--output", str(out), "--max-new-tokens", str(FRAMES)),
        cwd=tmp_path,
    )
    assert f"Saved {out}" in proc.stdout
    data, sr = sf.read(out, dtype="int16")
    assert sr == rate
    # Opus is resampled to 24 kHz on the server; lossy codecs keep the length.
    assert abs(len(data) - FRAMES * SAMPLES_PER_FRAME * rate / SAMPLE_RATE) < 1


@pytest.mark.parametrize(
    ("fmt", "stream_format"), [("wav", "audio"), ("pcm", "audio"), ("pcm", "sse")], ids=["wav", "pcm", "sse"]
)
@pytest.mark.server
@pytest.mark.engine
def test_speech_client_streams_to_a_file(server, tmp_path, fmt, stream_format):
    out = tmp_path / f"stream.{fmt}"
    proc = run_example(
        "speech_client.py",
        *("--api-base", server.base_url, "--stream", "--stream-format", stream_format, "--format", fmt),
        *("--output", str(out), "--max-new-tokens", str(FRAMES), "--voice", "katie", "--seed", "3"),
        cwd=tmp_path,
    )
    assert "TTFA:" in proc.stdout
    if fmt == "wav":
        assert_frames(out, FRAMES)
        # The streamed header's unknown sizes were replaced by the real ones.
        assert int.from_bytes(out.read_bytes()[40:44], "little") == FRAMES * SAMPLES_PER_FRAME * 2
    else:
        assert pcm_frames(out) == FRAMES


@pytest.mark.server
@pytest.mark.engine
def test_speech_client_lists_voices_and_explains_an_unknown_one(server, tmp_path):
    listed = run_example("speech_client.py", "--api-base", server.base_url, "--list-voices", cwd=tmp_path)
    voices = listed.stdout.split()
    assert voices == httpx.get(f"{server.base_url}/v1/audio/voices").json()["voices"]
    assert "katie" in voices
    bad = run_example(
        "speech_client.py",
        *("--api-base", server.base_url, "--voice", "nobody", "--max-new-tokens", "4"),
        cwd=tmp_path,
        ok=False,
    )
    assert bad.returncode != 0
    assert "400" in bad.stderr and "Unknown voice 'nobody'" in bad.stderr and "katie" in bad.stderr


# -- streaming_speech_client.py (raw PCM) ----------------------------------------------------------------------------
@pytest.mark.server
@pytest.mark.engine
def test_streaming_client_writes_chunks_as_they_arrive_and_prints_ttfa_and_rtf(server, tmp_path):
    frames = 40  # chunks of 3, 16, 16 and 5 frames (stage_configs/kani_tts_cpu.yaml)
    out = tmp_path / "stream.wav"
    proc = run_example(
        "streaming_speech_client.py",
        *("--api-base", server.base_url, "--output", str(out), "--max-new-tokens", str(frames), "--verbose"),
        cwd=tmp_path,
    )
    lines = proc.stdout.splitlines()
    ttfa = float(next(line for line in lines if line.startswith("TTFA:")).split()[1])
    rtf_line = next(line for line in lines if line.startswith("RTF:"))
    elapsed = float(rtf_line.split(" in ")[1].split()[0])
    chunk_times = [float(line.split()[0]) for line in lines if line.startswith("  ") and "of audio" in line]
    assert len(chunk_times) >= 2, proc.stdout  # more than one chunk: audio arrived while generating
    assert 0 < ttfa == chunk_times[0] < chunk_times[-1] <= elapsed + 0.005  # elapsed is printed to 10 ms
    assert float(rtf_line.split()[1]) > 0
    assert_frames(out, frames)


@pytest.mark.server
@pytest.mark.engine
def test_streaming_client_raw_pcm_and_resampled_output(server, tmp_path):
    out = tmp_path / "stream.pcm"
    run_example(
        "streaming_speech_client.py",
        *("--api-base", server.base_url, "--output", str(out), "--max-new-tokens", str(FRAMES)),
        cwd=tmp_path,
    )
    assert pcm_frames(out) == FRAMES
    wav16k = tmp_path / "stream16k.wav"
    run_example(
        "streaming_speech_client.py",
        *("--api-base", server.base_url, "-o", str(wav16k), "--max-new-tokens", str(FRAMES), "--sample-rate", "16000"),
        cwd=tmp_path,
    )
    assert_frames(wav16k, FRAMES, rate=16000)


def test_streaming_client_says_when_the_server_is_down(tmp_path):
    dead = f"http://127.0.0.1:{free_port()}"
    proc = run_example("streaming_speech_client.py", "--api-base", dead, "-o", "", cwd=tmp_path, ok=False)
    assert proc.returncode != 0
    assert f"cannot reach {dead}" in proc.stderr and "run_server.sh" in proc.stderr


# -- llm_to_speech.py (voice agent) ----------------------------------------------------------------------------------
ANSWER = (
    "Streaming speech feels fast because the first words play almost at once. "
    "The rest of the answer is generated while you listen. "
    "That is why voice agents speak sentence by sentence!"
)


@pytest.mark.server
@pytest.mark.engine
def test_llm_to_speech_speaks_a_slowly_read_file_sentence_by_sentence(server, tmp_path):
    source = tmp_path / "answer.txt"
    source.write_text(ANSWER + "\n")
    summary_path, out = tmp_path / "summary.json", tmp_path / "answer.wav"
    proc = run_example(
        "llm_to_speech.py",
        *("--api-base", server.base_url, "--text-file", str(source), "--chars-per-second", "30"),
        *("--max-new-tokens", str(FRAMES), "-o", str(out), "--summary-json", str(summary_path)),
        cwd=tmp_path,
    )
    summary = json.loads(summary_path.read_text())
    sentences = summary["sentences"]
    assert [s["text"] for s in sentences] == [
        "Streaming speech feels fast because the first words play almost at once.",
        "The rest of the answer is generated while you listen.",
        "That is why voice agents speak sentence by sentence!",
    ]
    assert all(s["error"] is None and s["audio_s"] == pytest.approx(FRAMES / 12.5) for s in sentences)
    # Audio starts after the first sentence, long before the text source has finished.
    assert sentences[0]["text_ready_s"] < summary["first_audio_s"] < summary["source_done_s"]
    assert summary["first_audio_s"] < sentences[-1]["text_ready_s"]
    assert "Spoke 3 of 3 sentences" in proc.stdout and "Time to first audio" in proc.stdout
    assert_frames(out, 3 * FRAMES)


class FakeUpstream(BaseHTTPRequestHandler):
    """An OpenAI-compatible chat model that streams slowly, and a TTS front that fails the first request with 503
    and then forwards to the real server: the chat-stream source and the retry path, over real HTTP."""

    protocol_version = "HTTP/1.1"
    tts_base = ""
    speech_calls = 0
    lock = threading.Lock()

    def log_message(self, *args: object) -> None:
        pass

    def _chunked(self, status: int, content_type: str, parts: Iterator[bytes]) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for part in parts:
            self.wfile.write(f"{len(part):x}\r\n".encode() + part + b"\r\n")
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/v1/chat/completions":
            assert body["stream"] is True
            self._chunked(200, "text/event-stream", self._chat_events(body["model"]))
        elif self.path == "/v1/audio/speech":
            with FakeUpstream.lock:
                FakeUpstream.speech_calls += 1
                first = FakeUpstream.speech_calls == 1
            if first:
                payload = json.dumps({"error": {"message": "warming up", "code": 503}}).encode()
                self.send_response(503)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)
                return
            with httpx.stream("POST", f"{self.tts_base}/v1/audio/speech", json=body, timeout=120) as upstream:
                self._chunked(upstream.status_code, "audio/pcm", upstream.iter_raw())
        else:
            self.send_error(404)

    @staticmethod
    def _chat_events(model: str) -> Iterator[bytes]:
        words = ANSWER.split(" ")
        for i, word in enumerate(words):
            time.sleep(0.08)
            delta = {"content": word + (" " if i < len(words) - 1 else "")}
            chunk = {
                "id": "chatcmpl-test",
                "object": "chat.completion.chunk",
                "created": 0,
                "model": model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": None}],
            }
            yield f"data: {json.dumps(chunk)}\n\n".encode()
        yield b"data: [DONE]\n\n"


@pytest.mark.server
@pytest.mark.engine
def test_llm_to_speech_speaks_a_chat_stream_and_retries_a_failed_request(server, tmp_path):
    FakeUpstream.tts_base, FakeUpstream.speech_calls = server.base_url, 0
    fake = ThreadingHTTPServer(("127.0.0.1", 0), FakeUpstream)
    thread = threading.Thread(target=fake.serve_forever, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{fake.server_address[1]}"
    try:
        summary_path = tmp_path / "summary.json"
        proc = run_example(
            "llm_to_speech.py",
            *("--api-base", base, "--chat-base-url", f"{base}/v1", "--chat-model", "fake-llm"),
            *("--max-new-tokens", "8", "--backoff", "0.2", "--max-in-flight", "1"),
            *("-o", str(tmp_path / "chat.wav"), "--summary-json", str(summary_path)),
            cwd=tmp_path,
        )
    finally:
        fake.shutdown()
        fake.server_close()
    sentences = json.loads(summary_path.read_text())["sentences"]
    assert len(sentences) == 3 and all(s["error"] is None for s in sentences)
    assert [s["attempts"] for s in sentences] == [2, 1, 1]
    assert "HTTP 503: warming up; retrying in" in proc.stderr
    assert_frames(tmp_path / "chat.wav", 3 * 8)


def test_llm_to_speech_gives_up_after_its_retries_when_the_server_is_down(tmp_path):
    source = tmp_path / "answer.txt"
    source.write_text("One short sentence here.")
    dead = f"http://127.0.0.1:{free_port()}"
    proc = run_example(
        "llm_to_speech.py",
        *("--api-base", dead, "--text-file", str(source), "--chars-per-second", "0", "-o", ""),
        *("--retries", "2", "--backoff", "0.05"),
        cwd=tmp_path,
        ok=False,
    )
    assert proc.returncode != 0
    assert proc.stderr.count("retrying in") == 2
    assert "sentence 1 failed after 3 attempts: ConnectError" in proc.stderr
    assert "no sentence could be spoken" in proc.stderr


def test_sentence_splitter_cuts_streamed_text_only_at_complete_sentences():
    splitter = load_example("llm_to_speech").SentenceSplitter(min_chars=12, max_chars=60)
    pieces = ["Sure. Pi is 3.", "14 and e is about 2.7", "1! Next, a ", "very long clause, " * 5, "end"]
    out = [s for piece in pieces for s in splitter.feed(piece)] + splitter.flush()
    # "Sure." is too short alone; "3.14" never splits; the run-on part is cut at clauses below 60 characters.
    assert out[0] == "Sure. Pi is 3.14 and e is about 2.71!"
    assert all(len(s) <= 60 for s in out)
    assert " ".join(out).split() == "".join(pieces).split()


def test_backoff_doubles_with_jitter_and_stops_at_the_cap():
    module = load_example("llm_to_speech")
    rng = random.Random(0)
    delays = [module.backoff_delay(k, base=0.5, cap=4.0, rng=rng) for k in range(6)]
    ceilings = [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    assert all(c / 2 <= d <= c for d, c in zip(delays, ceilings, strict=True))

    import asyncio

    calls: list[int] = []
    slept: list[float] = []

    async def flaky(attempt: int) -> str:
        calls.append(attempt)
        if attempt < 2:
            raise module.RetryableError("503")
        return "ok"

    async def fake_sleep(seconds: float) -> None:
        slept.append(seconds)

    result = asyncio.run(module.with_retries(flaky, retries=3, base_delay=1.0, max_delay=8.0, sleep=fake_sleep))
    assert result == "ok" and calls == [0, 1, 2] and len(slept) == 2
    assert 0.5 <= slept[0] <= 1.0 <= slept[1] <= 2.0


# -- run_server.sh ---------------------------------------------------------------------------------------------------
@pytest.mark.server
@pytest.mark.engine
def test_run_server_script_runs_the_command_the_tests_serve_with(server, tiny_parallel, tmp_path):
    script = EXAMPLES / "run_server.sh"
    port = server.base_url.rsplit(":", 1)[1]
    env = {**os.environ, "DRY_RUN": "1", "HOST": "127.0.0.1", "PORT": port, "CHECKPOINT_DIR": str(tmp_path)}
    given = subprocess.run(["bash", str(script), str(tiny_parallel)], env=env, capture_output=True, text=True)
    assert given.returncode == 0, given.stderr
    argv = shlex.split(given.stdout)
    has_gpu = shutil.which("nvidia-smi") is not None
    if not has_gpu:  # the CPU YAML is chosen automatically on a machine without an NVIDIA GPU
        assert argv == server.argv
    # No checkpoint given: the factory makes one under CHECKPOINT_DIR and the command serves it.
    made = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stderr
    ckpt = tmp_path / f"kani-{'350m' if has_gpu else 'tiny'}-parallel"
    assert (ckpt / "config.json").exists()
    assert shlex.split(made.stdout)[1:4] == ["serve", str(ckpt), "--omni"]
