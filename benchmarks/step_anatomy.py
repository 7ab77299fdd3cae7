"""Where a Stage-0 step's time goes, by kind of step, from one engine's host trace (``KANI_KERNEL_TRACE_HOST``).

    python3 benchmarks/step_anatomy.py TRACE.json[.gz] [--top 30] [--json OUT] [--slim OUT.json.gz --keep 2]

Served at 64 streams a step that admits prompts took ~36 ms against ~13 for a decode step (docs/BENCHMARKS.md,
fifty-eighth set), and a wave of new requests meets nothing but such steps before its first frames. The trace is one
Stage-0 engine's torch-profiler window with the host recorded (``ops``: torch's ops and the ``record_function``
ranges, vLLM's with ``VLLM_CUSTOM_SCOPES_FOR_PROFILING=1``; ``python``: every Python call as well). A step runs from
one ``gpu_model_runner: preprocess`` range of the engine's main thread to the next. Its kind: ``prefill`` when the
runner's input batch added a request in it, ``finished`` when it removed one, else ``decode`` (without Python calls in
the trace: by its CUDA-graph launches, one for a full graph, several for a piecewise one). Per kind: how many, the
mean wall time, the mean time in each of vLLM's ranges and in each Python function (inclusive, the union of its
calls so recursion counts once), the host's waits on the GPU and the GPU's busy time; then the functions whose mean
exceeds the decode step's the most: where a prefill step's extra time goes; and each host read of a tensor
(``item``, ``tolist``, ``cpu``, ``nonzero``, ``torch.cuda.synchronize``) and CUDA wait with the Python calls around
it, calls and ms a step: a step that waits for the GPU loses async scheduling's overlap. ``--slim`` keeps the
events of a few steps of each kind (those nearest their kind's median), small enough to open in Perfetto.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import itertools
import json
import re
import statistics
from pathlib import Path
from typing import Any

STEP_RANGE = "gpu_model_runner: preprocess"
HOST_CATEGORIES = ("cpu_op", "user_annotation", "python_function", "cuda_runtime", "cuda_driver")
GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
ADD_MARK = "add_request"  # InputBatch.add_request: a request joined the batch in this step
REMOVE_MARK = "remove_request"  # InputBatch.remove_request: one left
GRAPH_LAUNCH = "cudaGraphLaunch"
# Host calls that block until the GPU has caught up, by exact name: ``cudaMemcpyAsync`` (every ``copy_`` and
# ``to``, most of them device to device or from pinned memory) returns at once, and a blocking copy's wait is its
# ``cudaStreamSynchronize``; a prefix match counted the async copies as waits (sixtieth set).
WAITS = frozenset({"cudaStreamSynchronize", "cudaEventSynchronize", "cudaDeviceSynchronize", "cudaMemcpy"})
# Python calls that read a tensor's values on the host: on a device tensor each waits for the GPU to reach it (on a
# host tensor it costs nothing; the caller says which).
HOST_READ = re.compile(r"<built-in (method (item|tolist|cpu|nonzero) of Tensor object|function _cuda_synchronize)")
_ADDRESS = re.compile(r" at 0x[0-9a-f]+")


def load(path: Path) -> dict[str, Any]:
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    return json.loads(raw)


def union_us(intervals: list[tuple[float, float]]) -> float:
    """Total length of the union of ``(start, end)`` intervals."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end <= reach:
            continue
        total += end - max(start, reach)
        reach = end
    return total


def complete_events(trace: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "ts" in e]


def main_thread(events: list[dict[str, Any]]) -> tuple[Any, Any] | None:
    """(pid, tid) of the thread that runs the model's steps: the one with the most step ranges."""
    counts = collections.Counter(
        (e.get("pid"), e.get("tid")) for e in events if e.get("cat") == "user_annotation" and e["name"] == STEP_RANGE
    )
    return counts.most_common(1)[0][0] if counts else None


