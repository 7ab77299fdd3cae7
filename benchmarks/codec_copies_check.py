"""Whether the codec's state kernels change a served stream's audio, and where (CUDA).

    python3 benchmarks/codec_copies_check.py --out DIR

The served stage decodes in CUDA graphs whose batch buckets are picked from each bucket's measured replay time
(``replay_plan.cheapest_cover``), in TF32 with float16 narrow convs. This decodes the same streams (the 350m codec,
random weights; the chunk schedule and graph buckets of ``stage_configs/kani_tts.yaml``, as the stage reads them)
four ways: eager and graphed, each with PyTorch's state copies and with
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
import yaml
from bench_codec_streaming import build

from vllm_omni_kani.entrypoints.openai.pcm16 import pcm16_bytes
from vllm_omni_kani.model_executor.models.kani_tts.codec_stage import graph_buckets
from vllm_omni_kani.model_executor.models.kani_tts.codec_streams import CodecStreams, StreamChunk
from vllm_omni_kani.model_executor.models.kani_tts.nanocodec.graphs import StreamingGraphs
from vllm_omni_kani.model_executor.models.kani_tts.nanocodec.streaming import StreamingCodec
from vllm_omni_kani.model_executor.stage_input_processors.kani_chunks import ChunkPolicy

SHIPPED = Path(__file__).resolve().parent.parent / "stage_configs" / "kani_tts.yaml"


def shipped() -> tuple[ChunkPolicy, list[int], list[int]]:
    """The shipped file's chunking and Stage 1's (batch, frames) graph buckets."""
    config = yaml.safe_load(SHIPPED.read_text())
    policy = ChunkPolicy.from_extra(config["connectors"]["shm"]["extra"])
    (codec,) = [stage for stage in config["stages"] if stage["stage_id"] == 1]
    return policy, *graph_buckets(codec.get("additional_config") or {}, policy)


def chunks_of(policy: ChunkPolicy, frames: int) -> list[int]:
    """New frames of each chunk of a ``frames``-frame stream under ``policy``."""
    sizes: list[int] = []
    while (done := sum(sizes)) < frames:
        sizes.append(min(policy.chunk_size(len(sizes)), frames - done))
    return sizes


@torch.inference_mode()
def make_streams(
    decoder, copies: bool, graphed: str | None, batches: list[int], frames: list[int]
) -> tuple[CodecStreams, dict]:
    """A codec with PyTorch's copies or the kernels, eager or in graphs of the buckets (plan ``graphed``)."""
    codec = StreamingCodec(decoder, num_slots=16, scratch_rows=max(batches), fuse_state_copies=copies)
    graphs = None
    info: dict = {}
    if graphed:
        graphs = StreamingGraphs(codec, batches, frames, plan=graphed)
        graphs.capture()
        info["single_row_bucket"] = {t: graphs.slices(1, t)[0][2] for t in frames}
        info["replay_ms_b1_b2"] = {
            t: [round(graphs.replay_ms.get((b, t), -1.0), 3) for b in (1, 2)] for t in frames if graphs.replay_ms
        }
    return CodecStreams(codec, max_piece_frames=64, graphs=graphs), info


@torch.inference_mode()
def stream(
    streams: CodecStreams, decoder, policy: ChunkPolicy, lengths: list[int], tag: str, seed: int = 1
) -> list[torch.Tensor]:
    """Each utterance's audio, its chunks decoded in ``policy``'s schedule (one chunk per stream per step)."""
    gen = torch.Generator().manual_seed(seed)
    codes = [torch.randint(0, decoder.config.codebook_size, (n, 4), generator=gen) for n in lengths]
    plans = [chunks_of(policy, n) for n in lengths]
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
    """A short hash of the utterances' 16-bit PCM, as the server would send it."""
    return hashlib.sha256(b"".join(pcm16_bytes(a.numpy()) for a in audio)).hexdigest()[:16]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--precision", default="tf32")
    args = parser.parse_args()
    decoder = build("350m", "cuda", args.precision, "fused")
    policy, batches, frames = shipped()
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
        sides[name] = make_streams(decoder, copies, graphed, batches, frames)
        print(name, json.dumps(sides[name][1]), flush=True)
    for n, lengths in enumerate(([64], [64, 40, 250, 17])):
        runs = {name: stream(streams, decoder, policy, lengths, f"u{n}") for name, (streams, _) in sides.items()}
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
