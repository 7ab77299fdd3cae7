"""The product as a user runs it: `vllm serve CKPT --omni --deploy-config stage_configs/kani_tts_cpu.yaml`,
then OpenAI-style speech requests over real HTTP on 127.0.0.1.

Factory checkpoints have random weights, so the audio is noise and the model never ends by
itself: every request bounds its length with ``max_new_tokens``.
"""

from __future__ import annotations

import base64
import io
import json
import re
import subprocess
import sys
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest
import soundfile as sf
import torch
from transformers import AutoConfig, AutoTokenizer

from tests.conftest import REPO_ROOT, benchmark_script
from tests.server_utils import wait_for
from vllm_omni_kani.entrypoints.openai.speech_request import MAX_INPUT_CHARS, MAX_SEGMENT_CHARS
from vllm_omni_kani.entrypoints.openai.text_segments import split_text
from vllm_omni_kani.envs import KANI_KERNEL_TRACE, KANI_KERNEL_TRACE_HOST, KANI_KERNEL_TRACE_S
from vllm_omni_kani.model_executor.models.kani_tts import token_layout as tl
from vllm_omni_kani.model_executor.models.kani_tts.configuration import SAMPLE_RATE, SAMPLES_PER_FRAME, KaniTTSSettings
from vllm_omni_kani.model_executor.models.kani_tts.kernel_trace import TRIGGER
from vllm_omni_kani.model_executor.models.kani_tts.modeling_hf import (
    ParallelHeadLfm2ForCausalLM,
    SamplingConfig,
    generate_frames,
)
from vllm_omni_kani.model_executor.models.kani_tts.nanocodec import load_codec

pytestmark = [pytest.mark.server, pytest.mark.engine]
DEPLOY = "kani_tts_cpu.yaml"
FRAMES = 12
TEXT = "Hello world, this is Kani speaking."
PCM16 = 32767


@pytest.fixture(scope="module")
def server(omni_server, tiny_parallel):
    return omni_server(tiny_parallel, DEPLOY)


def speech(server, timeout: float = 300, **body) -> httpx.Response:
    body.setdefault("max_new_tokens", FRAMES)
    return httpx.post(f"{server.base_url}/v1/audio/speech", json=body, timeout=timeout)


def wav_samples(response: httpx.Response) -> tuple[np.ndarray, int]:
    assert response.status_code == 200, response.text
    data, rate = sf.read(io.BytesIO(response.content), dtype="int16")
    return data, rate


def raw_pcm(server, headers: dict[str, str] | None = None, **body) -> np.ndarray:
    body |= {"response_format": "pcm", "stream_format": "audio"}
    body.setdefault("max_new_tokens", FRAMES)
    with httpx.stream("POST", f"{server.base_url}/v1/audio/speech", json=body, headers=headers, timeout=300) as r:
        assert r.status_code == 200, r.read()
        return np.frombuffer(b"".join(r.iter_bytes()), dtype=np.int16)


def sse_pcm(server, **body) -> np.ndarray:
    body |= {"response_format": "pcm", "stream": True}
    body.setdefault("max_new_tokens", FRAMES)
    chunks, done = [], False
    with httpx.stream("POST", f"{server.base_url}/v1/audio/speech", json=body, timeout=300) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data:"):
                continue
            event = json.loads(line[5:])
            if event["type"] == "speech.audio.delta":
                chunks.append(base64.b64decode(event["audio"]))
            elif event["type"] == "speech.audio.done":
                done = True
            else:
                raise AssertionError(event)
    assert done and len(chunks) > 1  # really streamed, in several deltas
    return np.frombuffer(b"".join(chunks), dtype=np.int16)


def assert_pcm_close(a: np.ndarray, b: np.ndarray) -> None:
    assert a.shape == b.shape
    assert np.abs(a.astype(np.int32) - b.astype(np.int32)).max() <= 2


def test_wav_is_22050_hz_mono_with_one_frame_per_1764_samples(server):
    data, rate = wav_samples(speech(server, input=TEXT, voice="katie", seed=1))
    assert rate == SAMPLE_RATE == 22050
    assert data.ndim == 1
    assert len(data) == FRAMES * SAMPLES_PER_FRAME
    assert np.abs(data).max() > 0