def step_bounds(events: list[dict[str, Any]], thread: tuple[Any, Any]) -> list[tuple[float, float]]:
    starts = sorted(
        float(e["ts"])
        for e in events
        if e.get("cat") == "user_annotation" and e["name"] == STEP_RANGE and (e.get("pid"), e.get("tid")) == thread
    )
    return list(itertools.pairwise(starts))


def short_name(name: str) -> str:
    """``.../vllm/v1/worker/gpu_model_runner.py(123): _update_states`` -> ``vllm/v1/worker/gpu_model_runner.py:
    _update_states`` (the line numbers of a function's own definition say nothing a reader needs here)."""
    if "): " not in name:
        return name
    where, func = name.rsplit("): ", 1)
    where = where.rsplit("(", 1)[0]
    for root in ("site-packages/", "/work/", "/tmp/site/"):
        if root in where:
            where = where.split(root, 1)[1]
    return f"{where}: {func}"


def callers(events: list[dict[str, Any]], thread: tuple[Any, Any], targets: list[dict[str, Any]]) -> dict[int, str]:
    """``id(event)`` -> ``"caller > call"`` for each target event on ``thread``: the two innermost Python calls that
    enclose it (a host read's own call is the innermost; a CUDA wait's is the call that waited)."""
    frames = sorted(
        (e for e in events if e.get("cat") == "python_function" and (e.get("pid"), e.get("tid")) == thread),
        key=lambda e: (float(e["ts"]), -float(e.get("dur", 0.0))),
    )
    out: dict[int, str] = {}
    stack: list[dict[str, Any]] = []
    index = 0

    def end(e: dict[str, Any]) -> float:
        return float(e["ts"]) + float(e.get("dur", 0.0))

    for target in sorted(targets, key=lambda e: float(e["ts"])):
        ts = float(target["ts"])
        while index < len(frames) and float(frames[index]["ts"]) <= ts:
            frame = frames[index]
            index += 1
            while stack and end(stack[-1]) <= float(frame["ts"]):
                stack.pop()
            stack.append(frame)
        while stack and end(stack[-1]) <= ts:
            stack.pop()
        names = [_ADDRESS.sub("", short_name(f["name"])) for f in stack if f is not target][-2:]
        if target.get("cat") == "python_function":
            names = [*names[-1:], _ADDRESS.sub("", short_name(target["name"]))]
        out[id(target)] = " > ".join(names) if names else "?"
    return out


