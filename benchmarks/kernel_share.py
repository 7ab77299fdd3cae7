"""Where the served GPU time goes, per engine process, from the traces ``KANI_KERNEL_TRACE`` writes.

    python3 benchmarks/kernel_share.py DIR [--cat kernel] [--top 12] [--json OUT]

Each ``DIR/LABEL-PID.json`` is one engine's Chrome trace of the same wall-clock window (``kernel_trace.py``). Per
trace: its window, the summed duration of its GPU events (``--cat``: kernels, memcpy and memset; ``cpu_op`` reads
CPU traces), that sum as a share of the window, and its heaviest event names. Across traces: the union of all events'
intervals on the shared clock (how long at least one process had work on the GPU) against their sum (more than the
union means the processes' kernels overlapped, as under MPS).
"""

from __future__ import annotations

import argparse
import collections
import json
from pathlib import Path

GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")


def read_events(path: Path, categories: tuple[str, ...]) -> list[tuple[str, float, float]]:
    """(name, start µs, duration µs) of a trace's complete events in ``categories``, on the host's clock."""
    trace = json.loads(path.read_text())
    base_us = float(trace.get("baseTimeNanoseconds", 0)) / 1000.0
    return [
        (event.get("name", "?"), base_us + float(event["ts"]), float(event.get("dur", 0.0)))
        for event in trace.get("traceEvents", [])
        if event.get("ph") == "X" and event.get("cat") in categories and "ts" in event
    ]


def union_us(intervals: list[tuple[float, float]]) -> float:
    """Total length of the union of ``(start, duration)`` intervals."""
    total, end = 0.0, float("-inf")
    for start, duration in sorted(intervals):
        stop = start + duration
        if stop <= end:
            continue
        total += stop - max(start, end)
        end = stop
    return total


def summarise(folder: Path, categories: tuple[str, ...], top: int = 12) -> dict[str, object]:
    per_trace, everything = [], []
    for path in sorted(folder.glob("*.json")):
        events = read_events(path, categories)
        if not events:
            per_trace.append({"trace": path.name, "events": 0})
            continue
        window = max(s + d for _, s, d in events) - min(s for _, s, _ in events)
        busy = sum(d for _, _, d in events)
        names: collections.Counter[str] = collections.Counter()
        counts: collections.Counter[str] = collections.Counter()
        for name, _, duration in events:
            names[name] += duration
            counts[name] += 1
        per_trace.append(
            {
                "trace": path.name,
                "events": len(events),
                "window_ms": round(window / 1000.0, 3),
                "busy_ms": round(busy / 1000.0, 3),
                "busy_share": round(busy / window, 4) if window else 0.0,
                "union_ms": round(union_us([(s, d) for _, s, d in events]) / 1000.0, 3),
                "top": [
                    {"name": name, "ms": round(us / 1000.0, 3), "count": counts[name]}
                    for name, us in names.most_common(top)
                ],
            }
        )
        everything += [(s, d) for _, s, d in events]
    result: dict[str, object] = {"categories": list(categories), "traces": per_trace}
    if everything:
        window = max(s + d for s, d in everything) - min(s for s, _ in everything)
        result["all"] = {
            "window_ms": round(window / 1000.0, 3),
            "sum_ms": round(sum(d for _, d in everything) / 1000.0, 3),
            "union_ms": round(union_us(everything) / 1000.0, 3),
        }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path)
    parser.add_argument("--cat", default=",".join(GPU_CATEGORIES), help="comma-separated event categories")
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    result = summarise(args.folder, tuple(c.strip() for c in args.cat.split(",") if c.strip()), args.top)
    print("| trace | window ms | busy ms | share | events |\n|---|---|---|---|---|")
    for row in result["traces"]:
        if row["events"]:
            print(
                f"| {row['trace']} | {row['window_ms']:.1f} | {row['busy_ms']:.1f} | {100 * row['busy_share']:.1f}% "
                f"| {row['events']} |"
            )
    if "all" in result:
        every = result["all"]
        print(
            f"all traces: window {every['window_ms']:.1f} ms, sum {every['sum_ms']:.1f} ms, "
            f"union {every['union_ms']:.1f} ms"
        )
    for row in result["traces"]:
        for entry in row.get("top", []):
            print(f"{row['trace']}: {entry['ms']:9.3f} ms {entry['count']:7d}x {entry['name'][:110]}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
