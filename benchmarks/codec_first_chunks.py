"""What a codec step of first chunks costs: new streams' slot zeroing, and the whole step through the graphs.

    python3 benchmarks/codec_first_chunks.py --device cuda --out R

Served at 64 streams a step of 36 first chunks (3 frames each) took 65 ms and one of 37 last chunks (7 frames)
24 ms (docs/BENCHMARKS.md, fifteenth set): the difference is each new stream's state slot being zeroed, one
kernel per pool tensor (~100) per stream. Here, on the real-size codec: zeroing N slots one stream at a time
(``state[slot].zero_()`` per pool tensor, how slots were zeroed before) against the one pass per step that
:meth:`StreamingCodec.zero_acquired` makes, and a step of N first chunks through ``CodecStreams`` and captured
graphs (ms, best of 5, device synchronised).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from bench_codec_streaming import build, timed

from vllm_omni_kani.model_executor.models.kani_tts.codec_streams import CodecStreams, StreamChunk
from vllm_omni_kani.model_executor.models.kani_tts.nanocodec.graphs import StreamingGraphs
from vllm_omni_kani.model_executor.models.kani_tts.nanocodec.streaming import StreamingCodec

FIRST_CHUNK_FRAMES = 3


def best_ms(fn, device: str) -> float:
    """Best wall ms of ``fn`` over 5 calls after one warm-up, the device synchronised around each."""
    return timed(fn, 5, device == "cuda") * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--preset", default="350m")
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 8, 36, 64])
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    decoder = build(args.preset, args.device, "tf32" if args.device == "cuda" else "fp32", "fused")
    rows = max(args.streams)
    codec = StreamingCodec(decoder, num_slots=rows, scratch_rows=64)
    graphs = StreamingGraphs(codec, frame_buckets=(4,)) if args.device == "cuda" else None
    captured = graphs.capture() if graphs is not None else 0
    streams = CodecStreams(codec, max_piece_frames=64, graphs=graphs if captured else None)
    gen = torch.Generator().manual_seed(0)
    first = torch.randint(0, decoder.config.codebook_size, (rows, FIRST_CHUNK_FRAMES, 4), generator=gen)
    results = []
    for n in args.streams:

        def per_stream(n: int = n) -> None:
            for slot in range(n):
                for state in codec.pool:
                    state[slot].zero_()

        def one_pass(n: int = n) -> None:
            codec._unzeroed.extend(range(n))
            codec.zero_acquired()

        def first_step(n: int = n) -> None:
            streams.decode([StreamChunk(f"r{i}", first[i], 0, False) for i in range(n)])
            streams.release(f"r{i}" for i in range(n))

        row = {
            "streams": n,
            "zero per stream ms": best_ms(per_stream, args.device),
            "zero one pass ms": best_ms(one_pass, args.device),
            "first-chunk step ms": best_ms(first_step, args.device),
        }
        results.append(row)
        print("  ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()), flush=True)
    report = {"device": args.device, "pool tensors": len(codec.pool), "graphs": captured, "rows": results}
    if args.device == "cuda":
        report["gpu"] = torch.cuda.get_device_name()
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "codec-first-chunks.json").write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
