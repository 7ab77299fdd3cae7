"""Where the time to first audio goes, per benchmark level, from a server log and the benchmark's JSON.

    python3 benchmarks/ttfa_breakdown.py SERVER_LOG[.gz] BENCH_JSON [--json OUT]

Each streamed request leaves, in the API server's log, vLLM-Omni's per-request stats table (each stage's
``vllm_ttft_ms``: from the request's arrival at that stage to its first output; Stage 1's
``serving_time_to_first_output_ms``) and a ``[SpeechE2E]`` line (``first_chunk_ms``: from the speech handler's start
to the first audio bytes it encodes). The benchmark's JSON holds what the client saw (``ttfa_ms_p50`` / ``p95``).
``bench`` runs its levels one after another and waits for each to finish, so the last requests of the log, in
finishing order, are the JSON's levels in order (their ``requests`` counts). p50 / p95 of each, per level.

A sweep run with ``bench --trace`` against a server on the same host also has, per request, the client's send and
first-byte times (JSON) and the server's ``[KaniTTFA]`` points (log), all on one monotonic clock. Joined by request
id they split each request's TTFA into consecutive segments (``SEGMENTS``) that add up to it exactly; where the
server noted the orchestrator's handoff (``output_handoff``), the engines' segment splits into the wait for the
engine request to be queued (vLLM-Omni queues it at the output generator's first step, once the response streams),
the engines' and orchestrator's part, the queue's and the API loop's.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from audio_vs_frames import log_lines, requests

from vllm_omni_kani.benchmarks.bench_tts import percentile

_TRACE = re.compile(r"\[KaniTTFA\] request_id=(\S+) outcome=(\S+) (.*)")
# (name, from, to): consecutive points of a request's way to its first byte; "sent", "writing" (the client starts
# writing the request to its socket) and "first_byte" are the client's.
SEGMENTS = (
    ("client send -> writing the request (the client: connection, serialization, its event loop)", "sent", "writing"),
    ("writing -> admitted (the server: accept, HTTP parsing, event loop)", "writing", "arrived"),
    ("admitted -> body received (the client's body write, transport, event loop)", "arrived", "body"),
    ("body -> speech handler (validation, FastAPI, vLLM-Omni's handler)", "body", "handler"),
    ("handler -> output generator made (prompt, vLLM-Omni's request preparation)", "handler", "submitted"),
    (
        "submitted -> queued for the orchestrator (the response's start, the output generator's first step)",
        "submitted",
        "queued",
    ),
    ("queued -> first audio put on the orchestrator's queue (both stages, the orchestrator)", "queued", "orchestrated"),
    ("orchestrated -> taken off the queue by the API loop (its poll)", "orchestrated", "dequeued"),
    ("dequeued -> first audio at the speech handler (request queue, generators)", "dequeued", "first_audio"),
    ("first audio -> first bytes to the server (encoding)", "first_audio", "first_body"),
    ("first bytes -> client's first byte (transport, client loop)", "first_body", "first_byte"),
)
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


def server_points(lines: list[str]) -> dict[str, dict[str, float]]:
    """request id -> {point: perf_counter seconds} of every ``[KaniTTFA]`` line."""
    out = {}
    for line in lines:
        if m := _TRACE.search(line):
            out[m[1]] = {k: float(v) for k, v in (item.split("=", 1) for item in m[3].split())}
    return out


# Traces of clients that did not note when they started writing the request (older results): one segment instead.
UNSPLIT = ("client send -> admitted (client, connect, HTTP parsing, event loop)", "sent", "arrived")
# Servers that did not note the orchestrator's handoff (older results): one segment from submission to first audio.
ENGINE_UNSPLIT = ("submitted -> first audio out of the engine (both stages)", "submitted", "first_audio")
# Servers that did not note when the request's body was in (sets up to the twentieth): one segment to the handler.
BODY_UNSPLIT = ("admitted -> speech handler (body, validation)", "arrived", "handler")
_BODY = slice(2, 4)  # SEGMENTS' two from admission to the handler
_HANDOFF = slice(5, 9)  # SEGMENTS' four from submission to first audio
# Servers that noted the handoff but not when the engine request was queued (eighteenth and nineteenth sets).
QUEUE_UNSPLIT = (
    "submitted -> first audio put on the orchestrator's queue (both stages, the orchestrator)",
    "submitted",
    "orchestrated",
)
_QUEUE = slice(5, 7)  # SEGMENTS' two from submission to the orchestrator's put


def segments(traces: list[dict], points: dict[str, dict[str, float]]) -> tuple[dict[str, list[float]], int]:
    """Milliseconds of each of ``SEGMENTS`` over the client traces the server logged in full, and how many those are
    (segments no trace had are left out)."""
    order = (
        UNSPLIT,
        *SEGMENTS[: _BODY.start],
        BODY_UNSPLIT,
        *SEGMENTS[_BODY.start : _HANDOFF.start],
        ENGINE_UNSPLIT,
        QUEUE_UNSPLIT,
        *SEGMENTS[_HANDOFF.start :],
    )
    out: dict[str, list[float]] = {name: [] for name, _, _ in order}
    joined = 0
    for trace in traces:
        stamps = {**points.get(trace["id"], {}), **{k: trace.get(k) for k in ("sent", "writing", "first_byte")}}
        chain = list(SEGMENTS)
        if stamps.get("orchestrated") is None or stamps.get("dequeued") is None:
            chain[_HANDOFF] = [ENGINE_UNSPLIT]
        elif stamps.get("queued") is None:
            chain[_QUEUE] = [QUEUE_UNSPLIT]
        if stamps.get("body") is None:
            chain[_BODY] = [BODY_UNSPLIT]
        if stamps["writing"] is None:
            chain[:2] = [UNSPLIT]
        if any(stamps.get(point) is None for _, a, b in chain for point in (a, b)):
            continue
        joined += 1
        for name, a, b in chain:
            out[name].append((stamps[b] - stamps[a]) * 1000.0)
    return {name: values for name, values in out.items() if values}, joined


# The two waves of a level, as ``waves`` returns them.
WAVES = ("first wave", "later waves")


def waves(traces: list[dict], concurrency: int) -> tuple[list[dict], list[dict]]:
    """A level's first wave (its first ``concurrency`` requests by send time, sent at once) and the rest (each sent
    as an earlier one ended, into a loaded server)."""
    ordered = sorted(traces, key=lambda t: t["sent"])
    return ordered[:concurrency], ordered[concurrency:]


def wave_segments(
    traces: list[dict], points: dict[str, dict[str, float]], concurrency: int
) -> list[tuple[dict[str, list[float]], int]]:
    """``segments`` of each of a level's ``waves``, in that order."""
    return [segments(wave, points) for wave in waves(traces, concurrency)]


