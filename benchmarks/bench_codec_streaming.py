"""Stage 1 alone: stateless windows vs stateful streams, per conv precision; SNR against strict float32.

    python3 benchmarks/bench_codec_streaming.py --device cuda --batches 64 128 256 --out benchmarks/results

Throughput counts *new* frames (audio delivered) per second: a stateless chunk of N new frames decodes
``28 + N`` frames, a stateful one decodes N. Each (mode, precision, batch, chunk) row replays one captured CUDA
graph per batch slice (eager on CPU), best of ``--repeat`` after warm-up. SNR: a 250-frame utterance per row of a
batch, streamed through the stateful codec in the precision and half-snake kernels under test (chunks 3, 16, 32,
64, 64, ...), against one strict-float32 eager decode of the same codes. ``--activations fused`` (CUDA): each
half-snake as one Triton kernel writing into the conv input (``nanocodec/fused.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import torch

from vllm_omni_kani.model_executor.models.kani_tts.codec_streams import CodecStreams, StreamChunk
from vllm_omni_kani.model_executor.models.kani_tts.nanocodec import NanoCodecDecoder, fused, load_decoder_state
from vllm_omni_kani.model_executor.models.kani_tts.nanocodec.config import RECEPTIVE_FIELD_FRAMES
from vllm_omni_kani.model_executor.models.kani_tts.nanocodec.decoder import PRECISIONS
from vllm_omni_kani.model_executor.models.kani_tts.nanocodec.graphs import (
    DEFAULT_BATCH_BUCKETS,
    REPLAY_PLANS,
    CodecGraphs,
    StreamingGraphs,
)
from vllm_omni_kani.model_executor.models.kani_tts.nanocodec.streaming import StreamingCodec
from vllm_omni_kani.tools.codec_factory import CODEC_PRESETS, random_decoder_tensors

FRAME_RATE = 12.5


def build(preset: str, device: str, precision: str, activations: str = "eager") -> NanoCodecDecoder:
    with torch.device(device):
        decoder = NanoCodecDecoder(CODEC_PRESETS[preset])
    load_decoder_state(decoder, random_decoder_tensors(CODEC_PRESETS[preset], seed=0))
    return decoder.eval().set_precision(precision).set_fused_activations(activations == "fused")


def timed(fn, repeat: int, cuda: bool) -> float:
    """Best seconds per call of ``fn`` after one warm-up."""
    best = float("inf")
    for i in range(repeat + 1):
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if cuda:
            torch.cuda.synchronize()
        if i:
            best = min(best, time.perf_counter() - start)
    return best


def ramp(frames: int) -> list[int]:
    sizes, total, size = [3], 3, 16
    while total < frames:
        sizes.append(min(size, frames - total))
        total += sizes[-1]
        size = min(size * 2, 64)
    return sizes


def snr_db(audio: torch.Tensor, reference: torch.Tensor) -> float | None:
    """dB; None when the two are identical."""
    noise = (audio.double() - reference.double()).pow(2).sum()
    if noise == 0:
        return None
    return round((10 * torch.log10(reference.double().pow(2).sum() / noise)).item(), 1)


@torch.inference_mode()
def stream_snr(
    preset: str,
    device: str,
    precision: str,
    activations: str,
    rows: int,
    frames: int,
    channels_last_below: int | None,
    between_convs: bool | None,
    channels_last_dtype: torch.dtype | None = None,
    next_activation: bool = True,
    state_copies: bool = False,
) -> float | None:
    reference = build(preset, device, "fp32")
    decoder = build(preset, device, precision, activations)
    gen = torch.Generator().manual_seed(1)
    codes = torch.randint(0, decoder.config.codebook_size, (rows, frames, 4), generator=gen)
    full = reference(codes.to(device))
    codec = StreamingCodec(
        decoder,
        num_slots=rows,
        scratch_rows=rows,
        channels_last_below=channels_last_below,
        fuse_between_convs=between_convs,
        channels_last_dtype=channels_last_dtype,
        fuse_next_activation=next_activation,
        fuse_state_copies=state_copies,
    )
    streams = CodecStreams(codec, max_piece_frames=64)
    pieces: list[list[torch.Tensor]] = [[] for _ in range(rows)]
    start = 0
    for seq, size in enumerate(ramp(frames)):
        stop = start + size
        chunks = [StreamChunk(f"r{r}", codes[r, start:stop], seq, stop == frames) for r in range(rows)]
        for r, audio in enumerate(streams.decode(chunks)):
            pieces[r].append(audio)
        start = stop
    streamed = torch.stack([torch.cat(p) for p in pieces])
    return snr_db(streamed, full)


@torch.inference_mode()
def throughput(args, decoder: NanoCodecDecoder, mode: str, batch: int, new: int) -> dict:
    cuda = decoder.device.type == "cuda"
    slice_rows = min(batch, args.max_graph_batch)
    gen = torch.Generator().manual_seed(batch)
    if mode == "window":
        frames = new + RECEPTIVE_FIELD_FRAMES
        codes = torch.randint(0, 4032, (batch, frames, 4), generator=gen).to(decoder.device)
        graphs = CodecGraphs(decoder, [slice_rows], [frames])
        graphs.capture()
        run = (lambda: graphs(codes)) if cuda else (lambda: decoder(codes))
    else:
        frames = new
        planned = args.replay_plan != "none"
        codec = StreamingCodec(
            decoder,
            num_slots=batch,
            scratch_rows=args.max_graph_batch if planned else slice_rows,
            channels_last_below=args.channels_last_below,
            fuse_between_convs=args.between_convs,
            channels_last_dtype=args.channels_last_dtype,
            fuse_next_activation=args.next_activation,
            fuse_state_copies=args.state_copies,
        )
        codes = torch.randint(0, 4032, (batch, frames, 4), generator=gen).to(decoder.device)
        lengths = torch.full((batch,), frames, dtype=torch.int64, device=decoder.device)
        slots = torch.arange(batch, device=decoder.device)
        if planned:  # the shipped batch buckets, the rows split by the plan under test
            buckets = [b for b in DEFAULT_BATCH_BUCKETS if b <= args.max_graph_batch]
            graphs = StreamingGraphs(codec, buckets, [frames], plan=args.replay_plan)
        else:
            graphs = StreamingGraphs(codec, [slice_rows], [frames])
        graphs.capture()
        run = (lambda: graphs(codes, lengths, slots)) if cuda else (lambda: codec.step(codes, lengths, slots))
    seconds = timed(run, args.repeat, cuda)
    fps = batch * new / seconds
    return {
        "mode": mode,
        "replay_plan": args.replay_plan if mode == "stateful" else "none",
        "replays_per_step": len(graphs.slices(batch, frames)) if mode == "stateful" and cuda else None,
        "precision": decoder.precision,
        "activations": "fused" if decoder.fused_activations else "eager",
        "between_convs": codec.between_fused if mode == "stateful" else None,
        "channels_last_dtype": str(codec.channels_last_dtype).removeprefix("torch.") if mode == "stateful" else None,
        "next_activation": codec.between_fused and codec.fuse_next_activation if mode == "stateful" else None,
        "state_copies": codec.state_copies_fused if mode == "stateful" else None,
        "batch": batch,
        "new_frames": new,
        "decoded_frames_per_row": frames,
        "ms_per_step": round(seconds * 1e3, 2),
        "new_frames_per_s": round(fps),
        "x_real_time": round(fps / FRAME_RATE, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="350m", choices=list(CODEC_PRESETS))
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--batches", nargs="+", type=int, default=[64, 128, 256])
    parser.add_argument("--chunks", nargs="+", type=int, default=[16, 64], help="new frames per chunk")
    parser.add_argument("--precisions", nargs="+", default=list(PRECISIONS), choices=PRECISIONS)
    parser.add_argument(
        "--activations",
        nargs="+",
        default=["eager", "fused"] if fused.available() else ["eager"],
        choices=("eager", "fused"),
        help="half-snakes in eager PyTorch or as one Triton kernel each (CUDA)",
    )
    parser.add_argument("--max-graph-batch", type=int, default=64, help="rows per graph replay (the YAML's largest)")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--snr-rows", type=int, default=8)
    parser.add_argument("--snr-frames", type=int, default=250)
    parser.add_argument(
        "--channels-last-below",
        type=int,
        default=None,
        help="stateful codec: residual layers narrower than this run channels-last (default: the device's default)",
    )
    parser.add_argument(
        "--replay-plan",
        default="none",
        choices=("none", *REPLAY_PLANS),
        help="stateful rows: capture the shipped batch buckets and split the rows by this plan (default: one bucket "
        "of min(batch, --max-graph-batch) rows, full slices)",
    )
    parser.add_argument(
        "--between-convs",
        choices=("on", "off"),
        default=None,
        help="stateful codec: the between-conv Triton kernels (nanocodec/between_convs.py; default: where they run)",
    )
    parser.add_argument(
        "--channels-last-dtype",
        choices=("auto", "float32", "float16"),
        default="auto",
        help="stateful codec: the channels-last convs' dtype (auto: float16 with TF32 and the between-conv kernels)",
    )
    parser.add_argument(
        "--next-activation",
        choices=("on", "off"),
        default="on",
        help="stateful codec with the between-conv kernels: each residual add also writes the next unit's input "
        "half-snake (on, the default) or leaves it to the half-snake kernel",
    )
    parser.add_argument(
        "--state-copies",
        choices=("on", "off"),
        default="on",
        help="stateful codec: the rows' states moved by one Triton kernel each way (nanocodec/state_copies.py; on, "
        "the default, where the kernels run) or by PyTorch's index_select / gather / index_copy_ (off)",
    )
    parser.add_argument(
        "--modes", nargs="+", default=["window", "stateful"], choices=("window", "stateful"), help="modes to time"
    )
    parser.add_argument(
        "--cudnn-benchmark",
        action="store_true",
        help="cudnn.benchmark for the whole run (cuDNN times its candidate engines for every conv shape)",
    )
    parser.add_argument("--tag", default="", help="suffix of the JSON's name")
    parser.add_argument("--out", type=Path, default=None, help="write codec-streaming{TAG}.json here")
    args = parser.parse_args()
    torch.backends.cudnn.benchmark = args.cudnn_benchmark
    args.between_convs = None if args.between_convs is None else args.between_convs == "on"
    args.channels_last_dtype = None if args.channels_last_dtype == "auto" else getattr(torch, args.channels_last_dtype)
    args.next_activation = args.next_activation == "on"
    args.state_copies = args.state_copies == "on"
    device_name = torch.cuda.get_device_name() if args.device.startswith("cuda") else platform.processor()
    rows, snr = [], {}
    configs = [(p, a) for p in args.precisions for a in args.activations]
    for precision, acts in configs:
        key = f"{precision}/{acts}"
        snr[key] = stream_snr(
            args.preset,
            args.device,
            precision,
            acts,
            args.snr_rows,
            args.snr_frames,
            args.channels_last_below,
            args.between_convs,
            args.channels_last_dtype,
            args.next_activation,
            args.state_copies,
        )
        print(f"{key}: streamed SNR vs strict fp32 one-shot {snr[key]} dB", flush=True)
        decoder = build(args.preset, args.device, precision, acts)
        for batch in args.batches:
            for new in args.chunks:
                for mode in args.modes:
                    row = throughput(args, decoder, mode, batch, new)
                    rows.append(row)
                    print(json.dumps(row), flush=True)
        del decoder
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()
    print("\n| precision | half-snakes | SNR dB | batch | new frames/chunk | windows (28 + new) new frames/s", end="")
    print(" | stateful new frames/s | gain |")
    print("|---|---|---|---|---|---|---|---|")
    for precision, acts in configs:
        for batch in args.batches:
            for new in args.chunks:
                pick = {
                    r["mode"]: r
                    for r in rows
                    if (r["precision"], r["activations"], r["batch"], r["new_frames"]) == (precision, acts, batch, new)
                }
                w, s = (pick[m]["new_frames_per_s"] if m in pick else None for m in ("window", "stateful"))
                gain = f"{s / w:.2f}x" if w and s else "-"
                snr_text = snr[f"{precision}/{acts}"] or "exact"
                w_text, s_text = (f"{v:,}" if v else "-" for v in (w, s))
                print(f"| {precision} | {acts} | {snr_text} | {batch} | {new} | {w_text} | {s_text} | {gain} |")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        result = {
            "device": device_name,
            "torch": torch.__version__,
            "preset": args.preset,
            "channels_last_below": args.channels_last_below,
            "between_convs": args.between_convs,
            "cudnn_benchmark": args.cudnn_benchmark,
            "cudnn_env": {k: v for k, v in os.environ.items() if k.startswith("TORCH_CUDNN")},
            "snr_db_vs_fp32": snr,
            "snr_frames": args.snr_frames,
            "rows": rows,
        }
        (args.out / f"codec-streaming{args.tag}.json").write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