def test_voices_come_from_the_checkpoint(server, tiny_parallel):
    listing = httpx.get(f"{server.base_url}/v1/audio/voices").json()
    voices = listing["voices"]
    settings = KaniTTSSettings.from_hf_config(AutoConfig.from_pretrained(tiny_parallel))
    assert sorted(voices) == sorted(settings.speakers)
    assert listing["languages"] == []  # no language_settings: the model takes no `language`
    # OpenAI names are accepted and speak with the default speaker: same audio as naming it.
    alloy, _ = wav_samples(speech(server, input=TEXT, voice="alloy", temperature=0.0))
    default, _ = wav_samples(speech(server, input=TEXT, voice=settings.default_speaker, temperature=0.0))
    np.testing.assert_array_equal(alloy, default)
    other, _ = wav_samples(speech(server, input=TEXT, voice="leo", temperature=0.0))
    assert not np.array_equal(other, default)


def test_streaming_equals_non_streaming_and_an_offline_decode_of_the_reference_frames(server, tiny_parallel):
    """Greedy, so the frames are the transformers reference's; the codec decodes them once, offline."""
    body = {"input": TEXT, "voice": "katie", "temperature": 0.0, "repetition_penalty": 1.0}
    whole, _ = wav_samples(speech(server, **body))
    raw = raw_pcm(server, **body)
    sse = sse_pcm(server, **body)
    assert_pcm_close(raw, whole)
    assert_pcm_close(sse, whole)

    tokenizer = AutoTokenizer.from_pretrained(tiny_parallel)
    prompt = tl.text_prompt_ids(tokenizer, TEXT, "katie")
    model = ParallelHeadLfm2ForCausalLM.from_pretrained(tiny_parallel, dtype=torch.float32).eval()
    frames = generate_frames(model, prompt, FRAMES, SamplingConfig(temperature=0.0))
    codec = load_codec(tiny_parallel, device="cpu")
    with torch.no_grad():
        offline = codec.decode(frames[None])[0].numpy()
    expected = np.clip(np.round(offline * PCM16), -PCM16 - 1, PCM16).astype(np.int16)
    assert_pcm_close(whole, expected)


def test_seeded_sampling_streams_the_same_audio(server):
    body = {"input": TEXT, "seed": 42, "temperature": 0.8, "top_k": 100}
    whole, _ = wav_samples(speech(server, **body))
    assert_pcm_close(raw_pcm(server, **body), whole)
    again, _ = wav_samples(speech(server, **body))
    np.testing.assert_array_equal(again, whole)
    # The seed reaches the engine request: another seed samples other codes.
    other, _ = wav_samples(speech(server, **{**body, "seed": 43}))
    assert other.shape != whole.shape or not np.array_equal(other, whole)


def test_six_concurrent_requests_each_equal_their_solo_run(server):
    texts = [f"Request number {i} says something different, {'and more ' * i}." for i in range(6)]
    solo = [wav_samples(speech(server, input=t, temperature=0.0))[0] for t in texts]
    with ThreadPoolExecutor(6) as pool:
        together = list(pool.map(lambda t: wav_samples(speech(server, input=t, temperature=0.0))[0], texts))
    # Same frames: the codec decodes them in a different batch, which can move a sample by one PCM16 step
    # (float rounding of batched convolutions); a single different code would change thousands of samples.
    for a, b in zip(solo, together, strict=True):
        assert_pcm_close(a, b)
    assert len({a.tobytes() for a in solo}) == 6


def test_codec_steps_are_bounded_in_frames_and_held_chunks_still_decode(server):
    """kani_tts_cpu.yaml bounds a codec step to 32 frames: six streams whose 9-frame last chunks arrive together
    cannot all go in one step, so some wait a step (the scheduler says so in its summary line), and every stream's
    audio is still all of its frames."""
    budget = 32
    assert f"Kani codec scheduler: at most {budget} frames a step" in server.log_text()
    texts = [f"Held chunk test {i}, {'with more words ' * i}." for i in range(6)]
    with ThreadPoolExecutor(6) as pool:
        audio = list(pool.map(lambda t: wav_samples(speech(server, input=t, temperature=0.0))[0], texts))
    assert [a.shape[0] for a in audio] == [FRAMES * SAMPLES_PER_FRAME] * 6
    # At most one line per 10 s, so an earlier test's streams may be the ones it counts.
    pattern = re.compile(
        r"Kani codec scheduler: .* held (\d+) chunks .*\(budget (\d+) frames; at most (\d+) frames of running streams"
    )
    wait_for(lambda: pattern.search(server.log_text()) is not None, timeout_s=15.0)
    lines = pattern.findall(server.log_text())
    assert sum(int(held) for held, _, _ in lines) > 0
    # Running streams' chunks fill a step up to the budget (less the first chunks beside them); only the queue's
    # head goes alone over it, and no chunk of kani_tts_cpu.yaml is longer than its 16 frames.
    assert all(int(b) == budget and int(largest) <= max(budget, 16) for _, b, largest in lines), lines