def _print_segments(split: dict[str, list[float]], indent: str = "  ") -> None:
    for name, values in split.items():
        value = _pcts(values)
        print(f"{indent}{name:<66} p50 {value.get('p50', '-'):>8}  p95 {value.get('p95', '-'):>8}")


def client_collections(level: dict) -> str | None:
    """The bench client's own garbage collections over a level (its row's ``client_gc``, absent in older results): a
    full one stops every stream's timing at once, so it belongs beside the segments it may have lengthened."""
    rows = level.get("client_gc")
    if not rows:
        return None
    full = rows[-1]
    total = sum(row["total_ms"] for row in rows)
    return (
        f"the client's collections over the level: {full['count']} full, longest {full['max_ms']:.1f} ms; "
        f"{total:.1f} ms in all"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("log", type=Path)
    parser.add_argument("bench", type=Path)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument(
        "--waves",
        action="store_true",
        help="only the traced segments, per level's first wave and the rest (joined by request id, so a level cut "
        "short still splits)",
    )
    args = parser.parse_args()
    if args.waves:
        points = server_points(log_lines(args.log))
        for level in json.loads(args.bench.read_text())["levels"]:
            for wave, (split, joined) in zip(
                WAVES,
                wave_segments(level.get("trace") or [], points, level["concurrency"]),
                strict=True,
            ):
                print(f"c={level['concurrency']} {wave} ({joined} traced requests)")
                _print_segments(split)
            if (line := client_collections(level)) is not None:
                print(f"c={level['concurrency']} {line}")
        return
    stats = list(requests(args.log).values())
    lines = log_lines(args.log)
    first_chunks = [float(m[2]) for line in lines if (m := _E2E.search(line))]
    points = server_points(lines)
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
        if (line := client_collections(level)) is not None:
            out[-1]["client"] = line
        if level.get("trace"):
            split, joined = segments(level["trace"], points)
            out[-1]["traced requests joined"] = joined
            out[-1].update({name: _pcts(values) for name, values in split.items()})
    out.reverse()
    for row in out:
        joined = row.get("traced requests joined")
        print(f"c={row['concurrency']} ({row['requests']} requests{'' if joined is None else f', {joined} traced'})")
        for key, value in row.items():
            if isinstance(value, dict):
                print(f"  {key:<66} p50 {value.get('p50', '-'):>8}  p95 {value.get('p95', '-'):>8}")
        if "client" in row:
            print(f"  {row['client']}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
