"""Where streamed playback ran dry, per benchmark level and wave.

    python3 benchmarks/stalls.py BENCH_JSON [BENCH_JSON ...] [--json OUT]

``bench`` plays each answer from its first byte as a listener's player would (``vllm_omni_kani/benchmarks/
playback.py``); a sweep run with ``bench --trace`` keeps, per request, how long its player stood (``stall_s``), in
how many gaps, and how much audio it had received when the first gap began (``first_stall_at_s``). Per level and wave
(``ttfa_breakdown.waves``: the first ``concurrency`` requests by send time, then the rest), this gives the share of
requests that stalled, their stall p50 / p95 / mean, and where the first gaps began in frames of audio (3: a first
chunk of 3 frames ran dry, 11: the second chunk of 8 after it); results from before ``first_stall_at_s`` (sets up to
the fifty-second) give the rest.
"""

from __future__ import annotations

import json
from collections import Counter

from stream_time import bench_levels
from ttfa_breakdown import WAVES, _pcts, waves

from vllm_omni_kani.benchmarks.bench_tts import SAMPLES_PER_FRAME
from vllm_omni_kani.model_executor.models.kani_tts.configuration import SAMPLE_RATE


def stall_row(traces: list[dict]) -> dict:
    """The stalls of ``traces`` (module docstring); ``{"requests": 0}`` for none with a first byte."""
    played = [t for t in traces if t.get("first_byte") is not None and "stall_s" in t]
    if not played:
        return {"requests": 0}
    stalls = [t["stall_s"] * 1000.0 for t in played]
    first_at = Counter(
        round(t["first_stall_at_s"] * SAMPLE_RATE / SAMPLES_PER_FRAME)
        for t in played
        if t.get("first_stall_at_s") is not None
    )
    return {
        "requests": len(played),
        "stalled": round(sum(t["stalls"] > 0 for t in played) / len(played), 3),
        "stall (ms)": _pcts(stalls),
        "mean stall (ms)": round(sum(stalls) / len(stalls), 1),
        "first gap after frame": dict(sorted(first_at.items())),
    }


def main() -> None:
    args, levels = bench_levels(__doc__)
    report = []
    for path, level in levels:
        for wave, traces in zip(WAVES, waves(level.get("trace") or [], level["concurrency"]), strict=True):
            row = {"bench": path.name, "concurrency": level["concurrency"], "wave": wave, **stall_row(traces)}
            report.append(row)
            print(json.dumps(row))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
