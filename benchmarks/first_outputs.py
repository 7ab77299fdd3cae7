"""Where the engines' part of each traced request's first audio goes, per benchmark level and wave.

    python3 benchmarks/first_outputs.py SERVER_LOG[.gz] BENCH_JSON [--json OUT]

A server started with ``KANI_TRACE_FIRST_OUTPUTS=1`` logs, from each stage's scheduler, one ``[KaniFirstOutput]``
line per request (``core/sched/first_outputs.py``); a ``bench --trace`` sweep leaves the API server's ``[KaniTTFA]``
points. All are ``time.perf_counter()`` of one host. Joined by request id (the engine request is
``speech-<X-Request-Id>-<8 hex>``), they split ``ttfa_breakdown.py``'s "queued -> first audio put on the orchestrator's
queue" into consecutive segments (``SEGMENTS``) that add up to it. Each level's first wave (its first ``concurrency``
requests by send time, sent at once) and its later waves (sent into a loaded server) are reported apart. The
server's ``read`` point (the orchestrator's read of the codec's message ended, ``engine/replica_outputs.py``) and the
codec engine's ``[KaniFirstSent]`` line (its output thread took the message, and sent it:
``engine/output_thread_trace.py``) split the way from the codec's first audio to the orchestrator's put; a server
without the output thread's line (sets up to the fifty-second) gives the way to the read whole (``UNSENT``), one
without the read (up to the fifty-first) the way to the put (``UNREAD``).
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from audio_vs_frames import log_lines
from ttfa_breakdown import WAVES, _pcts, server_points, waves

_LINE = re.compile(r"\[(KaniFirstOutput|KaniFirstSent)\] stage=(\d+) request_id=(\S+) (.*)")
_ENGINE_ID = re.compile(r"speech-(.+)-[0-9a-f]{8}")
# (name, from, to): "s0_added" is Stage 0's scheduler's "added", and so on; "queued" and "orchestrated" are the API
# server's points.
SEGMENTS = (
    ("queued -> Stage 0 has it (the orchestrator, the transport, the engine core's input)", "queued", "s0_added"),
    ("Stage 0: added -> first scheduled (the step under way)", "s0_added", "s0_scheduled"),
    ("Stage 0: scheduled -> first output out (its first step)", "s0_scheduled", "s0_output"),
    (
        "Stage 0's first output -> the codec schedules the first chunk (the chunk's frames, connector, codec queue)",
        "s0_output",
        "s1_scheduled",
    ),
    ("codec: first chunk scheduled -> first audio out (its step)", "s1_scheduled", "s1_output"),
    (
        "codec's first audio -> its output thread takes the message (the engine's output queue, that thread's GIL)",
        "s1_output",
        "s1_taken",
    ),
    ("taken -> sent (encoding the step's outputs, the socket's send)", "s1_taken", "s1_sent"),
    (
        "sent -> the orchestrator has read it (the socket, the read and decoding on the orchestrator's loop)",
        "s1_sent",
        "read",
    ),
    (
        "read -> put on the orchestrator's queue (its pass over the stages' messages, processing)",
        "read",
        "orchestrated",
    ),
)
# Servers that did not note the output thread (sets up to the fifty-second): the codec's first audio to the read.
UNSENT = (
    "codec's first audio -> the orchestrator has read it (the codec's output thread, transport, decoding)",
    "s1_output",
    "read",
)
# Servers that did not note the orchestrator's read either (sets up to the fifty-first): to the put in one.
UNREAD = (
    "codec's first audio -> put on the orchestrator's queue (transport, orchestrator)",
    "s1_output",
    "orchestrated",
)
# The chains of a trace with every point, without the output thread's, and without the read as well.
_CHAINS = (SEGMENTS, (*SEGMENTS[:-4], UNSENT, SEGMENTS[-1]), (*SEGMENTS[:-4], UNREAD))


def first_output_points(lines: list[str]) -> dict[str, dict[str, float]]:
    """X-Request-Id -> {"s0_added": t, ..., "s1_output": t, "s0_arrival_lag_ms": ms, ...} of every traced line."""
    out: dict[str, dict[str, float]] = {}
    for line in lines:
        m = _LINE.search(line)
        if not m:
            continue
        engine_id = _ENGINE_ID.fullmatch(m[3])
        key = engine_id[1] if engine_id else m[3]
        fields = dict(item.split("=", 1) for item in m[4].split())
        point = out.setdefault(key, {})
        for name in ("added", "scheduled", "output", "arrival_lag_ms", "taken", "sent"):
            if name in fields:
                point[f"s{m[2]}_{name}"] = float(fields[name])
    return out


def engine_segments(traces: list[dict], ttfa: dict[str, dict[str, float]], stages: dict[str, dict[str, float]]):
    """Milliseconds of each of ``SEGMENTS`` over the traces with every point, and how many those are; a trace without
    the output thread's points gives ``UNSENT`` for its three segments, one without the ``read`` point as well
    ``UNREAD`` for four. Segments no trace had are left out."""
    out: dict[str, list[float]] = {name: [] for name, _, _ in (*SEGMENTS[:-1], UNSENT, UNREAD, SEGMENTS[-1])}
    joined = 0
    for trace in traces:
        stamps = {**ttfa.get(trace["id"], {}), **stages.get(trace["id"], {})}
        chain = next(
            (c for c in _CHAINS if all(stamps.get(p) is not None for _, a, b in c for p in (a, b))),
            None,
        )
        if chain is None:
            continue
        joined += 1
        for name, a, b in chain:
            out[name].append((stamps[b] - stamps[a]) * 1000.0)
    return {name: values for name, values in out.items() if values}, joined


def traced_run(description: str) -> tuple[argparse.Namespace, dict, dict, list[dict]]:
    """The command line ``SERVER_LOG BENCH_JSON [--json OUT]`` of a script described by ``description``: its
    arguments, the API server's ``[KaniTTFA]`` points, the schedulers' first-output points and the benchmark's
    levels."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("log", type=Path)
    parser.add_argument("bench", type=Path)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    lines = log_lines(args.log)
    return args, server_points(lines), first_output_points(lines), json.loads(args.bench.read_text())["levels"]


def main() -> None:
    args, ttfa, stages, levels = traced_run(__doc__)
    report = []
    for level in levels:
        concurrency = level["concurrency"]
        for wave, traces in zip(WAVES, waves(level.get("trace") or [], concurrency), strict=True):
            split, joined = engine_segments(traces, ttfa, stages)
            row = {"concurrency": concurrency, "wave": wave, "joined": joined}
            row.update({name: _pcts(values) for name, values in split.items() if values})
            report.append(row)
            print(f"c={concurrency} {wave} ({joined} requests with every point)")
            for name in split:
                value = row[name]
                print(f"  {name:<104} p50 {value.get('p50', '-'):>8}  p95 {value.get('p95', '-'):>8}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