def test_stage0_reports_at_its_finish_with_every_token_and_the_audio_is_exactly_its_frames(server, tmp_path):
    """Under async_chunk Stage 0 sends the API server its final output only (nothing there uses its per-step ones):
    its stats still count every token, and each request's audio is exactly those frames, read from the server log
    the way ``benchmarks/audio_vs_frames.py`` reads a GPU run's; Stage 0's own count at its finish is the same."""
    audio_vs_frames = benchmark_script("audio_vs_frames")
    before = len(server.log_text())
    # Our own request ids (the engine's is speech-<X-Request-Id>): the tables are logged off the event loop, so an
    # earlier test's table can still land after `before`.
    ids = [f"finish-report-{i}-{uuid.uuid4().hex[:8]}" for i in range(3)]
    for i, request_id in enumerate(ids):  # streamed: the kind vLLM-Omni coerces to DELTA
        raw_pcm(server, headers={"X-Request-Id": request_id}, input=f"{TEXT} Take {i}.", temperature=0.0)
    log = tmp_path / "server.log"

    def ours() -> dict:
        log.write_text(server.log_text()[before:])
        tables = audio_vs_frames.requests(log)
        return {key: fields for key, fields in tables.items() if any(key.startswith(f"speech-{i}") for i in ids)}

    wait_for(lambda: len(ours()) >= 3, timeout_s=10.0)
    stats = ours()
    assert len(stats) == 3, log.read_text()[-3000:]
    finished = audio_vs_frames.stage0_finished(log)
    for request_id, fields in stats.items():
        assert audio_vs_frames.classify(fields, 1).startswith("whole"), (request_id, fields)
        assert int(fields["num_tokens_out"][0]) > 0
        # Stage 0's own count, logged as it freed the request, is the orchestrator's (the stand-in for a dropped row).
        assert finished[request_id] == int(fields["num_tokens_out"][0]), (request_id, finished.get(request_id))
        assert audio_vs_frames.check(fields, 1, False, finished[request_id]) == [audio_vs_frames.classify(fields, 1)]
        # Both stages' first outputs, as ttfa_breakdown.py reads them.
        assert all(float(t) > 0 for t in fields["vllm_ttft_ms"]), fields
    # One line per request, not vLLM-Omni's tables.
    text = log.read_text()
    for request_id in stats:
        assert text.count(f"[KaniRequestStats] request_id={request_id} ") == 1
        assert f"StageRequestStats [request_id={request_id}]" not in text


def test_the_api_server_runs_its_event_loop_patches(server):
    """The served process applied the API-server patches that spare its GIL (``patch.encode_pcm_with_numpy``,
    ``patch.log_request_summaries_off_the_event_loop``, ``patch.constant_time_output_stats``,
    ``patch.speech_route_first``): the other tests here then stream through them."""
    log = server.log_text()
    assert "PCM and WAV encoded with numpy" in log
    assert "output stats: constant time per output" in log
    assert "request summaries: one [KaniRequestStats] line per request, logged on a background thread" in log
    assert "routes: /v1/audio/speech first (1 moved)" in log
    # On by default, in the API server's process alone (the engines have no orchestrator thread to hand it to).
    assert log.count("submit yield: 100 us after each engine request is queued") == 1, log[-3000:]


@pytest.mark.parametrize("fmt", ["flac", "mp3", "opus", "pcm"])
def test_formats_decode(server, fmt):
    r = speech(server, input=TEXT, response_format=fmt, seed=3)
    assert r.status_code == 200, r.text
    if fmt == "pcm":
        assert len(r.content) == 2 * FRAMES * SAMPLES_PER_FRAME
        return
    data, rate = sf.read(io.BytesIO(r.content))
    # Opus cannot carry 22,050 Hz: the server resamples it to 24 kHz.
    assert rate == (24000 if fmt == "opus" else SAMPLE_RATE)
    assert abs(len(data) / rate - FRAMES * SAMPLES_PER_FRAME / SAMPLE_RATE) < 0.08


