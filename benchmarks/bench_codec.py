"""Stage-1 decode throughput of the native NanoCodec decoder; prints a Markdown table.

    .venv/bin/python benchmarks/bench_codec.py --presets tiny 350m --batches 1 16 --frames 8

Codecs are the checkpoint factory's (random weights, same shapes as trained ones), built in memory.
A row decodes ``batch × frames`` frames in one call; frames/s counts every decoded frame and
"× real time" divides by the codec's 12.5 frames/s. ``--fused-branches`` also times the three
residual branches stacked into one grouped conv per step (kernels zero-padded to 11 taps) and
reports how far its audio moves from the exact decoder.
"""

from __future__ import annotations

import argparse
import platform
import time

import torch
import torch.nn.functional as F

from vllm_omni_kani.model_executor.models.kani_tts.nanocodec import NanoCodecDecoder, load_decoder_state
from vllm_omni_kani.model_executor.models.kani_tts.nanocodec.decoder import LRELU_SLOPE, ResidualLayer
from vllm_omni_kani.tools.codec_factory import CODEC_PRESETS, random_decoder_tensors


def build(preset: str, device: str) -> NanoCodecDecoder:
    with torch.device(device):
        decoder = NanoCodecDecoder(CODEC_PRESETS[preset])
    load_decoder_state(decoder, random_decoder_tensors(CODEC_PRESETS[preset], seed=0))
    return decoder.eval()


def time_decode(decoder: NanoCodecDecoder, codes: torch.Tensor, repeat: int) -> float:
    """Seconds per decode call (best of ``repeat`` after one warm-up)."""
    best = float("inf")
    with torch.inference_mode():
        for i in range(repeat + 1):
            if codes.is_cuda:
                torch.cuda.synchronize()
            start = time.perf_counter()
            decoder(codes)
            if codes.is_cuda:
                torch.cuda.synchronize()
            if i:
                best = min(best, time.perf_counter() - start)
    return best


class FusedResidualLayer(torch.nn.Module):
    """The branches of a ResidualLayer as one ``[B, n·C, T]`` tensor and grouped convs (groups = n)."""

    def __init__(self, layer: ResidualLayer) -> None:
        super().__init__()
        branches = list(layer.res_blocks)
        self.n = len(branches)
        self.channels = branches[0].res_blocks[0].input_conv.weight.shape[0]
        width = max(b.res_blocks[0].input_conv.weight.shape[-1] for b in branches)
        self.units = []
        for m in range(len(branches[0].res_blocks)):
            units = [b.res_blocks[m] for b in branches]
            self.units.append(
                (
                    self._act([u.input_activation for u in units]),
                    self._conv([u.input_conv for u in units], width),
                    self._act([u.skip_activation for u in units]),
                    self._conv([u.skip_conv for u in units], width),
                )
            )

    def _act(self, acts):
        c, device = self.channels, acts[0].alpha.device
        alpha = torch.ones(1, self.n * c, 1, device=device)
        mask = torch.zeros(1, self.n * c, 1, dtype=torch.bool, device=device)
        for i, a in enumerate(acts):
            alpha[:, i * c : i * c + a.snake_channels] = a.alpha
            mask[:, i * c : i * c + a.snake_channels] = True
        return alpha, (alpha + 1e-9).reciprocal(), mask

    def _conv(self, convs, width):
        weights = [F.pad(c.weight, (width - c.weight.shape[-1], 0)) for c in convs]  # causal: pad the past
        return (
            torch.cat(weights),
            torch.cat([c.bias for c in convs]),
            convs[0].dilation,
            (width - 1) * convs[0].dilation,
        )

    @staticmethod
    def _apply_act(x, act):
        alpha, inv, mask = act
        return torch.where(mask, x + inv * torch.sin(alpha * x).pow(2), F.leaky_relu(x, LRELU_SLOPE))

    def forward(self, x):
        h = x.repeat(1, self.n, 1)
        for in_act, (w1, b1, d1, p1), skip_act, (w2, b2, d2, p2) in self.units:
            t = F.conv1d(F.pad(self._apply_act(h, in_act), (p1, 0)), w1, b1, dilation=d1, groups=self.n)
            h = h + F.conv1d(F.pad(self._apply_act(t, skip_act), (p2, 0)), w2, b2, dilation=d2, groups=self.n)
        parts = h.split(self.channels, dim=1)
        total = parts[0]
        for p in parts[1:]:
            total = total + p
        return total / self.n


def fused_copy(decoder: NanoCodecDecoder) -> NanoCodecDecoder:
    fused = build_like(decoder)
    fused.res_layers = torch.nn.ModuleList(FusedResidualLayer(layer) for layer in decoder.res_layers)
    fused.allow_tf32 = decoder.allow_tf32
    return fused


def build_like(decoder: NanoCodecDecoder) -> NanoCodecDecoder:
    clone = NanoCodecDecoder(decoder.config).to(decoder.device)
    clone.load_state_dict(decoder.state_dict())
    clone.refresh()
    return clone.eval()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--presets", nargs="+", default=["tiny", "350m"], choices=list(CODEC_PRESETS))
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 16])
    parser.add_argument("--frames", type=int, default=8, help="frames per batch row (28 + new in streaming)")
    parser.add_argument("--repeat", type=int, default=3, help="timed calls per row; the best is reported")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--fused-branches", action="store_true", help="also time stacked residual branches")
    parser.add_argument("--tf32", action="store_true", help="let cuDNN run float32 convs in TF32 (GPU)")
    parser.add_argument("--bf16-error", action="store_true", help="also print the relative error of a bf16 decode")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {platform.machine()}, {args.threads} threads, {args.device}\n")
    print("| codec | batch | frames/row | layout | ms/call | frames/s | × real time | max abs diff vs exact |")
    print("|---|---|---|---|---|---|---|---|")
    errors: list[str] = []
    for preset in args.presets:
        decoder = build(preset, args.device)
        decoder.allow_tf32 = args.tf32
        variants = [("exact (separate branches)", decoder)]
        if args.fused_branches:
            variants.append(("fused branches", fused_copy(decoder)))
        for batch in args.batches:
            gen = torch.Generator().manual_seed(batch)
            shape = (batch, args.frames, decoder.config.num_codebooks)
            codes = torch.randint(0, decoder.config.codebook_size, shape, generator=gen).to(args.device)
            with torch.inference_mode():
                exact = decoder(codes)
            for name, model in variants:
                seconds = time_decode(model, codes, args.repeat)
                with torch.inference_mode():
                    diff = (model(codes) - exact).abs().max().item()
                fps = batch * args.frames / seconds
                rate = CODEC_PRESETS[preset].frame_rate
                print(
                    f"| {preset} | {batch} | {args.frames} | {name} | {seconds * 1e3:.0f} | {fps:.0f} | "
                    f"{fps / rate:.1f} | {diff:.1e} |"
                )
        if args.bf16_error:
            errors.append(f"{preset}: bf16 relative L2 error {bf16_error(decoder, codes):.2e}")
    for line in errors:
        print(f"\n{line}")


def bf16_error(decoder: NanoCodecDecoder, codes: torch.Tensor) -> float:
    """``‖bf16 − fp32‖ / ‖fp32‖`` over one batch of audio."""
    with torch.inference_mode():
        exact = decoder(codes)
        low = build_like(decoder).to(torch.bfloat16)(codes).float()
    return ((low - exact).norm() / exact.norm()).item()


if __name__ == "__main__":
    main()
