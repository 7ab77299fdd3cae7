"""Baselines for ``vllm-omni-kani bench --baselines``, each written as one result beside the server sweeps.

* ``naive``: the transformers reference loop (``modeling_hf.generate_frames``: one request, one token at a
  time, host round trips every step) plus one NanoCodec decode of the whole utterance: what a user runs without
  a serving engine. Non-streaming, so its first audio arrives with its last.
* ``flattened``: a flattened checkpoint of the same backbone (four decode steps per frame) served by this
  pipeline and swept like the parallel-head server.
* ``stock``: plain vLLM ``Lfm2ForCausalLM`` decode step time on the flattened checkpoint (no heads, no mask).
* ``stage0``: our Stage-0 step time (parallel heads, mask, code payload) measured the same way.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from vllm_omni_kani.benchmarks import report
from vllm_omni_kani.benchmarks.bench_tts import PROMPTS, percentile, run_serve_bench
from vllm_omni_kani.benchmarks.server import serving
from vllm_omni_kani.model_executor.models.kani_tts.configuration import FRAME_RATE, SAMPLE_RATE


def naive(args: argparse.Namespace) -> Path:
    """Sequential HF generation + codec decode of ``--naive-requests`` prompts (after one warm-up request)."""
    import torch
    from transformers import AutoTokenizer

    from vllm_omni_kani.model_executor.models.kani_tts import token_layout as tl
    from vllm_omni_kani.model_executor.models.kani_tts.configuration import KaniTTSSettings
    from vllm_omni_kani.model_executor.models.kani_tts.modeling_hf import (
        ParallelHeadLfm2ForCausalLM,
        SamplingConfig,
        generate_frames,
    )
    from vllm_omni_kani.model_executor.models.kani_tts.nanocodec import load_codec

    ckpt = args.ckpt or args.model
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = ParallelHeadLfm2ForCausalLM.from_pretrained(ckpt, dtype=dtype).to(device).eval()
    tokenizer = AutoTokenizer.from_pretrained(ckpt)
    settings = KaniTTSSettings.from_hf_config(model.config)
    codec = load_codec(ckpt, device=device)
    defaults = settings.sampling

    def one(i: int) -> tuple[float, int]:
        ids = tl.text_prompt_ids(tokenizer, PROMPTS[i % len(PROMPTS)], settings.default_speaker)
        sampling = SamplingConfig(defaults.temperature, defaults.top_k, defaults.top_p, defaults.repetition_penalty, i)
        started = time.perf_counter()
        frames = generate_frames(model, ids, args.max_new_frames, sampling)
        if frames.shape[0]:
            audio = codec.decode(frames[None].to(device))
            audio.float().cpu()  # the audio is only "out" once it is on the host
        return time.perf_counter() - started, int(frames.shape[0])

    one(len(PROMPTS) - 1)  # warm-up: CUDA context, kernels, allocator
    rows = []
    for i in range(args.naive_requests):
        seconds, frames = one(i)
        rows.append({"latency_s": seconds, "frames": frames, "audio_s": frames / FRAME_RATE})
        print(f"naive request {i}: {frames} frames in {seconds:.2f} s", flush=True)
    wall = sum(r["latency_s"] for r in rows)
    audio = sum(r["audio_s"] for r in rows)
    latencies = [r["latency_s"] * 1000.0 for r in rows]
    rtf = [r["latency_s"] / r["audio_s"] for r in rows if r["audio_s"] > 0]
    summary = {
        "requests": len(rows),
        "latency_ms_p50": percentile(latencies, 50),
        "latency_ms_p95": percentile(latencies, 95),
        "rtf_p50": percentile(rtf, 50),
        "rtf_p95": percentile(rtf, 95),
        "realtime_x": audio / wall if wall else 0.0,
        "frames_per_s": audio * FRAME_RATE / wall if wall else 0.0,
    }
    result = {
        "kind": "naive",
        "label": "naive",
        "meta": report.environment(),
        "config": {"ckpt": ckpt, "device": device, "dtype": str(dtype), "max_new_frames": args.max_new_frames},
        "sample_rate": SAMPLE_RATE,
        "summary": summary,
        "requests": rows,
    }
    return report.write_result(Path(args.out), "naive", result)


def served(args: argparse.Namespace, ckpt: str, label: str) -> Path:
    """Start a server for ``ckpt`` with ``--deploy-config``, sweep it, stop it; startup time is recorded."""
    if not args.deploy_config:
        raise SystemExit(f"bench: the {label} run needs --deploy-config")
    log = Path(args.out) / f"serve-{label}.log"
    with serving(ckpt, args.deploy_config, log) as server:
        print(f"{label}: server healthy after {server.startup_s:.0f} s", flush=True)
        args.deploy_config_note = args.deploy_config
        path = run_serve_bench(args, server.url, ckpt, label, startup_s=server.startup_s)
    return path


def step_time(args: argparse.Namespace, engine: str, ckpt: str | None, label: str, extra: list[str]) -> Path:
    if not ckpt:
        raise SystemExit(f"bench: the {label} baseline needs a checkpoint (--flattened-ckpt / --ckpt)")
    batches = ",".join(str(b) for b in args.step_batches)
    cmd = [sys.executable, "-m", "vllm_omni_kani.benchmarks.step_time", ckpt, "--engine", engine]
    cmd += ["--label", label, "--out", args.out, "--batches", batches, *extra]
    subprocess.run(cmd, check=True)
    return Path(args.out) / f"{label}.json"


def run_baseline(name: str, args: argparse.Namespace) -> Path:
    runs: dict[str, Any] = {
        "naive": lambda: naive(args),
        "flattened": lambda: served(args, args.flattened_ckpt, "flattened"),
        "stock": lambda: step_time(args, "vllm", args.flattened_ckpt, "stock", []),
        "stage0": lambda: step_time(args, "omni", args.ckpt or args.model, "stage0", ["--codes"]),
    }
    if name not in runs:
        raise SystemExit(f"bench: unknown baseline {name!r}; choose from {', '.join(runs)}")
    return runs[name]()
