"""Where a benchmark level's stream time goes: waiting for the first audio, receiving the rest, or idle.

    python3 benchmarks/stream_time.py BENCH_JSON [BENCH_JSON ...] [--json OUT]

``bench`` runs a level as ``concurrency`` closed-loop streams: each sends a request, reads its answer to the end and
sends the next, until the level's requests are gone. Its frames/s is the level's frames over its wall time, so it
falls with every second a stream spends without a request in flight (the last requests' drain, once no request is left
to send) and with every second a request spends before its first audio, when it moves no audio to the client. From a
sweep run with ``bench --trace`` (each request's client times), per level:

- ``busy``: the requests' time in flight (sent to end), as a share of ``concurrency`` x the level's wall time;
- ``before first audio``: the part of that time before each request's first byte (its TTFA), and ``after``, from the
  first byte to the end (Stage 0's decoding of the rest, the codec, the transport);
- ``drain (s)``: from the level's last send to its end, when streams fall idle one by one;
- ``frames/s if always busy``: the level's frames/s over ``busy``, what the same requests would move with no idle
  stream (an upper bound for more requests per stream, not a measurement).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def stream_time(level: dict) -> dict[str, float | int]:
    """The level's row (module docstring) from its ``trace``; ``{}`` when it has none (or no time passed)."""
    traces = [t for t in level.get("trace") or () if t.get("first_byte") is not None and t.get("end") is not None]
    if not traces:
        return {}
    start = min(t["sent"] for t in traces)
    end = max(t["end"] for t in traces)
    wall = end - start
    in_flight = sum(t["end"] - t["sent"] for t in traces)
    if wall <= 0 or in_flight <= 0:
        return {}
    before = sum(t["first_byte"] - t["sent"] for t in traces)
    busy = in_flight / (level["concurrency"] * wall)
    return {
        "concurrency": level["concurrency"],
        "requests": len(traces),
        "wall (s)": round(wall, 3),
        "busy": round(busy, 3),
        "before first audio": round(before / in_flight, 3),
        "after first audio": round(1.0 - before / in_flight, 3),
        "drain (s)": round(end - max(t["sent"] for t in traces), 3),
        "frames/s": round(level["frames_per_s"]),
        "frames/s if always busy": round(level["frames_per_s"] / busy),
    }


def bench_levels(description: str) -> tuple[argparse.Namespace, list[tuple[Path, dict]]]:
    """The command line ``BENCH_JSON [BENCH_JSON ...] [--json OUT]`` of a script described by ``description``: its
    arguments and every level of every file, with the file's path."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("bench", type=Path, nargs="+")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    return args, [(path, level) for path in args.bench for level in json.loads(path.read_text())["levels"]]


def main() -> None:
    args, levels = bench_levels(__doc__)
    report = []
    for path, level in levels:
        row = stream_time(level)
        if row:
            report.append({"file": path.name, **row})
            print(f"{path.name} " + ", ".join(f"{k} {v}" for k, v in row.items()))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
