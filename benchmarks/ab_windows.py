"""The sampler patches' A/B inside one engine, from the step meter's lines (``KANI_SAMPLER_AB_PERIOD_S``).

    python3 benchmarks/ab_windows.py LOG [LOG...] [--batches 64,256] [--min-share 0.9] [--json OUT]

Every line ``kani stage0 steps: ... ms per step, ... mean batch B ... (sampler patches on|off)`` is one window of one
side. Windows are grouped by the nearest of ``--batches`` (on a log scale; one group without it), and within a group
those whose mean batch is below ``--min-share`` of the group's median (ramp-up, drain) are left out. Each window
on one side is paired with the next window of the other side, so slow drift of the machine cancels; the table gives
each side's median step and the median and range of the paired ratios (patched / vLLM's path).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import re
import statistics
from pathlib import Path

LINE = re.compile(
    r"kani stage0 steps: [\d.]+ steps/s, (?P<ms>[\d.]+) ms per step, \d+ rows/s, "
    r"mean batch (?P<batch>[\d.]+) over [\d.]+ s \(sampler patches (?P<side>on|off)\)"
)


def windows(text: str) -> list[tuple[float, float, bool]]:
    """``(ms per step, mean batch, patched)`` of each A/B window line, in log order."""
    return [(float(m["ms"]), float(m["batch"]), m["side"] == "on") for m in LINE.finditer(text)]


def group(rows: list[tuple[float, float, bool]], batches: list[int]) -> dict[int, list[tuple[float, float, bool]]]:
    """Windows by the nearest of ``batches`` (log scale); one group keyed 0 without batches."""
    out: dict[int, list[tuple[float, float, bool]]] = {}
    for row in rows:
        key = min(batches, key=lambda b: abs(math.log(b) - math.log(max(row[1], 1e-9)))) if batches else 0
        out.setdefault(key, []).append(row)
    return out


def summarise(rows: list[tuple[float, float, bool]], min_share: float) -> dict[str, float | int] | None:
    """One group's sides and paired ratios; None when it lacks a pair."""
    typical = statistics.median(batch for _, batch, _ in rows)
    kept = [row for row in rows if row[1] >= min_share * typical]
    ratios = []
    for first, second in itertools.pairwise(kept):
        if first[2] != second[2]:
            on, off = (first, second) if first[2] else (second, first)
            ratios.append(on[0] / off[0])
    on_ms = [ms for ms, _, patched in kept if patched]
    off_ms = [ms for ms, _, patched in kept if not patched]
    if not ratios or not on_ms or not off_ms:
        return None
    return {
        "windows_on": len(on_ms),
        "windows_off": len(off_ms),
        "mean_batch": statistics.fmean(batch for _, batch, _ in kept),
        "ms_on_median": statistics.median(on_ms),
        "ms_off_median": statistics.median(off_ms),
        "pairs": len(ratios),
        "ratio_median": statistics.median(ratios),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "pairs_patched_faster": sum(r < 1 for r in ratios),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("logs", nargs="+", type=Path)
    parser.add_argument("--batches", type=lambda s: [int(x) for x in s.split(",")], default=[])
    parser.add_argument("--min-share", type=float, default=0.9)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    results = {}
    print(
        "| log | batch | windows on / off | mean batch | ms per step on / off (median) "
        "| paired ratio on/off, median (range) | pairs on faster |"
    )
    print("|---|---|---|---|---|---|---|")
    for log in args.logs:
        for key, rows in sorted(group(windows(log.read_text(errors="replace")), args.batches).items()):
            s = summarise(rows, args.min_share)
            if s is None:
                continue
            results[f"{log.name}:{key}"] = s
            print(
                f"| {log.name} | {key or 'all'} | {s['windows_on']} / {s['windows_off']} | {s['mean_batch']:.1f} | "
                f"{s['ms_on_median']:.2f} / {s['ms_off_median']:.2f} | {s['ratio_median']:.3f} "
                f"({s['ratio_min']:.3f}–{s['ratio_max']:.3f}) | {s['pairs_patched_faster']} of {s['pairs']} |"
            )
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
