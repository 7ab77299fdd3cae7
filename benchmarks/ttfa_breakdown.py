"""Where the time to first audio goes, per benchmark level, from a server log and the benchmark's JSON.

    python3 benchmarks/ttfa_breakdown.py SERVER_LOG[.gz] BENCH_JSON [--json OUT]

Each streamed request leaves, in the API server's log, vLLM-Omni's per-request stats table (each stage's
``vllm_ttft_ms``: from the request's arrival at that stage to its first output; Stage 1's
``serving_time_to_first_output_ms``) and a ``[SpeechE2E]`` line (``first_chunk_ms``: from the speech handler's start
to the first audio bytes it encodes). The benchmark's JSON holds what the client saw (``ttfa_ms_p50`` / ``p95``).
``bench`` runs its levels one after another and waits for each to finish, so the last requests of the log, in
finishing order, are the JSON's levels in order (their ``requests`` counts). p50 / p95 of each, per level.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from audio_vs_frames import log_lines, requests

from vllm_omni_kani.benchmarks.bench_tts import percentile

_E2E = re.compile(r"\[SpeechE2E\] request_id=(\S+) stream=true status=ok .* first_chunk_ms=([\d.]+)")


def _ms(text: str) -> float | None:
    text = text.split("(")[0].replace(",", "").strip()
    return float(text) if text else None


def _pcts(values: list[float]) -> dict[str, float]:
    """p50 / p95 as ``bench`` computes its own (interpolated), in ms to 0.1."""
    return {f"p{q}": round(percentile(values, q), 1) for q in (50, 95)} if values else {}


def _column(rows: list[dict[str, tuple[str, str]]], field: str, stage: int) -> list[float]:
    """One stage's value of ``field`` over the requests whose table has it."""
    return [v for r in rows if field in r and (v := _ms(r[field][stage])) is not None]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("log", type=Path)
    parser.add_argument("bench", type=Path)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    stats = list(requests(args.log).values())
    first_chunks = [float(m[2]) for line in log_lines(args.log) if (m := _E2E.search(line))]
    levels = json.loads(args.bench.read_text())["levels"]
    out = []
    end_stats, end_chunks = len(stats), len(first_chunks)
    for level in reversed(levels):
        n = level["requests"]
        rows = stats[end_stats - n : end_stats]
        end_stats -= n
        chunk_ms = first_chunks[max(0, end_chunks - n) : end_chunks]
        end_chunks -= n
        out.append(
            {
                "concurrency": level["concurrency"],
                "requests": n,
                "stage 0 first token (vllm_ttft_ms)": _pcts(_column(rows, "vllm_ttft_ms", 0)),
                "stage 1 first audio (vllm_ttft_ms)": _pcts(_column(rows, "vllm_ttft_ms", 1)),
                "stage 1 first output, serving (serving_time_to_first_output_ms)": _pcts(
                    _column(rows, "serving_time_to_first_output_ms", 1)
                ),
                "API first chunk (first_chunk_ms)": _pcts(chunk_ms),
                "client TTFA": {"p50": round(level["ttfa_ms_p50"], 1), "p95": round(level["ttfa_ms_p95"], 1)},
            }
        )
    out.reverse()
    for row in out:
        print(f"c={row['concurrency']} ({row['requests']} requests)")
        for key, value in row.items():
            if isinstance(value, dict):
                print(f"  {key:<66} p50 {value.get('p50', '-'):>8}  p95 {value.get('p95', '-'):>8}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
