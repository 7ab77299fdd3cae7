"""Where the stateful codec step's GPU time goes, layer by layer, and what each conv costs under other kernels.

    python3 benchmarks/codec_layers.py --batch 64 --frames 64 --out DIR

1. **Sections.** One eager :meth:`StreamingCodec.step` (real-size codec, random weights, the shipped precision
   and half-snakes), timed section by section with CUDA events: the pre-conv, each up-sampling stage's transposed
   conv and its residual layer, the post-conv. Each row gives its share of the step, its conv FLOPs and the
   TFLOP/s they ran at.
2. **Convs alone.** Every distinct (channels, kernel, dilation) of the residual layers at that stage's rate, on a
   ``[batch, C, frames·rate + (K-1)·d]`` input: cuDNN float32 (strict and TF32), cuDNN as a 2-D conv in
   channels-last, each also autotuned (``cudnn.benchmark``) and with the channels zero-padded to a multiple of 4, 8
   or 16, a dilated conv as an undilated ``(K, 1)`` one over ``[B, C, T/d, d]`` (channels-last, padded ×8), and the
   Triton kernel of ``triton_conv.py`` (beside this script) (TF32; and with the residual add fused).
   Milliseconds per call, TFLOP/s, and the largest difference from cuDNN strict float32 relative to its output's
   largest magnitude.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from vllm_omni_kani.model_executor.models.kani_tts.nanocodec import NanoCodecDecoder, fused, load_decoder_state
from vllm_omni_kani.model_executor.models.kani_tts.nanocodec.decoder import LRELU_SLOPE, CausalConv, cudnn_tf32
from vllm_omni_kani.model_executor.models.kani_tts.nanocodec.streaming import StreamingCodec, padded_channels
from vllm_omni_kani.tools.codec_factory import CODEC_PRESETS, random_decoder_tensors

sys.path.insert(0, str(Path(__file__).parent))
import triton_conv


def build(preset: str, precision: str) -> NanoCodecDecoder:
    with torch.device("cuda"):
        decoder = NanoCodecDecoder(CODEC_PRESETS[preset])
    load_decoder_state(decoder, random_decoder_tensors(CODEC_PRESETS[preset], seed=0))
    return decoder.eval().set_precision(precision).set_fused_activations(fused.available())


def conv_flops(conv: CausalConv, batch: int, samples: int) -> float:
    co, ci, k = conv.weight.shape
    return 2.0 * co * ci * k * batch * samples


def best_ms(fn: Callable[[], object], repeat: int) -> float:
    """Best of ``repeat`` timed calls after one warm-up, CUDA events."""
    fn()
    best = float("inf")
    for _ in range(repeat):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        best = min(best, start.elapsed_time(stop))
    return best


@torch.inference_mode()
def sections(
    decoder: NanoCodecDecoder, batch: int, frames: int, repeat: int, channels_last_below: int | None
) -> list[dict]:
    """Milliseconds per section of one stateful step (the step's code path, as ``StreamingCodec.step`` runs it,
    timed between sections)."""
    codec = StreamingCodec(decoder, num_slots=batch, scratch_rows=1, channels_last_below=channels_last_below)
    codes = torch.randint(0, decoder.config.codebook_size, (batch, frames, decoder.config.num_codebooks), device="cuda")
    lengths = torch.full((batch,), frames, dtype=torch.int64, device="cuda")
    slots = torch.arange(batch, device="cuda")
    d = decoder
    timings: dict[str, list[float]] = {}
    flops: dict[str, float] = {}

    def run(record: bool) -> None:
        events: list[tuple[str, torch.cuda.Event]] = []

        def mark(name: str) -> None:
            if record:
                event = torch.cuda.Event(enable_timing=True)
                event.record()
                events.append((name, event))

        mark("start")
        codec.step(codes, lengths, slots, on_section=mark)
        if record:
            events[-1][1].synchronize()
            for (_, a), (name, b) in itertools.pairwise(events):
                timings.setdefault(name, []).append(a.elapsed_time(b))

    run(False)
    for _ in range(repeat):
        run(True)
    samples, rate = frames, 1
    flops["pre_conv"] = conv_flops(d.pre_conv, batch, samples)
    for i, (up, res) in enumerate(zip(d.up_sample_conv_layers, d.res_layers, strict=True)):
        rate *= up.rate
        channels = up.bias.shape[0]
        convs = [m for m in res.modules() if isinstance(m, CausalConv)]
        # Grouped transposed conv: each output sample sums 2 input channels x 2 taps.
        flops[f"upsample {i} (x{up.rate}, {channels} ch)"] = 2.0 * 4 * channels * batch * frames * rate
        flops[f"residual layer {i} ({channels} ch, {rate} samples/frame)"] = sum(
            conv_flops(c, batch, frames * rate) for c in convs
        )
    flops["post_conv"] = conv_flops(d.post_conv, batch, frames * rate)
    total = sum(min(v) for v in timings.values())
    rows = []
    for name, values in timings.items():
        ms = min(values)
        rows.append(
            {
                "section": name,
                "ms": round(ms, 3),
                "share": round(ms / total, 4),
                "gflop": round(flops.get(name, 0.0) / 1e9, 2),
                "tflops": round(flops.get(name, 0.0) / ms / 1e9, 2),
            }
        )
    return rows


@torch.inference_mode()
def conv_alternatives(
    decoder: NanoCodecDecoder, batch: int, frames: int, repeat: int, max_channels: int | None = None
) -> list[dict]:
    """Every distinct residual-layer conv shape under cuDNN and the Triton kernel."""
    rows = []
    rate = 1
    gen = torch.Generator(device="cuda").manual_seed(0)
    for up, res in zip(decoder.up_sample_conv_layers, decoder.res_layers, strict=True):
        rate *= up.rate
        if max_channels is not None and up.bias.shape[0] > max_channels:
            continue
        seen = set()
        for branch in res.res_blocks:
            for unit in branch.res_blocks:
                for conv, act in ((unit.input_conv, unit.input_activation), (unit.skip_conv, unit.skip_activation)):
                    _, ci, k = conv.weight.shape
                    key = (ci, k, conv.dilation)
                    if key in seen:
                        continue
                    seen.add(key)
                    rows.append(one_conv(conv, act, batch, frames * rate, rate, repeat, gen))
                    print(json.dumps(rows[-1]), flush=True)
        torch.cuda.empty_cache()
    return rows


def padded(
    x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, d: int, multiple: int, channels_last: bool
) -> Callable[[], torch.Tensor]:
    """cuDNN TF32 on channels zero-padded to a multiple (as a layout that kept them padded would hold them)."""
    ci, co = w.shape[1], w.shape[0]
    pad_in, pad_out = -ci % multiple, -co % multiple
    xp = F.pad(x, (0, 0, 0, pad_in))
    wp = F.pad(w, (0, 0, 0, pad_in, 0, pad_out))
    bp = F.pad(b, (0, pad_out))
    if channels_last:
        xp = xp[:, :, None, :].contiguous(memory_format=torch.channels_last)
        wp = wp[:, :, None, :].contiguous(memory_format=torch.channels_last)

    def fn() -> torch.Tensor:
        with cudnn_tf32(True):
            if channels_last:
                return F.conv2d(xp, wp, bp, dilation=(1, d))[:, :co]
            return F.conv1d(xp, wp, bp, dilation=d)[:, :co]

    return fn


def dilation_as_height(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, d: int) -> Callable[[], torch.Tensor]:
    """A dilated conv as an undilated one: channels-last ``[B, T, C]`` memory viewed as ``[B, C, T/d, d]`` is a 2-D
    input whose height steps d samples, so a ``(K, 1)`` kernel reads taps ``t, t+d, ...`` (time padded to a multiple
    of d; the output's memory is ``[B, T_out, C]`` again). Channels zero-padded as the channels-last layers pad them."""
    ci, co = w.shape[1], w.shape[0]
    pad_in, pad_out = padded_channels(ci) - ci, padded_channels(co) - co
    length = x.shape[-1]
    rows = -(-length // d)
    memory = F.pad(x, (0, rows * d - length, 0, pad_in)).transpose(1, 2).contiguous()  # [B, T, C] memory
    x4 = memory.view(x.shape[0], rows, d, ci + pad_in).permute(0, 3, 1, 2)  # [B, C, T/d, d], channels-last
    w4 = F.pad(w, (0, 0, 0, pad_in, 0, pad_out))[..., None].contiguous(memory_format=torch.channels_last)
    bp = F.pad(b, (0, pad_out))
    t_out = length - (w.shape[-1] - 1) * d

    def fn() -> torch.Tensor:
        with cudnn_tf32(True):
            y = F.conv2d(x4, w4, bp)  # [B, C, rows - K + 1, d] channels-last = [B, (rows - K + 1)·d, C] memory
        return y.permute(0, 2, 3, 1).reshape(x.shape[0], -1, co + pad_out)[:, :t_out, :co].transpose(1, 2)

    return fn


def one_conv(conv: CausalConv, act, batch: int, samples: int, rate: int, repeat: int, gen) -> dict:
    co, ci, k = conv.weight.shape
    x = torch.randn(batch, ci, samples + conv.left_pad, device="cuda", generator=gen)
    residual = torch.randn(batch, co, samples, device="cuda", generator=gen)
    w, b, d = conv.weight.float(), conv.bias.float(), conv.dilation
    flops = conv_flops(conv, batch, samples)
    with cudnn_tf32(False):
        reference = F.conv1d(x, w, b, dilation=d)
    scale = reference.abs().max().item()
    taps = triton_conv.tap_major(w)
    alpha, inv_alpha = act.alpha.reshape(-1), act.inv_alpha.reshape(-1)

    def cudnn(tf32: bool) -> Callable[[], torch.Tensor]:
        def fn() -> torch.Tensor:
            with cudnn_tf32(tf32):
                return F.conv1d(x, w, b, dilation=d)

        return fn

    def eager_unit() -> torch.Tensor:
        """What the step does today for one conv of a unit: half-snake kernel, cuDNN TF32 conv, residual add."""
        a = torch.empty_like(x)
        fused.half_snake_into(x, alpha, inv_alpha, LRELU_SLOPE, a)
        with cudnn_tf32(True):
            return residual + F.conv1d(a, w, b, dilation=d)

    def tuned(fn: Callable[[], torch.Tensor]) -> Callable[[], torch.Tensor]:
        """``fn`` with cuDNN autotuning on (it measures its algorithms at the first call of each shape)."""

        def run() -> torch.Tensor:
            torch.backends.cudnn.benchmark = True
            try:
                return fn()
            finally:
                torch.backends.cudnn.benchmark = False

        return run

    cudnn_nhwc = padded(x, w, b, d, 1, channels_last=True)  # a multiple of 1: no padding
    variants: dict[str, Callable[[], torch.Tensor]] = {
        "cudnn fp32": cudnn(False),
        "cudnn tf32": cudnn(True),
        "cudnn tf32 autotuned": tuned(cudnn(True)),
        "cudnn tf32 channels-last 2d": cudnn_nhwc,
        "cudnn tf32 channels-last 2d autotuned": tuned(cudnn_nhwc),
        "snake + cudnn tf32 + add": eager_unit,
    }
    for multiple in (4, 8, 16):
        if ci % multiple:
            variants[f"cudnn tf32 channels padded to x{multiple}"] = padded(x, w, b, d, multiple, channels_last=False)
            variants[f"cudnn tf32 channels-last 2d padded to x{multiple}"] = padded(x, w, b, d, multiple, True)
    if d > 1:
        variants["cudnn tf32 channels-last padded x8, dilation as height"] = dilation_as_height(x, w, b, d)
    variants["triton tf32 t128"] = lambda: triton_conv.causal_conv(x, taps, b, d)
    variants["triton tf32 t128 + add"] = lambda: triton_conv.causal_conv(x, taps, b, d, residual=residual)
    row: dict = {"channels": ci, "out_channels": co, "kernel": k, "dilation": d, "samples_per_frame": rate}
    for name, fn in variants.items():
        try:
            ms = best_ms(fn, repeat)
            out = fn()
            if out.dim() == 4:
                out = out[:, :, 0]
            entry = {"ms": round(ms, 3), "tflops": round(flops / ms / 1e9, 2)}
            if "snake" not in name and "add" not in name:
                entry["max_rel_diff"] = float(f"{((out - reference).abs().max().item() / scale):.2e}")
        except (RuntimeError, ValueError) as exc:  # a variant that cannot run here is reported, not fatal
            entry = {"error": str(exc)[:200]}
        row[name] = entry
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="350m", choices=list(CODEC_PRESETS))
    parser.add_argument("--precision", default="tf32")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--frames", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--max-channels", type=int, default=None, help="only the convs of layers this narrow")
    parser.add_argument(
        "--channels-last-below",
        type=int,
        default=None,
        help="sections: residual layers narrower than this run channels-last (default: the device's default)",
    )
    parser.add_argument("--tag", default="", help="suffix of the JSON's name")
    parser.add_argument("--out", type=Path, default=None, help="write codec-layers-bB-fF{TAG}.json here")
    args = parser.parse_args()
    decoder = build(args.preset, args.precision)
    started = time.perf_counter()
    section_rows = sections(decoder, args.batch, args.frames, args.repeat, args.channels_last_below)
    step_ms = sum(r["ms"] for r in section_rows)
    print(
        f"\nstateful step, batch {args.batch} x {args.frames} frames: {step_ms:.1f} ms "
        f"({args.batch * args.frames / step_ms * 1e3:,.0f} frames/s, eager)"
    )
    print("| section | ms | share | GFLOP | TFLOP/s |\n|---|---|---|---|---|")
    for r in section_rows:
        print(f"| {r['section']} | {r['ms']} | {r['share']:.1%} | {r['gflop']} | {r['tflops']} |")
    conv_rows = conv_alternatives(decoder, args.batch, args.frames, args.repeat, args.max_channels)
    names = [k for k in conv_rows[0] if isinstance(conv_rows[0][k], dict)] if conv_rows else []
    print("\n| C | K | d | " + " | ".join(names) + " |\n|---|---|---|" + "---|" * len(names))
    for r in conv_rows:
        cells = [f"{r[n]['ms']} ms" if "ms" in r.get(n, {}) else "-" for n in names]
        print(f"| {r['channels']} | {r['kernel']} | {r['dilation']} | " + " | ".join(cells) + " |")
    print(f"({time.perf_counter() - started:.0f} s)")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        result = {
            "device": torch.cuda.get_device_name(),
            "torch": torch.__version__,
            "preset": args.preset,
            "precision": args.precision,
            "half_snakes": "fused" if decoder.fused_activations else "eager",
            "channels_last_below": args.channels_last_below,
            "batch": args.batch,
            "frames": args.frames,
            "sections": section_rows,
            "convs": conv_rows,
        }
        (args.out / f"codec-layers-b{args.batch}-f{args.frames}{args.tag}.json").write_text(
            json.dumps(result, indent=1) + "\n"
        )


if __name__ == "__main__":
    main()
