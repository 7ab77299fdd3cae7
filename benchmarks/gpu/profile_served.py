"""Where a loaded server's host time goes: CPU per process and thread, and py-spy stacks of the busy processes.

    python3 benchmarks/gpu/profile_served.py --ckpt CK --deploy-config Y --out R [--frames 250 --streams 256]

Starts one `vllm serve --omni` server, loads it with ``bench`` (FRAMES-frame requests at STREAMS concurrent
streams), and once the load is steady measures for SECONDS: the CPU time of every process of the server's tree
and of its busiest threads (psutil, so it costs the server nothing), and, where ``py-spy`` is on PATH, a
non-blocking py-spy profile of the API server and of each stage's engine core (all threads, GIL holders only, and
all threads with idle samples kept: where a thread waits), and the GPU's utilisation every 500 ms (nvidia-smi).
A single-threaded Python process at ~100% CPU (or a GIL held ~100% of the time) is the wall the GPUs wait on.
Writes ``R/profile-LABEL.json`` (CPU table, top stacks) and the raw py-spy files beside it.

With ``--kernel-trace-s S`` it records the GPU instead of stacks: the server runs with ``KANI_KERNEL_TRACE``, and
after DELAY every engine process (each Stage-0 replica, the codec) traces S seconds of its GPU activity at once
(``kernel_trace.py``; ``--kernel-trace-host`` adds the host's ops or Python calls, for ``benchmarks/step_anatomy.py``);
``benchmarks/kernel_share.py``'s summary of those traces (GPU time per process, the union over
all, the heaviest kernels) goes into the JSON as ``kernels``. py-spy is not attached then.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import importlib.util
import json
import math
import re
import shutil
import subprocess
import threading
import time
from pathlib import Path

import psutil

from vllm_omni_kani.benchmarks import bench_tts
from vllm_omni_kani.benchmarks.server import serving
from vllm_omni_kani.envs import (
    KANI_KERNEL_TRACE,
    KANI_KERNEL_TRACE_HOST,
    KANI_KERNEL_TRACE_S,
    KERNEL_TRACE_HOST_MODES,
)
from vllm_omni_kani.model_executor.models.kani_tts.kernel_trace import TRIGGER

KERNEL_SHARE = Path(__file__).resolve().parents[1] / "kernel_share.py"


def kernel_share_module():
    """``benchmarks/kernel_share.py`` (a script beside this one, not a package module)."""
    spec = importlib.util.spec_from_file_location("kernel_share", KERNEL_SHARE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def server_tree(root: int) -> list[psutil.Process]:
    """The server process and all its descendants."""
    proc = psutil.Process(root)
    return [proc, *proc.children(recursive=True)]


def thread_name(pid: int, tid: int) -> str:
    try:
        return Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
    except OSError:
        return ""


def snapshot(procs: list[psutil.Process]) -> dict[str, tuple[str, float]]:
    """CPU seconds per process (``"pid"``) and per thread (``"pid/tid"``), with the process or thread name."""
    snap = {}
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            times = proc.cpu_times()
            snap[str(proc.pid)] = (proc.name(), times.user + times.system)
            for thread in proc.threads():
                snap[f"{proc.pid}/{thread.id}"] = (
                    thread_name(proc.pid, thread.id),
                    thread.user_time + thread.system_time,
                )
    return snap


def top_stacks(raw: Path, count: int = 40) -> dict[str, object]:
    """Inclusive sample counts per function of a py-spy ``raw`` (collapsed) file."""
    total, inclusive = 0, collections.Counter()
    for line in raw.read_text(errors="replace").splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack or not n.isdigit():
            continue
        total += int(n)
        for frame in {re.sub(r":\d+\)$", ")", f) for f in stack.split(";")}:
            inclusive[frame] += int(n)
    return {"samples": total, "inclusive": inclusive.most_common(count)}


def thread_shares(raw: Path, count: int = 12) -> list[tuple[str, int]]:
    """Samples per thread of a py-spy ``raw`` file recorded with ``--threads`` (each stack's root is
    ``thread (TID): NAME``, or ``thread (TID)`` before the thread has a name): which thread of a process holds its
    GIL, or where each one waits. Threads come as ``NAME (TID)``, most samples first."""
    samples: collections.Counter = collections.Counter()
    names: dict[str, str] = {}
    for line in raw.read_text(errors="replace").splitlines():
        stack, _, n = line.rpartition(" ")
        match = re.match(r"thread \((\d+)\)(?:: ([^;]*))?", stack)
        if match and n.isdigit():
            samples[match[1]] += int(n)
            if match[2]:
                names[match[1]] = match[2]
    return [(f"{names.get(tid, '?')} ({tid})", n) for tid, n in samples.most_common(count)]


# What one GPU serves at most (frames/s, all streams together) and one stream at most (a step of a few rows): the
# default per-stream rate below is the GPU's share per stream, between the two.
MAX_GPU_FPS = 8_000.0
MAX_STREAM_FPS = 200.0


def default_stream_fps(streams: int) -> float:
    """The fastest frames/s a stream is expected to get at ``streams`` streams: 50 at 256 (one H200 served ~9,000
    frames/s there), more with fewer streams. A fixed 50 sent too few waves at 64 streams, where a stream gets
    ~85 frames/s: the load ended ~4 s inside the window twice (docs/BENCHMARKS.md, twentieth and twenty-first sets)."""
    return min(MAX_STREAM_FPS, max(50.0, MAX_GPU_FPS / max(streams, 1)))


def load_waves(args: argparse.Namespace) -> int:
    """Waves of ``streams`` requests that keep the server loaded past the measured window even at ``stream_fps``
    frames/s per stream (``default_stream_fps`` unless given), plus one: three waves (the earlier default) ended
    ~10 s into a 20-s window at 256 streams on an H100 (docs/BENCHMARKS.md, "Seventeenth set")."""
    stream_fps = args.stream_fps if args.stream_fps else default_stream_fps(args.streams)
    seconds_per_request = args.frames / stream_fps
    return math.ceil((args.delay + args.seconds) / seconds_per_request) + 1


def wait_for_traces(log_path: Path, timeout_s: float = 240.0) -> int:
    """How many engines wrote their window, waiting until every engine that started one has (or ``timeout_s``)."""
    deadline = time.monotonic() + timeout_s
    while True:
        text = log_path.read_text(errors="replace")
        started = len(re.findall(r"Kani kernel trace: \S+ \(pid \d+\) recording", text))
        written = len(re.findall(r"Kani kernel trace: \S+ wrote ", text))
        if (started and written >= started) or time.monotonic() > deadline:
            return written
        time.sleep(1.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ckpt", required=True)
    parser.add_argument("--deploy-config", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--label", default="shipped")
    parser.add_argument("--frames", type=int, default=250)
    parser.add_argument("--streams", type=int, default=256)
    parser.add_argument("--delay", type=float, default=20.0, help="seconds of load before measuring")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--rate", type=int, default=100, help="py-spy samples per second")
    parser.add_argument(
        "--stream-fps",
        type=float,
        default=0.0,
        help="the fastest frames/s per stream expected (0: default_stream_fps of --streams): enough requests are sent "
        "to load the server past the window",
    )
    parser.add_argument("--kernel-trace-s", type=float, default=0.0, help="trace the GPU this long instead of py-spy")
    parser.add_argument(
        "--kernel-trace-host",
        default=None,
        help="with --kernel-trace-s: the host's ops (with vLLM's own ranges) or every Python call beside the GPU "
        f"({' or '.join(KERNEL_TRACE_HOST_MODES[1:])}, or MODE:LABEL for one kind of engine, e.g. python:stage0)",
    )
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    traces = out / f"kernel-trace-{args.label}"
    env = {}
    if args.kernel_trace_s > 0:
        traces.mkdir(exist_ok=True)
        env = {KANI_KERNEL_TRACE: str(traces), KANI_KERNEL_TRACE_S: str(args.kernel_trace_s)}
        if args.kernel_trace_host:
            # vLLM names its runner's and scheduler's parts (preprocess, forward, sample, ...) only when asked to.
            env |= {KANI_KERNEL_TRACE_HOST: args.kernel_trace_host, "VLLM_CUSTOM_SCOPES_FOR_PROFILING": "1"}
    py_spy = shutil.which("py-spy") if not env else None
    with serving(args.ckpt, args.deploy_config, out / f"serve-profile-{args.label}.log", env=env) as server:
        argv = ["--url", server.url, "--model", args.ckpt, "--label", f"profile-load-{args.label}"]
        argv += ["--max-new-frames", str(args.frames), "--concurrency", str(args.streams)]
        argv += ["--requests", str(args.streams * load_waves(args)), "--warmup", "0", "--out", str(out)]
        bench_parser = argparse.ArgumentParser()
        bench_tts.add_arguments(bench_parser)
        bench_args = bench_parser.parse_args(argv)
        load = threading.Thread(
            target=bench_tts.run_serve_bench, args=(bench_args, server.url, args.ckpt, bench_args.label, 0.0)
        )
        load.start()
        time.sleep(args.delay)
        procs = server_tree(server.proc.pid)
        names = {}
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                names[proc.pid] = " ".join(proc.cmdline())[:120]
        busy = [pid for pid, name in names.items() if "VLLM::StageEngineCore" in name or pid == server.proc.pid]
        spies = []
        if py_spy:
            # --threads: every stack's root names its thread (the API server's event loop and vLLM-Omni's
            # orchestrator thread share one GIL; an engine core's step, output and connector threads another).
            common = ["record", "--nonblocking", "--threads", "-r", str(args.rate), "-d", str(int(args.seconds))]
            common += ["-f", "raw"]
            for pid in busy:
                # All threads, and the GIL holder only: a process whose GIL is held ~100% of the time is the wall
                # (the engine cores run their step, output and connector threads under one GIL).
                spies.append(subprocess.Popen([py_spy, *common, "-p", str(pid), "-o", str(out / f"spy-{pid}.txt")]))
                spies.append(
                    subprocess.Popen([py_spy, *common, "--gil", "-p", str(pid), "-o", str(out / f"gil-{pid}.txt")])
                )
                # Idle samples too: a step loop that is off the CPU half the time waits somewhere (GPU, GIL, a
                # queue), and so does an orchestrator thread that holds the GIL 5% of the time yet hands an output
                # on 40-150 ms after recording it (nineteenth set); these stacks say where.
                idle = [py_spy, *common, "--idle", "-p", str(pid), "-o", str(out / f"idle-{pid}.txt")]
                spies.append(subprocess.Popen(idle))
        smi = shutil.which("nvidia-smi")
        if smi:
            query = [smi, "--query-gpu=index,utilization.gpu,utilization.memory", "--format=csv,noheader,nounits"]
            gpu_log = (out / f"gpu-util-{args.label}.csv").open("w")
            spies.append(
                subprocess.Popen(
                    ["timeout", str(int(args.seconds)), *query, "-lms", "500"],
                    stdout=gpu_log,
                    stderr=subprocess.DEVNULL,
                )
            )
        if env:
            (traces / TRIGGER).touch()
        before, t0 = snapshot(procs), time.monotonic()
        time.sleep(args.seconds)
        after, wall = snapshot(procs), time.monotonic() - t0
        loaded_throughout = load.is_alive()
        if not loaded_throughout:
            print("warning: the load ended inside the measured window; its shares include idle time", flush=True)
        for spy in spies:
            # py-spy writes its file after its last sample; with a dozen spies on two GPUs' engines that took more
            # than a minute (nineteenth set). A spy that never finishes is stopped, not the whole profile.
            try:
                spy.wait(timeout=args.seconds + 240)
            except subprocess.TimeoutExpired:
                print(f"warning: {spy.args[-1]} did not finish; stopped", flush=True)
                spy.kill()
        load.join()
        if env:
            # A window is written by its engine's step after it closes, a host trace in tens of seconds; the
            # server must outlive the writing.
            written = wait_for_traces(server.log_path)
            print(f"kernel traces written: {written}", flush=True)
    rows = []
    for key, (comm, seconds) in after.items():
        if key in before:
            share = (seconds - before[key][1]) / wall
            if "/" not in key or share >= 0.05:
                pid = int(key.split("/")[0])
                rows.append({"id": key, "comm": comm, "cpu": round(share, 3), "process": names.get(pid, "")})
    rows.sort(key=lambda r: (r["id"].split("/")[0], -r["cpu"]))
    result: dict[str, object] = {
        "label": args.label,
        "frames": args.frames,
        "streams": args.streams,
        "loaded_throughout": loaded_throughout,
        "cpu": rows,
    }
    stacks = {}
    for raw in sorted([*out.glob("spy-*.txt"), *out.glob("gil-*.txt"), *out.glob("idle-*.txt")]):
        stacks[raw.stem] = top_stacks(raw)
    result["stacks"] = stacks
    result["threads"] = {
        raw.stem: thread_shares(raw) for raw in sorted([*out.glob("gil-*.txt"), *out.glob("idle-*.txt")])
    }
    # py-spy --gil keeps only samples where a thread held the GIL: their share of all sample slots, per process.
    result["gil_held"] = {
        names.get(pid, str(pid))[:60]: round(stacks[f"gil-{pid}"]["samples"] / (args.rate * int(args.seconds)), 3)
        for pid in busy
        if f"gil-{pid}" in stacks
    }
    result["api_server_pid"] = server.proc.pid
    util = out / f"gpu-util-{args.label}.csv"
    if util.exists():
        busy_pct = [float(line.split(",")[1]) for line in util.read_text().splitlines() if line.count(",") >= 2]
        if busy_pct:
            result["gpu_util_pct"] = {"mean": round(sum(busy_pct) / len(busy_pct), 1), "samples": len(busy_pct)}
            print(f"GPU utilisation mean {result['gpu_util_pct']['mean']}% over {len(busy_pct)} samples", flush=True)
    if env:
        kernel_share = kernel_share_module()
        kernels = kernel_share.summarise(traces, kernel_share.GPU_CATEGORIES)
        result["kernels"] = kernels
        for row in kernels["traces"]:
            if row["events"]:
                print(f"kernels {row['trace']}: {row['busy_ms']:.1f} ms of {row['window_ms']:.1f} ms", flush=True)
        if "all" in kernels:
            print(f"kernels, all processes: {kernels['all']}", flush=True)
    path = out / f"profile-{args.label}.json"
    path.write_text(json.dumps(result, indent=1))
    for row in rows:
        if row["cpu"] >= 0.05:
            print(f"{row['id']:>14} {row['comm']:<18} {100 * row['cpu']:5.0f}%  {row['process'][:60]}")
    for name, stack in stacks.items():
        print(name, "samples", stack["samples"], "top:", [f"{n} {f[:70]}" for f, n in stack["inclusive"][3:12]])
    for name, threads in result["threads"].items():
        print(name, "by thread:", [f"{thread[:60]} {n}" for thread, n in threads[:6]])
    for process, held in result["gil_held"].items():
        print(f"GIL held {100 * held:5.1f}%  {process}", flush=True)
    print(f"wrote {path}", flush=True)


if __name__ == "__main__":
    main()
