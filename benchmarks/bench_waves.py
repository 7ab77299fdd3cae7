"""A served sweep's requests as waves: when each wave was sent, its first audio, its last audio.

    python3 benchmarks/bench_waves.py BENCH_JSON [--json OUT]

``bench --trace`` keeps each request's client times (``sent``, ``first_byte``, ``end``, one monotonic clock). A level
of C streams starts C requests at once and each stream sends its next request when the last one ends, so equal-length
requests move in waves of C: the first sent together, the next as the first end. Per level and wave (requests in
sending order, C at a time): the span of their sending, the TTFA p50 / p95, the time from first byte to end (p50),
and when the wave's first and last requests ended, all from the level's first send. A wave's time before its first
audio is time its streams deliver nothing. A request that ended without audio (no ``first_byte``: an error, or a
checkpoint that ended speech at once) keeps its place in its wave but is left out of the TTFA and first-byte
percentiles and counted as ``no audio``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np


def waves(level: dict) -> list[dict[str, float]]:
    """One row per wave of a level with a ``trace``."""
    trace = level.get("trace") or []
    if not trace:
        return []
    sent = np.array([r["sent"] for r in trace])
    first = np.array([np.nan if r["first_byte"] is None else r["first_byte"] for r in trace])
    end = np.array([r["end"] for r in trace])
    start, order, size = sent.min(), np.argsort(sent, kind="stable"), int(level["concurrency"])
    rows = []
    for w in range(0, len(trace), size):
        idx = order[w : w + size]
        audio = idx[~np.isnan(first[idx])]
        ttfa, streaming = first[audio] - sent[audio], end[audio] - first[audio]
        rows.append(
            {
                "wave": w // size,
                "requests": int(idx.size),
                "no_audio": int(idx.size - audio.size),
                "sent_from_s": round(float(sent[idx].min() - start), 3),
                "sent_to_s": round(float(sent[idx].max() - start), 3),
                "ttfa_p50_s": round(float(np.percentile(ttfa, 50)), 3),
                "ttfa_p95_s": round(float(np.percentile(ttfa, 95)), 3),
                "streaming_p50_s": round(float(np.percentile(streaming, 50)), 3),
                "ended_from_s": round(float(end[idx].min() - start), 3),
                "ended_to_s": round(float(end[idx].max() - start), 3),
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("bench_json", type=Path)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    result = json.loads(args.bench_json.read_text())
    out = []
    print("| streams | wave | sent (s) | TTFA p50 / p95 (s) | first byte → end p50 (s) | ended (s) | no audio |")
    print("|---|---|---|---|---|---|---|")
    for level in result["levels"]:
        for row in waves(level):
            out.append({"concurrency": level["concurrency"], **row})
            print(
                f"| {level['concurrency']} | {row['wave']} | {row['sent_from_s']:.2f}–{row['sent_to_s']:.2f} "
                f"| {row['ttfa_p50_s']:.2f} / {row['ttfa_p95_s']:.2f} | {row['streaming_p50_s']:.2f} "
                f"| {row['ended_from_s']:.2f}–{row['ended_to_s']:.2f} | {row['no_audio']} |"
            )
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
