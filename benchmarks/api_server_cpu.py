"""CPU seconds of a running API server's threads, idle and under a fixed load of speech requests.

    python3 benchmarks/api_server_cpu.py --pid API_SERVER_PID --url http://127.0.0.1:8000 --model CKPT [--json OUT]

The API server's process runs the event loop (main thread) and vLLM-Omni's orchestrator thread, which hands requests
to the engines and takes their outputs, under one GIL. Their CPU time while the server is idle shows what they spend
polling; under a load (``vllm-omni-kani bench`` levels run one after another) what a request costs them. Threads are
named by the kernel's view (``/proc``): the main thread has the process's id.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import psutil


def thread_cpu_s(pid: int) -> dict[int, float]:
    """Thread id -> CPU seconds (user + system) of every thread of ``pid`` now."""
    return {t.id: t.user_time + t.system_time for t in psutil.Process(pid).threads()}


def spent(before: dict[int, float], after: dict[int, float], min_s: float = 0.005) -> dict[str, float]:
    """CPU seconds each thread spent between two snapshots (threads above ``min_s``), busiest first."""
    deltas = {tid: after[tid] - before.get(tid, 0.0) for tid in after}
    return {str(tid): round(d, 3) for tid, d in sorted(deltas.items(), key=lambda kv: -kv[1]) if d >= min_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pid", type=int, required=True, help="the API server's process (vllm serve's own)")
    parser.add_argument("--url", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--idle-s", type=float, default=10.0)
    parser.add_argument("--concurrency", default="16")
    parser.add_argument("--waves", type=int, default=2)
    parser.add_argument("--frames", type=int, default=8)
    parser.add_argument("--runs", type=int, default=3, help="bench runs back to back under load")
    parser.add_argument("--out", default="/tmp/api-server-cpu", help="bench's --out")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    before = thread_cpu_s(args.pid)
    time.sleep(args.idle_s)
    idle = spent(before, thread_cpu_s(args.pid))
    bench = [sys.executable, "-m", "vllm_omni_kani.cli", "bench", "--url", args.url, "--model", args.model]
    bench += ["--concurrency", args.concurrency, "--waves", str(args.waves), "--max-new-frames", str(args.frames)]
    bench += ["--warmup", "0", "--out", args.out]
    before, start, levels = thread_cpu_s(args.pid), time.perf_counter(), []
    for run in range(args.runs):
        subprocess.run([*bench, "--label", f"load-{run}"], check=True, capture_output=True)
        levels += json.loads((Path(args.out) / f"load-{run}.json").read_text())["levels"]
    wall_s = time.perf_counter() - start
    load = spent(before, thread_cpu_s(args.pid))
    requests = sum(level["requests"] for level in levels)
    report = {
        "idle_s": args.idle_s,
        "idle_cpu_s_by_thread": idle,
        "main_thread": str(args.pid),
        "load_requests": requests,
        "load_errors": sum(level["errors"] for level in levels),
        "load_wall_s": round(wall_s, 1),
        "load_cpu_s_by_thread": load,
        "load_cpu_s_total": round(sum(load.values()), 3),
        "load_frames_per_s": [round(level["frames_per_s"], 1) for level in levels],
        "load_ttfa_ms_p50": [round(level["ttfa_ms_p50"], 1) for level in levels],
        "load_ttfa_ms_p95": [round(level["ttfa_ms_p95"], 1) for level in levels],
    }
    print(json.dumps(report, indent=1))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
