"""GPU memory of the codec's CUDA graphs: what capturing the served buckets costs, by bucket set.

    python3 benchmarks/codec_graph_memory.py [--preset 350m] [--out DIR] [--max-split-mb 20 [--split-during-capture]]

Builds the real-size stateful codec (random weights, TF32, fused half-snakes) with the shipped state pool, then
captures the shipped (batch, frames) buckets and reports torch's allocated / reserved bytes and the bytes held in
CUDA-graph private pools after each capture, so a deploy file can budget a codec engine's memory.
``--max-split-mb 20`` captures under the allocator setting vLLM's model load uses (where the codec stage captures);
``--split-during-capture`` lifts it around each capture as the codec stage does (``graphs.block_splitting``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_codec_streaming import build

from vllm_omni_kani.model_executor.models.kani_tts.nanocodec.graphs import (
    DEFAULT_BATCH_BUCKETS,
    StreamingGraphs,
    block_splitting,
)
from vllm_omni_kani.model_executor.models.kani_tts.nanocodec.streaming import StreamingCodec

GIB = 1 << 30


def usage() -> dict[str, float]:
    stats = torch.cuda.memory_stats()
    free, total = torch.cuda.mem_get_info()
    return {
        "allocated_gib": torch.cuda.memory_allocated() / GIB,
        "reserved_gib": torch.cuda.memory_reserved() / GIB,
        "peak_allocated_gib": torch.cuda.max_memory_allocated() / GIB,
        "device_used_gib": (total - free) / GIB,
        "segments": stats.get("segment.all.current", 0),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="350m")
    parser.add_argument("--slots", type=int, default=1024)
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--max-split-mb", type=int, default=None, help="allocator max_split_size_mb for the run")
    parser.add_argument("--split-during-capture", action="store_true", help="lift that limit around each capture")
    args = parser.parse_args()
    if args.max_split_mb is not None:
        torch._C._accelerator_setAllocatorSettings(f"max_split_size_mb:{args.max_split_mb}")
    rows = []
    decoder = build(args.preset, "cuda", "tf32", "fused")
    codec = StreamingCodec(decoder, num_slots=args.slots, scratch_rows=64)
    rows.append({"what": "decoder + state pool", **usage()})
    sets = [
        ("batch 64 x frames 64", [64], [64]),
        ("batch 1..64 x frames 64", DEFAULT_BATCH_BUCKETS, [64]),
        ("shipped: batch 1..64 x frames 3..64", DEFAULT_BATCH_BUCKETS, [3, 8, 16, 24, 32, 40, 48, 56, 64]),
    ]
    for name, batches, frames in sets:
        graphs = StreamingGraphs(codec, batches, frames)
        torch.cuda.reset_peak_memory_stats()
        with block_splitting(args.max_split_mb if args.split_during_capture else None):
            count = graphs.capture()
        rows.append({"what": name, "graphs": count, **usage()})
        print(json.dumps(rows[-1]), flush=True)
        if name.startswith("shipped"):
            # Served-like steps: replays in 64-row slices, a padded bucket, and a window past the last bucket (eager).
            groups = decoder.config.num_codebooks
            for batch, frames in ((200, 64), (37, 20), (64, 70), (256, 64)):
                codes = torch.zeros(batch, frames, groups, dtype=torch.int64, device="cuda")
                lengths = torch.full((batch,), frames, dtype=torch.int64, device="cuda")
                slots = torch.arange(batch, dtype=torch.int64, device="cuda")
                for _ in range(3):
                    graphs(codes, lengths, slots)
                torch.cuda.synchronize()
                rows.append({"what": f"after steps of {batch} x {frames}", **usage()})
                print(json.dumps(rows[-1]), flush=True)
        del graphs
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        rows.append({"what": f"after freeing {name}", **usage()})
        print(json.dumps(rows[-1]), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    label = (
        ""
        if args.max_split_mb is None
        else f"-split{args.max_split_mb}" + ("-lifted" if args.split_during_capture else "")
    )
    settings = {"max_split_mb": args.max_split_mb, "split_during_capture": args.split_during_capture}
    (out / f"codec-graph-memory{label}.json").write_text(
        json.dumps({"device": torch.cuda.get_device_name(), **settings, "rows": rows})
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
