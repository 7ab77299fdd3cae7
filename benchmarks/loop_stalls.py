"""Sum a server log's event-loop stall samples (``KANI_LOOP_STALL_MS``) and garbage-collection pauses over a run.

    python3 benchmarks/loop_stalls.py SERVER_LOG[.gz] [--top 12] [--depth 3]

The API server logs, per loop-lag window, its stalls (``kani api loop stalls: N of >= T ms, S ms sampled``), the
stacks its loop thread stood in while stalled and the busy frames of its other threads
(``entrypoints/loop_stalls.py``), and each process its collections (``kani api gc`` / ``kani stage0 gc``). This adds
them up over the whole log: stacks are grouped by their ``--depth`` innermost frames, so one call's samples from
different windows add up.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from pathlib import Path

from audio_vs_frames import log_lines

_STALLS = re.compile(r"kani api loop stalls: (\d+) of >= ([\d.]+) ms, (\d+) ms sampled")
_STACK = re.compile(r"kani api loop stall, (loop thread|other thread busy), (\d+) ms: (.*)")
_GC = re.compile(r"kani (\w+) gc: (.*); paused ([\d.]+)% of ([\d.]+) s")
_GEN = re.compile(r"gen(\d) (\d+)x total ([\d.]+) ms max ([\d.]+) ms")


def _frames(stack: str, depth: int) -> str:
    """The ``depth`` innermost frames of a logged stack, names and files only."""
    return " < ".join(re.sub(r" \(.*?\)$", "", f) for f in stack.split(" < ")[-depth:])


def summarise(lines: list[str], depth: int = 3) -> dict:
    stalls = sampled = 0
    stacks: dict[str, Counter] = {"loop thread": Counter(), "other thread busy": Counter()}
    gc: dict[str, dict[int, list[float]]] = {}
    for line in lines:
        if m := _STALLS.search(line):
            stalls += int(m[1])
            sampled += int(m[3])
        elif m := _STACK.search(line):
            stacks[m[1]][_frames(m[3], depth)] += int(m[2])
        elif m := _GC.search(line):
            per = gc.setdefault(m[1], {})
            for g, count, total, top in _GEN.findall(m[2]):
                acc = per.setdefault(int(g), [0, 0.0, 0.0])
                acc[0] += int(count)
                acc[1] += float(total)
                acc[2] = max(acc[2], float(top))
    return {"stalls": stalls, "sampled_ms": sampled, "stacks": stacks, "gc": gc}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("log", type=Path)
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--depth", type=int, default=3)
    args = parser.parse_args()
    s = summarise(log_lines(args.log), args.depth)
    print(f"stalls: {s['stalls']}, {s['sampled_ms']} ms sampled on the loop thread")
    for who, counter in s["stacks"].items():
        print(f"{who} (ms sampled, {args.depth} innermost frames):")
        for stack, ms in counter.most_common(args.top):
            print(f"  {ms:7d}  {stack}")
    for process, gens in s["gc"].items():
        parts = [f"gen{g} {n}x total {t:.0f} ms max {m:.1f} ms" for g, (n, t, m) in sorted(gens.items())]
        print(f"gc, {process}: " + ", ".join(parts))


if __name__ == "__main__":
    main()
