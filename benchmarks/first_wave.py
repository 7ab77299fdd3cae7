"""How a level's first wave gets into the server: one row per level from a traced sweep's points.

    python3 benchmarks/first_wave.py SERVER_LOG[.gz] BENCH_JSON [--json OUT]

A level's first ``concurrency`` requests are sent at once (``ttfa_breakdown.waves``). The API server's event loop
takes them in one after another, and vLLM-Omni's orchestrator thread hands each to the engines under the same GIL,
so the wave's first audio is a queue in that process before it is a queue in the engines. From the API server's
``[KaniTTFA]`` points and the schedulers' ``[KaniFirstOutput]`` lines (``ttfa_breakdown.py``, ``first_outputs.py``),
all in ms from the wave's first send: when the first and the last request reached the speech handler (and the mean
spacing, the loop's ms a request), how long each waited from being queued for the orchestrator to Stage 0's scheduler
having it, when Stage 0 admitted its first and its last request, and the wave's TTFA.
"""

from __future__ import annotations

import json

from first_outputs import traced_run
from ttfa_breakdown import _pcts, waves


def wave_entry(
    traces: list[dict], ttfa: dict[str, dict[str, float]], stages: dict[str, dict[str, float]], concurrency: int
) -> dict:
    """The first wave's row (see the module docstring) over its requests with every point; ``requests`` counts them."""
    first, _ = waves(traces, concurrency)
    joined = [
        (t, ttfa[t["id"]], stages[t["id"]]) for t in first if t["id"] in ttfa and "s0_added" in stages.get(t["id"], {})
    ]
    if not joined:
        return {"requests": 0}
    start = min(t["sent"] for t in first)

    def ms(value: float) -> float:
        return round((value - start) * 1000.0, 1)

    handler = sorted(p["handler"] for _, p, _ in joined)
    admitted = sorted(s["s0_added"] for _, _, s in joined)
    return {
        "requests": len(joined),
        "first at the handler (ms)": ms(handler[0]),
        "last at the handler (ms)": ms(handler[-1]),
        "handler ms a request": round((handler[-1] - handler[0]) * 1000.0 / max(1, len(handler) - 1), 2),
        "queued -> Stage 0 has it (ms)": _pcts([(s["s0_added"] - p["queued"]) * 1000.0 for _, p, s in joined]),
        "first Stage-0 admission (ms)": ms(admitted[0]),
        "last Stage-0 admission (ms)": ms(admitted[-1]),
        "TTFA (ms)": _pcts([(t["first_byte"] - t["sent"]) * 1000.0 for t, _, _ in joined]),
    }


def main() -> None:
    args, ttfa, stages, levels = traced_run(__doc__)
    report = []
    for level in levels:
        row = {
            "concurrency": level["concurrency"],
            **wave_entry(level.get("trace") or [], ttfa, stages, level["concurrency"]),
        }
        report.append(row)
        print(f"c={row['concurrency']} first wave ({row['requests']} requests with every point)")
        for key, value in row.items():
            if key not in ("concurrency", "requests"):
                shown = f"p50 {value['p50']:>8}  p95 {value['p95']:>8}" if isinstance(value, dict) else f"{value:>8}"
                print(f"  {key:<36} {shown}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