def anatomy(trace: dict[str, Any], top: int = 30) -> dict[str, Any]:
    events = complete_events(trace)
    thread = main_thread(events)
    if thread is None:
        raise SystemExit(f"no '{STEP_RANGE}' ranges: record with VLLM_CUSTOM_SCOPES_FOR_PROFILING=1 and a host mode")
    on_thread = [e for e in events if (e.get("pid"), e.get("tid")) == thread]
    reads = [
        e
        for e in on_thread
        if (e.get("cat") == "python_function" and HOST_READ.search(e.get("name", "")))
        or (e.get("cat") == "cuda_runtime" and e.get("name", "") in WAITS)
    ]
    read_callers = callers(events, thread, reads)
    bounds = step_bounds(events, thread)
    if not bounds:
        raise SystemExit("fewer than two steps in the window")
    starts = [b[0] for b in bounds]
    has_python = any(e.get("cat") == "python_function" for e in events)

    def step_of(ts: float) -> int | None:
        lo, hi = 0, len(starts)
        while lo < hi:
            mid = (lo + hi) // 2
            if starts[mid] <= ts:
                lo = mid + 1
            else:
                hi = mid
        index = lo - 1
        return index if index >= 0 and ts < bounds[index][1] else None

    per_step: list[dict[str, Any]] = [
        {
            "wall_us": end - start,
            "ranges": collections.defaultdict(list),
            "functions": collections.defaultdict(list),
            "threads": collections.defaultdict(list),
            "waits": [],
            "reads": collections.defaultdict(list),
            "gpu": [],
            "graph_launches": 0,
            "added": 0,
            "removed": 0,
        }
        for start, end in bounds
    ]
    for e in events:
        ts, dur = float(e["ts"]), float(e.get("dur", 0.0))
        index = step_of(ts)
        if index is None:
            continue
        step, cat, name = per_step[index], e.get("cat"), e.get("name", "?")
        end = min(ts + dur, bounds[index][1])
        if cat in GPU_CATEGORIES:
            step["gpu"].append((ts, end))
            continue
        on_main = (e.get("pid"), e.get("tid")) == thread
        if id(e) in read_callers:
            kind = "wait" if cat == "cuda_runtime" else "read"
            step["reads"][f"{kind}: {read_callers[id(e)]}"].append(end - ts)
        if cat == "user_annotation" and on_main:
            step["ranges"][name].append((ts, end))
        elif cat == "python_function":
            step["threads"][e.get("tid")].append((ts, end))
            if on_main:
                step["functions"][short_name(name)].append((ts, end))
                if name.endswith(ADD_MARK) and "input_batch" in name:
                    step["added"] += 1
                elif name.endswith(REMOVE_MARK) and "input_batch" in name:
                    step["removed"] += 1
        elif cat == "cuda_runtime" and on_main:
            if name == GRAPH_LAUNCH:
                step["graph_launches"] += 1
            if name in WAITS:
                step["waits"].append((ts, end))

    kinds: dict[str, list[int]] = collections.defaultdict(list)
    for index, step in enumerate(per_step):
        if has_python:
            kind = "prefill" if step["added"] else "finished" if step["removed"] else "decode"
        else:
            launches = step["graph_launches"]
            kind = "eager" if not launches else "full graph" if launches == 1 else "piecewise"
        step["kind"] = kind
        kinds[kind].append(index)

    def mean_ms(indices: list[int], value) -> float:
        return round(sum(value(per_step[i]) for i in indices) / len(indices) / 1000.0, 3) if indices else 0.0

    summary: dict[str, Any] = {"steps": len(per_step), "python_calls": has_python, "kinds": {}}
    for kind, indices in sorted(kinds.items()):
        names = {n for i in indices for n in per_step[i]["ranges"]}
        functions = {n for i in indices for n in per_step[i]["functions"]}
        summary["kinds"][kind] = {
            "steps": len(indices),
            "wall_ms": mean_ms(indices, lambda s: s["wall_us"]),
            "wall_p50_ms": round(statistics.median(per_step[i]["wall_us"] for i in indices) / 1000.0, 3),
            "gpu_busy_ms": mean_ms(indices, lambda s: union_us(s["gpu"])),
            "host_waits_ms": mean_ms(indices, lambda s: union_us(s["waits"])),
            "main_python_ms": mean_ms(indices, lambda s: union_us([iv for f in s["functions"].values() for iv in f])),
            "other_threads_python_ms": mean_ms(
                indices,
                lambda s: sum(union_us(iv) for tid, iv in s["threads"].items() if tid != thread[1]),
            ),
            "added_per_step": round(sum(per_step[i]["added"] for i in indices) / len(indices), 2),
            "ranges_ms": {n: mean_ms(indices, lambda s, n=n: union_us(s["ranges"].get(n, []))) for n in sorted(names)},
            "functions_ms": {
                n: mean_ms(indices, lambda s, n=n: union_us(s["functions"].get(n, []))) for n in sorted(functions)
            },
            # Host reads and CUDA waits by caller: calls a step, ms a step.
            "host_reads": {
                n: {
                    "calls": round(sum(len(per_step[i]["reads"].get(n, [])) for i in indices) / len(indices), 2),
                    "ms": mean_ms(indices, lambda s, n=n: sum(s["reads"].get(n, []))),
                }
                for n in sorted({n for i in indices for n in per_step[i]["reads"]})
            },
        }
    base = summary["kinds"].get("decode") or summary["kinds"].get("full graph")
    if base:
        for row in summary["kinds"].values():
            if row is base:
                continue
            excess = {
                n: round(ms - base["functions_ms"].get(n, 0.0), 3)
                for n, ms in row["functions_ms"].items()
                if ms - base["functions_ms"].get(n, 0.0) > 0
            }
            row["excess_over_decode_ms"] = dict(sorted(excess.items(), key=lambda kv: -kv[1])[:top])
            row["ranges_excess_over_decode_ms"] = {
                n: round(ms - base["ranges_ms"].get(n, 0.0), 3) for n, ms in row["ranges_ms"].items()
            }
    for row in summary["kinds"].values():
        row["functions_ms"] = dict(sorted(row["functions_ms"].items(), key=lambda kv: -kv[1])[:top])
    summary["per_step"] = [
        {"kind": s["kind"], "wall_ms": round(s["wall_us"] / 1000.0, 3), "added": s["added"], "removed": s["removed"]}
        for s in per_step
    ]
    summary["_bounds"] = bounds
    return summary