def test_sample_rate_resampling_streams_exactly(server):
    body = {"input": TEXT, "seed": 5, "sample_rate": 16000}
    whole, rate = wav_samples(speech(server, **body))
    assert rate == 16000
    assert len(whole) == round(FRAMES * SAMPLES_PER_FRAME * 16000 / SAMPLE_RATE)
    assert_pcm_close(raw_pcm(server, **body), whole)


def test_long_input_is_spoken_in_order_as_one_stream(server):
    text = " ".join(f"Sentence {i} keeps the story going for a little while longer, as stories do." for i in range(14))
    segments = split_text(text, MAX_SEGMENT_CHARS)
    assert len(segments) == 3
    body = {"input": text, "max_new_tokens": 4, "temperature": 0.0}
    whole, _ = wav_samples(speech(server, **body))
    assert len(whole) == len(segments) * 4 * SAMPLES_PER_FRAME
    assert_pcm_close(raw_pcm(server, **body), whole)
    # The stream is the segments spoken one after another.
    pieces = [wav_samples(speech(server, input=s, max_new_tokens=4, temperature=0.0))[0] for s in segments]
    assert_pcm_close(whole, np.concatenate(pieces))


def test_batch_returns_every_item(server):
    body = {"items": [{"input": "One."}, {"input": "Two.", "voice": "leo"}, {"input": "Three."}], "max_new_tokens": 4}
    r = httpx.post(f"{server.base_url}/v1/audio/speech/batch", json=body, timeout=300)
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert [item["index"] for item in results] == [0, 1, 2]
    for item in results:
        assert item["status"] == "success"
        data, rate = sf.read(io.BytesIO(base64.b64decode(item["audio_data"])))
        assert rate == SAMPLE_RATE and len(data) == 4 * SAMPLES_PER_FRAME


BAD_REQUESTS = [
    ({"input": ""}, "Input text cannot be empty"),
    ({"input": "   \n\t"}, "Input text cannot be empty"),
    ({"input": "x" * (MAX_INPUT_CHARS + 1)}, f"the maximum is {MAX_INPUT_CHARS}"),
    ({"input": TEXT, "voice": "nobody"}, "Unknown voice 'nobody'. Available: andrew, katie, leo, nova_kani"),
    ({"input": TEXT, "response_format": "aac"}, "response_format"),
    ({"input": TEXT, "stream": True, "response_format": "flac"}, "pcm"),
    ({"input": TEXT, "stream_format": "audio", "response_format": "mp3"}, "pcm"),
    ({"input": TEXT, "stream": True, "speed": 1.5}, "speed"),
    ({"input": TEXT, "max_new_tokens": 0}, "'max_new_tokens' must be >= 1"),
    ({"input": TEXT, "max_new_tokens": 10**6}, "exceeds this model's limit"),
    ({"input": TEXT, "temperature": -1}, "'temperature' must be >= 0"),
    ({"input": TEXT, "top_p": 1.5}, "'top_p' must be in (0, 1]"),
    ({"input": TEXT, "sample_rate": 12345}, "'sample_rate' 12345 is not supported"),
    ({"input": TEXT, "response_format": "opus", "sample_rate": 22050}, "response_format 'opus' supports"),
    ({"input": TEXT, "tempreature": 0.5}, "Unknown field(s): 'tempreature'"),
    ({"input": TEXT, "ref_audio": "data:audio/wav;base64,AAAA"}, "'ref_audio' is not supported by Kani TTS"),
    ({"input": TEXT, "instructions": "whisper"}, "'instructions' is not supported"),
]


@pytest.mark.parametrize(("body", "message"), BAD_REQUESTS, ids=[m[:30] for _, m in BAD_REQUESTS])
def test_bad_input_is_a_4xx_with_a_message_and_the_server_keeps_serving(server, body, message):
    r = httpx.post(f"{server.base_url}/v1/audio/speech", json={"max_new_tokens": FRAMES, **body}, timeout=120)
    assert 400 <= r.status_code < 500, r.text
    assert message in r.json()["error"]["message"]
    # Greedy: a sampled request of random weights may end itself after one frame (about 1 in 4,000 steps).
    data, _ = wav_samples(speech(server, input=TEXT, max_new_tokens=2, temperature=0.0))
    assert len(data) == 2 * SAMPLES_PER_FRAME


def test_malformed_json_is_a_400(server):
    r = httpx.post(
        f"{server.base_url}/v1/audio/speech",
        content=b'{"input": "hi", ',
        headers={"content-type": "application/json"},
        timeout=60,
    )
    assert r.status_code == 400
    assert "JSON" in r.text


