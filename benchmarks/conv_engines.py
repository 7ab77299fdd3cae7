"""Which cuDNN kernels run the codec's channels-last narrow convs, and what each costs, under this process's settings.

    python3 benchmarks/conv_engines.py --batch 64 --frames 32 --out DIR --tag default
    TORCH_CUDNN_V8_API_DISABLED=1 python3 benchmarks/conv_engines.py ... --tag v7

Served at 256 streams, cuDNN ran the residual layers narrower than 128 channels (channels-last, channels padded to a
multiple of 8, as ``StreamingCodec`` runs them) with CUTLASS TF32 kernels, each after two ``convertTensor`` kernels:
one the activation's size, one the weights'. Those conversions were 9.6% of the codec's GPU time
(``codec_kernel_table.py``, docs/BENCHMARKS.md). Each distinct conv of those layers is run here exactly as a step runs
it (``[B, C_padded, 1, T']`` channels-last over the joined ``[state | new]`` buffer, no bias) in several ways:

- ``tf32``: TF32 allowed (what ships);
- ``fp32``: strict float32, which no tensor-core engine may serve;
- ``fp16`` (reference only: its inputs and outputs rounded to half precision).

``--cudnn-benchmark`` runs them all with ``cudnn.benchmark`` (cuDNN times its candidate engines). It is a whole-process
switch because PyTorch caches one engine per conv shape whichever way it was chosen.

For each: best-of-``repeat`` milliseconds per call (CUDA events), every kernel one call launched with its GPU time
(``torch.profiler``), and the largest difference from strict float32 relative to the output's largest magnitude.
Settings read from the environment (the cuDNN API version, heuristic mode) are per process: run the script once per
setting and compare the JSONs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from vllm_omni_kani.model_executor.models.kani_tts.nanocodec import NanoCodecDecoder, load_decoder_state
from vllm_omni_kani.model_executor.models.kani_tts.nanocodec.decoder import CausalConv, cudnn_tf32
from vllm_omni_kani.model_executor.models.kani_tts.nanocodec.streaming import CHANNELS_LAST_BELOW, padded_channels
from vllm_omni_kani.tools.codec_factory import CODEC_PRESETS, random_decoder_tensors

sys.path.insert(0, str(Path(__file__).parent))
from codec_layers import best_ms


def kernels(fn: Callable[[], object]) -> list[dict]:
    """The CUDA kernels one call of ``fn`` launches, in order, with their GPU microseconds."""
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    events.sort(key=lambda e: e.time_range.start)
    return [{"name": e.name[:160], "us": round(e.device_time, 1)} for e in events]


def narrow_convs(decoder: NanoCodecDecoder) -> list[tuple[CausalConv, int, int]]:
    """Each distinct (channels, kernel, dilation) conv of the channels-last residual layers, with its samples per
    frame and how many convs of a step have that shape."""
    found: dict[tuple[int, int, int], list] = {}
    rate = 1
    for up, res in zip(decoder.up_sample_conv_layers, decoder.res_layers, strict=True):
        rate *= up.rate
        if up.bias.shape[0] >= CHANNELS_LAST_BELOW:
            continue
        for conv in (m for m in res.modules() if isinstance(m, CausalConv)):
            key = (conv.weight.shape[1], conv.weight.shape[2], conv.dilation)
            found.setdefault(key, [conv, rate, 0])[2] += 1
    return [tuple(v) for v in found.values()]


@torch.inference_mode()
def one_conv(conv: CausalConv, rate: int, batch: int, frames: int, repeat: int, gen: torch.Generator) -> dict:
    co, ci, k = conv.weight.shape
    width = padded_channels(ci)
    length = frames * rate + conv.left_pad
    joined = torch.zeros(batch, length, width, device="cuda")  # [B, T', C_padded] as a step assembles it
    joined[..., :ci] = torch.randn(batch, length, ci, device="cuda", generator=gen)
    x = joined.transpose(1, 2).unsqueeze(2)  # [B, C, 1, T'] channels-last: no copy
    weight = conv.weight.new_zeros(width, width, 1, k)
    weight[:co, :ci, 0] = conv.weight
    weight = weight.contiguous(memory_format=torch.channels_last)
    x16, w16 = x.half(), weight.half()

    def run(tf32: bool, half: bool = False) -> Callable[[], torch.Tensor]:
        def fn() -> torch.Tensor:
            with cudnn_tf32(tf32):
                if half:
                    return F.conv2d(x16, w16, dilation=(1, conv.dilation))
                return F.conv2d(x, weight, dilation=(1, conv.dilation))

        return fn

    variants = {"tf32": run(True), "fp32": run(False), "fp16": run(False, half=True)}
    reference = variants["fp32"]().float()
    scale = reference.abs().max().item()
    row: dict = {"channels": ci, "padded": width, "kernel": k, "dilation": conv.dilation, "samples": length}
    for name, fn in variants.items():
        out = fn().float()
        row[name] = {
            "ms": round(best_ms(fn, repeat), 4),
            "max_rel_diff": float(f"{(out - reference).abs().max().item() / scale:.3g}"),
            "kernels": kernels(fn),
        }
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="350m", choices=list(CODEC_PRESETS))
    parser.add_argument("--batch", type=int, default=64, help="rows per graph replay (the shipped largest bucket)")
    parser.add_argument("--frames", type=int, default=32, help="new frames per row")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--cudnn-benchmark", action="store_true", help="cudnn.benchmark for the whole run")
    parser.add_argument("--tag", default="", help="suffix of the JSON's name (the setting under test)")
    parser.add_argument("--out", type=Path, default=None, help="write conv-engines-bB-fF{-TAG}.json here")
    args = parser.parse_args()
    torch.backends.cudnn.benchmark = args.cudnn_benchmark
    with torch.device("cuda"):
        decoder = NanoCodecDecoder(CODEC_PRESETS[args.preset])
    load_decoder_state(decoder, random_decoder_tensors(CODEC_PRESETS[args.preset], seed=0))
    gen = torch.Generator(device="cuda").manual_seed(0)
    started = time.perf_counter()
    rows = []
    for conv, rate, calls in narrow_convs(decoder.eval()):
        rows.append({**one_conv(conv, rate, args.batch, args.frames, args.repeat, gen), "calls_per_step": calls})
        torch.cuda.empty_cache()
    names = [n for n in rows[0] if isinstance(rows[0][n], dict)]
    print(f"| C | K | d | {' | '.join(names)} |\n|---|---|---|" + "---|" * len(names))
    for r in rows:
        cells = [f"{r[n]['ms']} ms ({len(r[n]['kernels'])} kernels)" for n in names]
        print(f"| {r['channels']} | {r['kernel']} | {r['dilation']} | " + " | ".join(cells) + " |")
    for n in names:
        per_step = sum(r[n]["ms"] * r["calls_per_step"] for r in rows)
        print(f"{n}: {per_step:.2f} ms for a step's {sum(r['calls_per_step'] for r in rows)} narrow convs")
    print(f"({time.perf_counter() - started:.0f} s)")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        result = {
            "device": torch.cuda.get_device_name(),
            "torch": torch.__version__,
            "cudnn": torch.backends.cudnn.version(),
            "cudnn_benchmark": args.cudnn_benchmark,
            "cudnn_env": {k: v for k, v in os.environ.items() if k.startswith("TORCH_CUDNN")},
            "preset": args.preset,
            "batch": args.batch,
            "frames": args.frames,
            "convs": rows,
        }
        suffix = f"-{args.tag}" if args.tag else ""
        (args.out / f"conv-engines-b{args.batch}-f{args.frames}{suffix}.json").write_text(
            json.dumps(result, indent=1) + "\n"
        )


if __name__ == "__main__":
    main()
