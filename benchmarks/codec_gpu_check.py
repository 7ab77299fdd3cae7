"""GPU checks of the native NanoCodec decoder: NeMo parity, TF32, CUDA-graph capture.

    python benchmarks/codec_gpu_check.py            # needs a CUDA device; no vLLM, no NeMo

Decodes the stored NeMo reference cases (tests/data/nanocodec/) on the GPU with strict float32 convs
and with TF32, then captures ``forward`` of the real-size decoder in a CUDA graph at a streaming
shape and compares replay with eager (output and time per call).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from vllm_omni_kani.model_executor.models.kani_tts.nanocodec import NanoCodecDecoder, load_decoder_state
from vllm_omni_kani.tools.codec_factory import CODEC_PRESETS, random_decoder_tensors

REFERENCE = Path(__file__).resolve().parents[1] / "tests" / "data" / "nanocodec" / "nemo_reference.npz"


def build(preset: str, seed: int) -> NanoCodecDecoder:
    with torch.device("cuda"):
        decoder = NanoCodecDecoder(CODEC_PRESETS[preset])
    load_decoder_state(decoder, random_decoder_tensors(CODEC_PRESETS[preset], seed))
    return decoder.eval()


def per_call(fn, repeat: int = 10) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / repeat


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--frames", type=int, default=44, help="window length for the graph (28 context + 16 new)")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    ref = np.load(REFERENCE)
    decoders: dict[tuple[str, int], NanoCodecDecoder] = {}
    print("\n| case | max abs diff vs NeMo (CPU), strict fp32 | with TF32 |\n|---|---|---|")
    for name, preset, seed in json.loads(str(ref["cases"])):
        if (preset, seed) not in decoders:
            decoders[preset, seed] = build(preset, seed)
        decoder = decoders[preset, seed]
        tokens = torch.from_numpy(ref[f"{name}.tokens"]).long().transpose(1, 2)
        lengths = torch.from_numpy(ref[f"{name}.lengths"])
        nemo = torch.from_numpy(ref[f"{name}.audio"])
        diffs = []
        for tf32 in (False, True):
            decoder.allow_tf32 = tf32
            diffs.append((decoder.decode(tokens, lengths).cpu() - nemo).abs().max().item())
        decoder.allow_tf32 = False
        print(f"| `{name}` | {diffs[0]:.1e} | {diffs[1]:.1e} |")

    decoder = decoders["350m", 0]
    print("\n| 350m, CUDA graph | batch | frames | eager ms | graph ms | max abs diff graph vs eager |")
    print("|---|---|---|---|---|---|")
    for batch in (1, 16):
        static = torch.randint(0, decoder.config.codebook_size, (batch, args.frames, 4), device="cuda")
        with torch.inference_mode():
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                decoder(static)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                captured = decoder(static)
            fresh = torch.randint(0, decoder.config.codebook_size, static.shape, device="cuda")
            static.copy_(fresh)
            graph.replay()
            diff = (captured - decoder(fresh)).abs().max().item()
            eager_s, graph_s = per_call(lambda x=fresh: decoder(x)), per_call(graph.replay)
        print(f"| | {batch} | {args.frames} | {eager_s * 1e3:.1f} | {graph_s * 1e3:.1f} | {diff:.1e} |")


if __name__ == "__main__":
    main()
