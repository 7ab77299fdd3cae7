"""A burst of requests through each Stage-0 engine, step by step, with the Triton compiles met on the way.

    python3 benchmarks/wave_steps.py SERVER_LOG[.gz] [--gap-ms 50] [--min-burst 32] [--json OUT]

Each Stage-0 scheduler logs, per request, when it was added, first scheduled and first output
(``[KaniFirstOutput]``, ``time.perf_counter()`` seconds, one clock for the host); with ``KANI_JIT_EVENTS=1`` every
process logs its Triton compiles on that clock (``[KaniJit]``). A burst is a run of ``--min-burst`` or more
requests added with no pause longer than ``--gap-ms`` (a level's first wave, the benchmark's warm-up). Per burst and
engine: the steps that admitted its requests (ms from the burst's first addition: when scheduled, how many, when
their first output came out), the longest gap between two steps that admitted requests, and the
compiles (which kernel, which engine, ms) that began inside the burst. An engine whose step takes several times its
neighbours' while a compile runs in it is waiting for Triton, not for the GPU.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import re
from pathlib import Path

from audio_vs_frames import log_lines

_FIRST = re.compile(
    r"StageEngineCoreProc_stage0_replica(\d+).*\[KaniFirstOutput\] stage=0 request_id=(\S+) "
    r"added=([\d.]+) scheduled=([\d.]+) output=([\d.]+)"
)
_JIT = re.compile(r"\((\S+) pid=(\d+)\).*\[KaniJit\] kernel=(\S+) start=([\d.]+) ms=([\d.]+) warmup=(\S+)")


def first_outputs(lines: list[str]) -> list[tuple[int, str, float, float, float]]:
    """(replica, request id, added, scheduled, output) of every Stage-0 request, by when it was added."""
    rows = []
    for line in lines:
        m = _FIRST.search(line)
        if m:
            rows.append((int(m[1]), m[2], float(m[3]), float(m[4]), float(m[5])))
    return sorted(rows, key=lambda r: r[2])


def jit_events(lines: list[str]) -> list[dict]:
    """Every ``[KaniJit]`` line: the process, kernel, start (s) and milliseconds."""
    out = []
    for line in lines:
        m = _JIT.search(line)
        if m:
            out.append({"process": m[1], "pid": int(m[2]), "kernel": m[3], "start": float(m[4]), "ms": float(m[5])})
    return sorted(out, key=lambda e: e["start"])


def bursts(rows: list[tuple], gap_s: float, min_size: int) -> list[list[tuple]]:
    groups: list[list[tuple]] = []
    for row in rows:
        if groups and row[2] - groups[-1][-1][2] <= gap_s:
            groups[-1].append(row)
        else:
            groups.append([row])
    return [g for g in groups if len(g) >= min_size]


def burst_report(burst: list[tuple], jits: list[dict]) -> dict:
    t0 = burst[0][2]

    def ms(t: float) -> float:
        return round((t - t0) * 1000.0, 1)

    end = max(r[4] for r in burst)
    engines = {}
    for replica in sorted({r[0] for r in burst}):
        mine = [r for r in burst if r[0] == replica]
        steps = collections.defaultdict(list)
        for r in mine:
            steps[r[3]].append(r)
        # An engine takes new requests in between its steps: a long gap between two steps that admitted some is a
        # step (or a stall) that held the burst's next requests outside.
        admitted = sorted(steps)
        gaps = [b - a for a, b in itertools.pairwise(admitted)] or [0.0]
        engines[str(replica)] = {
            "requests": len(mine),
            "steps": [
                {"scheduled_ms": ms(t), "admitted": len(rs), "first_output_ms": ms(min(r[4] for r in rs))}
                for t, rs in sorted(steps.items())
            ],
            "longest_gap_between_admissions_ms": round(max(gaps) * 1000.0, 1),
            "longest_first_step_ms": round(max(r[4] - r[3] for r in mine) * 1000.0, 1),
        }
    inside = [
        {**e, "start_ms": ms(e["start"])} for e in jits if t0 - 1.0 <= e["start"] <= end
    ]  # a compile that began just before the burst still holds its first step
    return {
        "requests": len(burst),
        "span_ms": ms(end),
        "engines": engines,
        "jit": [{k: v for k, v in e.items() if k != "start"} for e in inside],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("log", type=Path)
    parser.add_argument("--gap-ms", type=float, default=50.0)
    parser.add_argument("--min-burst", type=int, default=32)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    lines = log_lines(args.log)
    jits = jit_events(lines)
    report = [burst_report(b, jits) for b in bursts(first_outputs(lines), args.gap_ms / 1000.0, args.min_burst)]
    for index, row in enumerate(report):
        print(f"burst {index}: {row['requests']} requests over {row['span_ms']} ms")
        for replica, engine in row["engines"].items():
            steps = " ".join(f"{s['scheduled_ms']}+{s['admitted']}->{s['first_output_ms']}" for s in engine["steps"])
            print(
                f"  engine {replica}: {engine['requests']} requests, longest gap between admissions "
                f"{engine['longest_gap_between_admissions_ms']} ms, longest first step "
                f"{engine['longest_first_step_ms']} ms"
            )
            print(f"    steps (scheduled ms + admitted -> first output ms): {steps}")
        for e in row["jit"]:
            print(f"  compile {e['kernel']} in {e['process']} at {e['start_ms']} ms for {e['ms']} ms")
    total = len(jits)
    print(f"compiles in the log: {total} ({sum(e['ms'] for e in jits):.0f} ms)")
    if args.json:
        args.json.write_text(json.dumps({"bursts": report, "compiles": jits}, indent=1) + "\n")


if __name__ == "__main__":
    main()
