"""One end-to-end request against a running server, non-streamed and streamed, compared sample by sample.

The GPU half of the serving acceptance: a WAV (22,050 Hz, mono, a whole number of 1,764-sample frames) and a
raw PCM stream of the same greedy, seeded request must hold the same samples (at most 2 PCM16 steps apart, same
length). The PCM's digest is recorded, so runs of differently configured servers (async scheduling on and off,
graphs on and off) can be compared for the same request.
"""

from __future__ import annotations

import hashlib
import io
import time
import wave
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from vllm_omni_kani.benchmarks import report
from vllm_omni_kani.benchmarks.bench_tts import PROMPTS, SAMPLES_PER_FRAME
from vllm_omni_kani.model_executor.models.kani_tts.configuration import SAMPLE_RATE

MAX_PCM_STEP_DIFF = 2
E2E_FRAMES = 64


def _request(base_url: str, model: str, **fields: Any) -> dict[str, Any]:
    return {
        "model": model,
        "input": PROMPTS[0],
        "max_new_tokens": E2E_FRAMES * fields.pop("tokens_per_frame", 1),
        "temperature": 0.0,
        "seed": 1,
        **fields,
    }


def check(base_url: str, model: str, tokens_per_frame: int = 1) -> dict[str, Any]:
    """Both requests, their timings and the comparison; ``passed`` is the verdict."""
    url = f"{base_url.rstrip('/')}/v1/audio/speech"
    with httpx.Client(timeout=300.0) as client:
        started = time.perf_counter()
        response = client.post(
            url, json=_request(base_url, model, response_format="wav", tokens_per_frame=tokens_per_frame)
        )
        wav_s = time.perf_counter() - started
        response.raise_for_status()
        with wave.open(io.BytesIO(response.content)) as w:
            rate, channels, width = w.getframerate(), w.getnchannels(), w.getsampwidth()
            whole = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
        body = _request(
            base_url, model, response_format="pcm", stream_format="audio", tokens_per_frame=tokens_per_frame
        )
        chunks, first = [], None
        started = time.perf_counter()
        with client.stream("POST", url, json=body) as stream:
            stream.raise_for_status()
            for chunk in stream.iter_bytes():
                if chunk and first is None:
                    first = time.perf_counter() - started
                chunks.append(chunk)
        stream_s = time.perf_counter() - started
    streamed = np.frombuffer(b"".join(chunks), dtype="<i2")
    same_length = streamed.shape == whole.shape
    max_diff = (
        int(np.abs(streamed.astype(np.int32) - whole.astype(np.int32)).max()) if same_length and whole.size else None
    )
    passed = (
        rate == SAMPLE_RATE
        and channels == 1
        and width == 2
        and whole.size > 0
        and whole.size % SAMPLES_PER_FRAME == 0
        and same_length
        and max_diff is not None
        and max_diff <= MAX_PCM_STEP_DIFF
    )
    return {
        "passed": passed,
        "sample_rate": rate,
        "channels": channels,
        "frames": whole.size / SAMPLES_PER_FRAME,
        "wav_samples": int(whole.size),
        "stream_samples": int(streamed.size),
        "max_pcm_step_diff": max_diff,
        "wav_request_s": wav_s,
        "stream_ttfa_s": first,
        "stream_request_s": stream_s,
        "pcm_sha256": hashlib.sha256(whole.tobytes()).hexdigest()[:16],
    }


def run(base_url: str, model: str, out: Path, label: str, tokens_per_frame: int = 1) -> Path:
    row = check(base_url, model, tokens_per_frame)
    print(f"e2e {label}: {row}", flush=True)
    result = {"kind": "e2e", "label": f"e2e-{label}", "meta": report.environment(), "rows": [row]}
    return report.write_result(out, f"e2e-{label}", result)
