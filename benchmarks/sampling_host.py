"""Host cost of two per-step sampling chores of Stage 0 at N seeded streams.

    python3 benchmarks/sampling_host.py [--streams 256] [--steps 250] [--device cuda] [--out DIR]

1. Noise for the code heads of seeded requests: one ``exponential_`` per request's generator (how vLLM's
   ``random_sample`` draws codebook 1, and how the heads drew before) against the hash of ``seeded_noise``, as torch
   ops (``seeded_exponentials``) and, where it can run, as the one Triton kernel the heads use on CUDA.
2. vLLM's penalties' output-token tensor (``_convert_to_tensors``: pad every request's output list, pin a new host
   tensor, copy it to the device) over a run whose lists grow by one token a step: what a fix would save.
Milliseconds per step, host wall time with the device synchronised after each step; writes ``sampling-host.json``.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import torch
from vllm.v1.sample.ops import penalties

from vllm_omni_kani.model_executor.models.kani_tts import token_layout as tl
from vllm_omni_kani.model_executor.models.kani_tts.kani_tts_lm import NUM_CODE_HEADS
from vllm_omni_kani.model_executor.models.kani_tts.seeded_noise import (
    fused_kernel_available,
    noise_table,
    scatter_hashed_exponentials,
    seeded_exponentials,
)

VOCAB = 68_442  # the parallel-head checkpoints' lm_head


def _timed(step, steps: int, device: torch.device) -> float:
    """Mean ms of ``step(i)`` over ``steps`` calls, the device synchronised after each."""
    step(0)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    start = time.perf_counter()
    for i in range(steps):
        step(i)
        sync()
    return (time.perf_counter() - start) / steps * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", type=int, default=256)
    parser.add_argument("--steps", type=int, default=250)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    device = torch.device(args.device)
    width = NUM_CODE_HEADS * tl.CODEBOOK_SIZE
    generators = [torch.Generator(device=device).manual_seed(i) for i in range(args.streams)]
    noise = torch.empty(args.streams, width, device=device)

    def per_generator(_: int) -> None:
        for row, generator in enumerate(generators):
            noise[row].exponential_(generator=generator)

    def hashed(_: int) -> None:
        seeded_exponentials(generators, width, device)

    rows = list(range(args.streams))

    def hashed_kernel(_: int) -> None:  # as code_sampler runs it: one host table, one copy, one kernel
        table = noise_table(rows, generators)
        table = table.pin_memory() if device.type == "cuda" else table
        scatter_hashed_exponentials(noise, table.to(device, non_blocking=True))

    rng = random.Random(0)
    lists = [[rng.randrange(VOCAB)] for _ in range(args.streams)]

    def penalty_tokens(_: int) -> None:
        for tokens in lists:
            tokens.append(rng.randrange(VOCAB))
        penalties._convert_to_tensors(lists, VOCAB, device)

    result = {"device": str(device), "streams": args.streams, "steps": args.steps, "ms_per_step": {}}
    if device.type == "cuda":
        result["gpu"] = torch.cuda.get_device_name(device)
    chores = [("noise, one draw per generator", per_generator), ("noise, hashed, torch ops", hashed)]
    if fused_kernel_available(device):
        chores.append(("noise, hashed, one kernel", hashed_kernel))
    chores.append(("penalty tokens, vLLM", penalty_tokens))
    for name, fn in chores:
        result["ms_per_step"][name] = _timed(fn, args.steps, device)
    for name, ms in result["ms_per_step"].items():
        print(f"{name:<32} {ms:8.3f} ms per step")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "sampling-host.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
