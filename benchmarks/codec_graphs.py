"""Stage 1 alone on a GPU: eager vs CUDA-graph decode of streaming windows, per batch bucket.

    python benchmarks/codec_graphs.py --out DIR        # needs a CUDA device; the real-size (350m) codec

Times ``decode_windows`` (the path the codec stage runs: host codes in, device audio out) for
* the first chunk of a stream (batch 1, 2-4 new frames, no left context): the codec's share of TTFA;
* steady windows (28 context + 16 new frames) at batch 1…128: new frames/s, eager vs graphs, and with
  cuDNN autotuning (``cudnn.benchmark``) before capture;
* longer chunks (28 + 64) eagerly: how much the 28 context frames cost per new frame;
and checks every graph replay against the eager decode of the same codes (strict float32 both). A
``torch.profiler`` table of the largest steady batch says where the time goes. Writes ``DIR/codec.json``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from vllm_omni_kani.benchmarks import report
from vllm_omni_kani.model_executor.models.kani_tts.nanocodec import (
    RECEPTIVE_FIELD_FRAMES,
    NanoCodecDecoder,
    load_decoder_state,
)
from vllm_omni_kani.model_executor.models.kani_tts.nanocodec.graphs import DEFAULT_FRAME_BUCKETS, CodecGraphs
from vllm_omni_kani.tools.codec_factory import CODEC_PRESETS, random_decoder_tensors

CHUNK = 16
BATCHES = (1, 8, 16, 32, 64, 128)


def build(preset: str) -> NanoCodecDecoder:
    with torch.device("cuda"):
        decoder = NanoCodecDecoder(CODEC_PRESETS[preset])
    load_decoder_state(decoder, random_decoder_tensors(CODEC_PRESETS[preset], 0))
    return decoder.eval()


def windows(batch: int, frames: int, seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, CODEC_PRESETS["350m"].codebook_size, (frames, 4), generator=gen) for _ in range(batch)]


def time_ms(fn, repeat: int) -> float:
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        samples.append((time.perf_counter() - start) * 1e3)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="350m")
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--repeat", type=int, default=10)
    args = parser.parse_args()
    torch.backends.cudnn.benchmark = False
    decoder = build(args.preset)
    batch_buckets = (1, 2, 4, 8, 16, 32, 64)
    started = time.perf_counter()
    graphs = CodecGraphs(decoder, batch_buckets, DEFAULT_FRAME_BUCKETS)
    captured = graphs.capture()
    capture_s = time.perf_counter() - started
    print(f"captured {captured} graphs in {capture_s:.1f} s", flush=True)
    rows = []

    def measure(variant: str, batch: int, left: int, new: int, forward) -> None:
        ws = windows(batch, left + new, seed=batch * 1000 + new)
        lefts = [left] * batch
        ms = time_ms(lambda: decoder.decode_windows(ws, lefts, forward=forward), args.repeat)
        diff = None
        if forward is not None:
            ref = decoder.decode_windows(ws, lefts)
            got = decoder.decode_windows(ws, lefts, forward=forward)
            diff = max(float((a - b).abs().max()) for a, b in zip(got, ref, strict=True))
        row = {
            "variant": variant,
            "batch": batch,
            "window_frames": left + new,
            "new_frames": new,
            "ms": ms,
            "new_frames_per_s": batch * new / ms * 1e3,
            "max_diff_vs_eager": diff,
        }
        rows.append(row)
        print(row, flush=True)

    for new in (2, 3, 4):
        measure("eager", 1, 0, new, None)
        measure("graphs", 1, 0, new, graphs)
    for batch in BATCHES:
        measure("eager", batch, RECEPTIVE_FIELD_FRAMES, CHUNK, None)
        measure("graphs", batch, RECEPTIVE_FIELD_FRAMES, CHUNK, graphs)
    for batch in (16, 64):
        measure("eager", batch, RECEPTIVE_FIELD_FRAMES, 64, None)

    # cuDNN autotuning picks per-shape algorithms before capture (fixed buckets make that pay once).
    torch.backends.cudnn.benchmark = True
    tuned = CodecGraphs(decoder, batch_buckets, DEFAULT_FRAME_BUCKETS)
    tuned.capture()
    for batch in (1, 16, 64, 128):
        measure("graphs+cudnn.benchmark", batch, RECEPTIVE_FIELD_FRAMES, CHUNK, tuned)
    measure("graphs+cudnn.benchmark", 1, 0, 4, tuned)
    torch.backends.cudnn.benchmark = False

    result = {
        "kind": "codec",
        "label": "codec",
        "meta": report.environment(),
        "preset": args.preset,
        "graphs_captured": captured,
        "capture_s": capture_s,
        "rows": rows,
    }
    print(f"wrote {report.write_result(Path(args.out), 'codec', result)}", flush=True)
    codes = torch.randint(0, decoder.config.codebook_size, (64, RECEPTIVE_FIELD_FRAMES + CHUNK, 4), device="cuda")
    with torch.inference_mode(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        decoder(codes)
        torch.cuda.synchronize()
    result["profile_batch64_window44"] = prof.key_averages().table(sort_by="cuda_time_total", row_limit=15)
    print(result["profile_batch64_window44"])
    report.write_result(Path(args.out), "codec", result)


if __name__ == "__main__":
    main()