def test_client_disconnect_aborts_the_request_in_both_stages(server):
    """A stream cut after its first bytes: the engine aborts the request, which frees it in every stage."""
    before = server.log_text()
    got_audio = threading.Event()
    with httpx.stream(
        "POST",
        f"{server.base_url}/v1/audio/speech",
        json={"input": TEXT, "max_new_tokens": 1500, "response_format": "pcm", "stream_format": "audio"},
        timeout=120,
    ) as r:
        for chunk in r.iter_bytes():
            if chunk:
                got_audio.set()
                break
    assert got_audio.is_set()
    # The next request succeeds; by then the server has logged the abort of the first.
    data, _ = wav_samples(speech(server, input=TEXT, max_new_tokens=3))
    assert len(data) == 3 * SAMPLES_PER_FRAME
    log = server.log_text()[len(before) :]
    cancelled = re.search(r"request_id=(speech-\w+) stream=true status=cancelled", log)
    assert cancelled, log[-3000:]
    assert re.search(rf"\[Orchestrator\] Aborted request\(s\) \['{cancelled.group(1)}", log)


def test_end2end_example_runs_offline(tiny_parallel, tmp_path):
    """The offline example (vLLM-Omni's Python API) on the same tiny checkpoint."""
    script = REPO_ROOT / "examples/offline_inference/text_to_speech/kani_tts/end2end.py"
    args = ["--model", str(tiny_parallel), "--max-new-tokens", "6", "--out-dir", str(tmp_path)]
    args += ["--text", "First utterance.", "--text", "Second one."]
    run = subprocess.run(
        [sys.executable, str(script), *args],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=REPO_ROOT,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert re.search(r"utterance_1\.wav: 0\.48 s of audio in [\d.]+ s \(RTF [\d.]+\)", run.stdout)
    data, rate = sf.read(tmp_path / "utterance_0.wav")
    assert rate == SAMPLE_RATE and len(data) == 6 * SAMPLES_PER_FRAME


# The flattened server also runs with the step meter, the API loop-lag meter (and its stall sampler), a GIL switch
# interval, the API server's collector thresholds, its GIL hand-off after each queued request turned off, and the
# Stage-0 sampler patches alternating with vLLM's path in 0.2-s windows (the patches and the hand-off are on by
# default, the rest off), so they are checked in a real server without starting another one.
OPTIONS_ENV = {
    "KANI_STEP_STATS_S": "0.1",
    "KANI_LOOP_LAG_S": "0.2",
    "KANI_LOOP_STALL_MS": "20",
    "KANI_GIL_SWITCH_INTERVAL_MS": "1",
    "KANI_MAIN_GC_THRESHOLD": "20000",
    "KANI_SUBMIT_YIELD_US": "0",
    "KANI_STAGE0_SAMPLER_PATCHES": "1",
    "KANI_SAMPLER_AB_PERIOD_S": "0.2",
}


@pytest.fixture(scope="module")
def kernel_trace_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("kernel-trace")


@pytest.fixture(scope="module")
def flat_server(omni_server, tiny_flattened, kernel_trace_dir):
    # Every engine process of this server watches kernel_trace_dir for KANI_KERNEL_TRACE's trigger.
    # Stage 0's window records its Python calls and vLLM's ranges as well (benchmarks/step_anatomy.py reads them).
    env = {**OPTIONS_ENV, KANI_KERNEL_TRACE: str(kernel_trace_dir), KANI_KERNEL_TRACE_S: "0.3"}
    env |= {KANI_KERNEL_TRACE_HOST: "python:stage0", "VLLM_CUSTOM_SCOPES_FOR_PROFILING": "1"}
    return omni_server(tiny_flattened, DEPLOY, env=env)


def test_flattened_checkpoint_serves_speech_four_tokens_per_frame(flat_server):
    body = {"input": TEXT, "max_new_tokens": 4 * 6 + 2, "temperature": 0.0}
    whole, rate = wav_samples(speech(flat_server, **body))
    # 26 tokens: six whole frames, the two codes of an unfinished seventh are dropped.
    assert rate == SAMPLE_RATE and len(whole) == 6 * SAMPLES_PER_FRAME
    assert_pcm_close(raw_pcm(flat_server, **body), whole)
    assert_pcm_close(sse_pcm(flat_server, **body), whole)
    log = flat_server.log_text()
    # Every process of the server (API server, both engine cores) set the interval.
    assert log.count("GIL switch interval 1.000 ms") >= 3, log[-3000:]
    # The collector thresholds: the API server's process alone; the engine cores keep CPython's.
    assert log.count("KANI_MAIN_GC_THRESHOLD: gc thresholds 20000, 10, 10 (were 700, 10, 10)") == 1, log[-3000:]
    assert "submit yield:" not in log, log[-3000:]  # 0 turns the default off
    # The penalty-count patch served these requests (Kani's default sampling has a repetition penalty); the
    # codebook-1 noise patch is installed too.
    assert "penalties: output-token counts kept on the device" in log, log[-3000:]
    assert "seeded codebook-1 noise: hashed for the whole batch" in log, log[-3000:]
    steps = re.findall(r"kani stage0 steps: [\d.]+ steps/s, ([\d.]+) ms per step, \d+ rows/s, mean batch ([\d.]+)", log)
    assert steps and all(float(ms) > 0 and float(batch) >= 1 for ms, batch in steps), log[-3000:]
    # The scheduler's step-kind meter: each window splits its steps into decode and prefill (the requests' prompts).
    kinds = re.findall(r"kani stage0 step kinds: decode (\d+)(?: x ([\d.]+) ms)?.*; prefill (\d+)", log)
    assert kinds and all(int(d) == 0 or float(ms) > 0 for d, ms, _ in kinds), log[-3000:]
    assert sum(int(p) for *_, p in kinds) >= 1, kinds
    # The meter's windows are the A/B windows, each naming its side.
    assert re.search(r"over [\d.]+ s \(sampler patches (on|off)\)", log), log[-3000:]
    # The API server's event-loop lag, from the health checks on.
    lags = re.findall(r"kani api loop lag: p50 ([\d.]+) ms, p99 ([\d.]+) ms, max ([\d.]+) ms, late \d+% of", log)
    assert lags and all(float(a) <= float(b) <= float(c) for a, b, c in lags), log[-3000:]
    # Each meter's window also times the process's garbage collections.
    for who in ("api", "stage0"):
        assert re.search(rf"kani {who} gc: gen0 \d+x total [\d.]+ ms max [\d.]+ ms, .*; paused", log), who


def test_a_kernel_trace_window_records_both_engines_of_a_server(flat_server, kernel_trace_dir):
    """``KANI_KERNEL_TRACE``: the trigger file opens one window in Stage 0's and in the codec's engine process, each
    writes its own trace, and ``benchmarks/kernel_share.py`` summarises them (CPU ops here; kernels on a GPU)."""
    (kernel_trace_dir / TRIGGER).touch()
    body = {"input": TEXT, "max_new_tokens": 4 * 12, "temperature": 0.0}

    def both_written() -> bool:
        speech(flat_server, **body)  # steps open, fill and close each engine's window
        return all(list(kernel_trace_dir.glob(f"{stage}-*.json")) for stage in ("stage0", "stage1"))

    wait_for(both_written, timeout_s=240)
    summary = benchmark_script("kernel_share").summarise(kernel_trace_dir, ("cpu_op",), top=200)
    names = {row["trace"].split("-")[0]: {t["name"] for t in row["top"]} for row in summary["traces"]}
    assert set(names) == {"stage0", "stage1"}, summary
    # The LM's matmuls and attention (vLLM's CPU kernels here: _C::onednn_mm, _C::cpu_attention_with_kv_cache).
    assert any(name.endswith("mm") for name in names["stage0"]), sorted(names["stage0"])
    assert any("attention" in name for name in names["stage0"]), sorted(names["stage0"])
    assert any("conv" in name for name in names["stage1"]), sorted(names["stage1"])
    log = flat_server.log_text()
    assert "Kani kernel trace: stage0" in log and "Kani kernel trace: stage1" in log, log[-3000:]
    # KANI_KERNEL_TRACE_HOST=python:stage0: Stage 0's steps split by kind from its Python calls, the codec's untouched.
    (stage0,) = kernel_trace_dir.glob("stage0-*.json")
    (stage1,) = kernel_trace_dir.glob("stage1-*.json")
    assert '"python_function"' not in stage1.read_text()
    anatomy = benchmark_script("step_anatomy").anatomy(json.loads(stage0.read_text()))
    assert anatomy["python_calls"] and anatomy["steps"] >= 1, anatomy["per_step"]
    assert set(anatomy["kinds"]) <= {"prefill", "decode", "finished"}, anatomy["kinds"]
    for row in anatomy["kinds"].values():
        assert row["wall_ms"] > 0 and "gpu_model_runner: forward" in row["ranges_ms"], row
