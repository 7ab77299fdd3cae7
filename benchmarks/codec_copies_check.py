"""Whether the codec's state kernels change a served stream's audio, and where (CUDA).

    python3 benchmarks/codec_copies_check.py --out DIR

The served stage decodes in CUDA graphs whose batch buckets are picked from each bucket's measured replay time
(``replay_plan.cheapest_cover``), in TF32 with float16 narrow convs. This decodes the same streams (the 350m codec,
random weights; the shipped chunk schedule) four ways: eager and graphed, each with PyTorch's state copies and with
the kernels (``codec_fused_state_copies``), and graphed again with the ``round_up`` plan (one row always replays
batch bucket 1). Printed: every pair's max abs difference (0 means the same bits), and, per frame bucket, the batch
bucket a single row replays in under each side's measured times.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

import torch
from bench_codec_streaming import build

from vllm_omni_kani.model_executor.models.kani_tts.codec_streams import CodecStreams, StreamChunk
from vllm_omni_kani.model_executor.models.kani_tts.nanocodec.graphs import StreamingGraphs
from vllm_omni_kani.model_executor.models.kani_tts.nanocodec.streaming import StreamingCodec

BATCHES = [1, 2, 4, 8, 16, 32, 64]
FRAMES = [3, 8, 16, 24, 32, 40, 48, 56, 64]
SCHEDULE = (3, 8, 16, 32, 64)  # the shipped ramp: a first chunk of 3, then 8 doubling to 64


def chunks_of(frames: int) -> list[int]:
    sizes, total = [], 0
    for size in SCHEDULE + (64,) * frames:
        if total >= frames:
            break
        sizes.append(min(size, frames - total))
        total += sizes[-1]
    return sizes


@torch.inference_mode()
def make_streams(decoder, copies: bool, graphed: str | None) -> tuple[CodecStreams, dict]:
    """A codec with PyTorch's copies or the kernels, eager or in the served buckets' graphs (plan ``graphed``)."""
    codec = StreamingCodec(decoder, num_slots=16, scratch_rows=max(BATCHES), fuse_state_copies=copies)
    graphs = None
    info: dict = {}
    if graphed:
        graphs = StreamingGraphs(codec, BATCHES, FRAMES, plan=graphed)
        graphs.capture()
        info["single_row_bucket"] = {t: graphs.slices(1, t)[0][2] for t in FRAMES}
        info["replay_ms_b1_b2"] = {
            t: [round(graphs.replay_ms.get((b, t), -1.0), 3) for b in (1, 2)] for t in FRAMES if graphs.replay_ms
        }
    return CodecStreams(codec, max_piece_frames=64, graphs=graphs), info


@torch.inference_mode()
def stream(streams: CodecStreams, decoder, lengths: list[int], tag: str, seed: int = 1) -> list[torch.Tensor]:
    """Each utterance's audio, its chunks decoded in the shipped schedule (one chunk per stream per step)."""
    gen = torch.Generator().manual_seed(seed)
    codes = [torch.randint(0, decoder.config.codebook_size, (n, 4), generator=gen) for n in lengths]
    plans = [chunks_of(n) for n in lengths]
    pieces: list[list[torch.Tensor]] = [[] for _ in lengths]
    starts = [0] * len(lengths)
    for seq in range(max(len(p) for p in plans)):
        batch = []
        for r, plan in enumerate(plans):
            if seq < len(plan):
                stop = starts[r] + plan[seq]
                batch.append((r, StreamChunk(f"{tag}-r{r}", codes[r][starts[r] : stop], seq, stop == lengths[r])))
                starts[r] = stop
        for (r, _), audio in zip(batch, streams.decode([c for _, c in batch]), strict=True):
            pieces[r].append(audio.float().cpu())
    return [torch.cat(p) for p in pieces]


def digest(audio: list[torch.Tensor]) -> str:
    pcm = b"".join((a.clamp(-1, 1) * 32767).round().to(torch.int16).numpy().tobytes() for a in audio)
    return hashlib.sha256(pcm).hexdigest()[:16]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--precision", default="tf32")
    args = parser.parse_args()
    decoder = build("350m", "cuda", args.precision, "fused")
    report: dict = {}
    sides = {}
    for name, copies, graphed in (
        ("eager-torch", False, None),
        ("eager-kernels", True, None),
        ("graphs-torch", False, "cheapest"),
        ("graphs-kernels", True, "cheapest"),
        ("graphs-torch-roundup", False, "round_up"),
        ("graphs-kernels-roundup", True, "round_up"),
    ):
        sides[name] = make_streams(decoder, copies, graphed)
        print(name, json.dumps(sides[name][1]), flush=True)
    for n, lengths in enumerate(([64], [64, 40, 250, 17])):
        runs = {name: stream(streams, decoder, lengths, f"u{n}") for name, (streams, _) in sides.items()}
        infos = {name: info for name, (_, info) in sides.items()}
        names = list(runs)
        diffs = {
            f"{a} vs {b}": max(float((x - y).abs().max()) for x, y in zip(runs[a], runs[b], strict=True))
            for i, a in enumerate(names)
            for b in names[i + 1 :]
        }
        key = ",".join(map(str, lengths))
        report[key] = {"pcm16_sha256": {n: digest(r) for n, r in runs.items()}, "max_abs_diff": diffs, "graphs": infos}
        print(json.dumps({key: report[key]}, indent=1), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "codec-copies-check.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
