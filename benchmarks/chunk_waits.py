"""How long each chunk waits for the codec, from a server log written with ``KANI_TRACE_CHUNKS=1``.

    python3 benchmarks/chunk_waits.py SERVER_LOG[.gz] [--json OUT]

Stage 0 logs one ``stage0 emit`` line per chunk (wall time, new frames, left context) and Stage 1 one ``stage1
decode`` line per codec step (start, duration, every window's new frames and left context), on the same clock.
A chunk is matched to the first codec step that starts after its emit and still holds an unmatched window of its
shape. Per chunk: the wait (emit → step start) and the step it shared (duration, rows, frames). First chunks alone
say how much of the time to first audio the codec's queue takes; the rest of TTFA is Stage 0 and the transport.
"""

from __future__ import annotations

import argparse
import ast
import bisect
import json
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from audio_vs_frames import log_lines

from vllm_omni_kani.benchmarks.bench_tts import percentile

_EMIT = re.compile(r"stage0 emit req=(\S+) chunk=(\d+) left=(\d+) new=(\d+) .* wall=([\d.]+)")
_STEP = re.compile(r"stage1 decode windows=(\[.*?\]) started=([\d.]+) ms=([\d.]+)")


@dataclass
class Step:
    started: float
    ms: float
    windows: list[tuple[int, int]]
    unmatched: Counter = field(default_factory=Counter)


def read(log: Path) -> tuple[list[tuple[float, str, int, tuple[int, int]]], list[Step]]:
    """(wall, request, chunk index, (new, left)) per emitted chunk, and the codec steps, both in time order."""
    emits, steps = [], []
    for line in log_lines(log):
        if "kani trace:" not in line:
            continue
        if m := _EMIT.search(line):
            emits.append((float(m[5]), m[1], int(m[2]), (int(m[4]), int(m[3]))))
        elif m := _STEP.search(line):
            windows = [tuple(w) for w in ast.literal_eval(m[1])]
            steps.append(Step(float(m[2]), float(m[3]), windows, Counter(windows)))
    return sorted(emits), sorted(steps, key=lambda s: s.started)


def percentiles(values: list[float]) -> dict[str, float]:
    """Count, p50 / p95 as ``bench`` computes its own (interpolated), and the largest."""
    if not values:
        return {}
    return {"n": len(values), "p50": percentile(values, 50), "p95": percentile(values, 95), "max": max(values)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("log", type=Path)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    emits, steps = read(args.log)
    starts = [s.started for s in steps]
    rows: dict[str, dict[str, list[float]]] = {"first chunks": {}, "all chunks": {}}
    unmatched = 0
    for wall, _, index, shape in emits:
        i = bisect.bisect_left(starts, wall)
        while i < len(steps) and not steps[i].unmatched[shape]:
            i += 1
        if i == len(steps):
            unmatched += 1
            continue
        step = steps[i]
        step.unmatched[shape] -= 1
        sample = {
            "wait ms": (step.started - wall) * 1000,
            "step ms": step.ms,
            "step rows": len(step.windows),
            "step frames": sum(new + left for new, left in step.windows),
        }
        for kind in ("all chunks",) + (("first chunks",) if index == 0 else ()):
            for key, value in sample.items():
                rows[kind].setdefault(key, []).append(value)
    report = {
        "log": args.log.name,
        "chunks": len(emits),
        "codec steps": len(steps),
        "unmatched chunks": unmatched,
        **{kind: {key: percentiles(v) for key, v in cols.items()} for kind, cols in rows.items()},
    }
    for kind in ("first chunks", "all chunks"):
        for key, stats in report[kind].items():
            print(f"{kind:<13} {key:<12} " + "  ".join(f"{k} {v:,.1f}" for k, v in stats.items()))
    print(f"{len(emits)} chunks, {len(steps)} codec steps, {unmatched} unmatched")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