def slim(trace: dict[str, Any], summary: dict[str, Any], keep: int) -> dict[str, Any]:
    """The trace's events inside ``keep`` steps of each kind, those whose wall time is nearest their kind's median."""
    chosen: list[tuple[float, float]] = []
    for kind, row in summary["kinds"].items():
        indices = [i for i, s in enumerate(summary["per_step"]) if s["kind"] == kind]
        indices.sort(key=lambda i: abs(summary["per_step"][i]["wall_ms"] - row["wall_p50_ms"]))
        chosen += [summary["_bounds"][i] for i in indices[:keep]]
    kept = [
        e
        for e in trace.get("traceEvents", [])
        if e.get("ph") != "X" or any(start <= float(e.get("ts", -1)) < end for start, end in chosen)
    ]
    return {**{k: v for k, v in trace.items() if k != "traceEvents"}, "traceEvents": kept}


def render(summary: dict[str, Any], label: str, top: int = 30) -> str:
    lines = [f"{label}: {summary['steps']} steps (Python calls traced: {summary['python_calls']})", ""]
    lines.append(
        "| kind | steps | wall ms (mean / p50) | GPU busy ms | host waits on the GPU ms | main thread's Python ms |"
    )
    lines.append("|---|---|---|---|---|---|")
    for kind, row in summary["kinds"].items():
        lines.append(
            f"| {kind} | {row['steps']} | {row['wall_ms']:.2f} / {row['wall_p50_ms']:.2f} | {row['gpu_busy_ms']:.2f} | "
            f"{row['host_waits_ms']:.2f} | {row['main_python_ms']:.2f} |"
        )
    for kind, row in summary["kinds"].items():
        lines += ["", f"{kind}: vLLM's ranges (mean ms a step)"]
        lines += [f"  {ms:9.3f}  {name}" for name, ms in sorted(row["ranges_ms"].items(), key=lambda kv: -kv[1])]
        if row["host_reads"]:
            lines += ["", f"{kind}: host reads and CUDA waits by caller (calls / ms a step)"]
            reads = sorted(row["host_reads"].items(), key=lambda kv: (-kv[1]["ms"], -kv[1]["calls"]))
            lines += [f"  {r['calls']:7.2f} {r['ms']:9.3f}  {name}" for name, r in reads[:top]]
        if "excess_over_decode_ms" in row:
            lines += ["", f"{kind}: the functions' mean over the decode step's (ms a step, inclusive)"]
            lines += [f"  {ms:9.3f}  {name}" for name, ms in row["excess_over_decode_ms"].items()]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trace", type=Path)
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--slim", type=Path, help="write the events of a few steps of each kind here (.json.gz)")
    parser.add_argument("--keep", type=int, default=2, help="steps of each kind --slim keeps")
    args = parser.parse_args()
    trace = load(args.trace)
    summary = anatomy(trace, args.top)
    print(render(summary, args.trace.name, args.top), end="")
    if args.slim:
        args.slim.write_bytes(gzip.compress(json.dumps(slim(trace, summary, args.keep)).encode()))
        print(f"wrote {args.slim}")
    summary.pop("_bounds")
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
