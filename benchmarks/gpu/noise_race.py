"""Does a seeded-noise table copied from a temporary pinned tensor reach the kernel intact under pinned traffic?

    python3 benchmarks/gpu/noise_race.py [--steps 2000] [--width 12096]

The code heads copy each step's noise table with ``table.pin_memory().to(device, non_blocking=True)`` and drop the
pinned tensor at once. If the host allocator handed that block out again before the copy ran, another tensor's
bytes would become the table: rows written to the wrong places and others left as ``torch.empty``'s garbage. Here
each step delays the stream (``torch.cuda._sleep``) before the copy, pins and fills other tensors right after, and
checks every row of the result against the torch reference. Runs without vLLM (the module is loaded by path).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]


def load_seeded_noise():
    path = ROOT / "vllm_omni_kani/model_executor/models/kani_tts/seeded_noise.py"
    spec = importlib.util.spec_from_file_location("seeded_noise", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--width", type=int, default=12096)
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--sleep-cycles", type=int, default=2_000_000)
    args = parser.parse_args()
    sn = load_seeded_noise()
    dev = torch.device("cuda")
    gen = torch.Generator().manual_seed(0)
    bad_steps = nan_steps = 0
    for _ in range(args.steps):
        rows = torch.randperm(args.rows, generator=gen)
        keys = torch.randint(0, 2**32, (args.rows, 4), generator=gen, dtype=torch.int64)
        table = torch.cat([rows[:, None], keys], dim=1)
        out = torch.full((args.rows, args.width), float("nan"), device=dev)
        torch.cuda._sleep(args.sleep_cycles)  # the stream is busy: the copy below waits
        on_device = table.pin_memory().to(dev, non_blocking=True)
        sn.scatter_hashed_exponentials(out, on_device)
        # Other pinned traffic right away, as a step's other copies would make.
        for _ in range(4):
            other = torch.empty_like(table).pin_memory()
            other.fill_(-7)
            other.to(dev, non_blocking=True)
        reference = torch.empty_like(out)
        reference[rows.to(dev)] = sn.hashed_exponentials(keys.to(dev), args.width)
        torch.cuda.synchronize()
        ulps = 4 * torch.finfo(torch.float32).eps
        ok = (out - reference).abs() <= ulps * reference.abs().clamp_min(1.0)
        if not bool(ok.all()):
            bad_steps += 1
            nan_steps += int(bool(out.isnan().any()))
    result = {
        "steps": args.steps,
        "rows": args.rows,
        "width": args.width,
        "bad_steps": bad_steps,
        "steps_with_unwritten_rows": nan_steps,
        "torch": torch.__version__,
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
