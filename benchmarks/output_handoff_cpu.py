"""How the API server's event loop takes the orchestrator's outputs: vLLM-Omni's 1-ms poll against a put that wakes it.

    python3 benchmarks/output_handoff_cpu.py [--seconds 10] [--batch 16] [--work-ms 2] [--gap-ms 8] [--json OUT]

One process, as in the API server: a thread with its own event loop stands in for the orchestrator (each "step" it
holds the GIL for ``--work-ms`` of Python work, then puts ``--batch`` messages on a ``janus.Queue`` and sleeps
``--gap-ms``), and the main thread's event loop (uvloop when installed, as ``vllm serve`` runs it) reads that queue
the way ``AsyncOmni``'s output task does, through vLLM-Omni's own ``AsyncOmniEngine.try_get_output_async``: as
shipped (``polls``: None when empty, then a 1-ms sleep) or wrapped by ``final_outputs.waiting_for_outputs``
(``wakes``). Both modes run one after another, ``--rounds`` times in alternation. Reported per mode: each message's
delay from its put to the loop's take (p50 / p95 / max), the main thread's CPU seconds, and the steps the stand-in
orchestrator got through (its Python work competes with the loop for the GIL).
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import threading
import time
from pathlib import Path
from typing import Any

import janus
from vllm_omni.engine.async_omni_engine import AsyncOmniEngine
from vllm_omni.entrypoints.async_omni import _FINAL_OUTPUT_IDLE_SLEEP_S as IDLE_SLEEP_S  # the task's sleep when empty

from vllm_omni_kani.benchmarks.bench_tts import percentile
from vllm_omni_kani.engine.final_outputs import waiting_for_outputs

VLLM_OMNI_READ = inspect.unwrap(AsyncOmniEngine.try_get_output_async)
READS = {"polls": VLLM_OMNI_READ, "wakes": waiting_for_outputs(VLLM_OMNI_READ)}


class Engine:
    """The two attributes of ``AsyncOmniEngine`` its read uses: the janus output queue and the orchestrator's life."""

    def __init__(self) -> None:
        self.output_queue: janus.Queue[float] = janus.Queue()
        self.alive = True

    def is_alive(self) -> bool:
        return self.alive


def orchestrator(engine: Engine, stop: threading.Event, args: argparse.Namespace, steps: list[int]) -> None:
    """Steps of Python work, each followed by a batch of puts (the message is its put time)."""

    async def run() -> None:
        put = engine.output_queue.async_q.put
        while not stop.is_set():
            end = time.perf_counter() + args.work_ms / 1000
            while time.perf_counter() < end:
                pass
            for _ in range(args.batch):
                await put(time.perf_counter())
            steps[0] += 1
            await asyncio.sleep(args.gap_ms / 1000)

    asyncio.run(run())


async def consume(engine: Engine, read: Any, seconds: float) -> list[float]:
    """``AsyncOmni``'s output task, reduced to its reads: each message's delay from put to take."""
    delays: list[float] = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        message = await read(engine)
        if message is None:
            await asyncio.sleep(IDLE_SLEEP_S)
            continue
        delays.append(time.perf_counter() - message)
    return delays


def one_round(mode: str, args: argparse.Namespace) -> dict[str, Any]:
    engine, stop, steps = Engine(), threading.Event(), [0]
    thread = threading.Thread(target=orchestrator, args=(engine, stop, args, steps), name="orchestrator")
    cpu_before = time.thread_time()
    thread.start()
    delays = new_loop_run(consume(engine, READS[mode], args.seconds))
    main_cpu = time.thread_time() - cpu_before
    stop.set()
    thread.join()
    ms = sorted(d * 1000 for d in delays)
    return {
        "mode": mode,
        "messages": len(ms),
        "delay_ms_p50": round(percentile(ms, 50), 3),
        "delay_ms_p95": round(percentile(ms, 95), 3),
        "delay_ms_max": round(ms[-1], 3),
        "main_cpu_s": round(main_cpu, 3),
        "orchestrator_steps": steps[0],
    }


def new_loop_run(coro: Any) -> Any:
    """Run ``coro`` on a fresh loop: uvloop's where installed (``vllm serve``'s), asyncio's otherwise."""
    try:
        import uvloop

        return uvloop.run(coro)
    except ImportError:
        return asyncio.run(coro)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=10.0, help="per mode per round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--batch", type=int, default=16, help="messages per orchestrator step")
    parser.add_argument("--work-ms", type=float, default=2.0, help="the orchestrator's Python work per step")
    parser.add_argument("--gap-ms", type=float, default=8.0, help="its sleep after each step's puts")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    results = [one_round(mode, args) for _ in range(args.rounds) for mode in READS]
    for row in results:
        print(json.dumps(row))
    if args.json:
        args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json)}, "rounds": results}, indent=1))


if __name__ == "__main__":
    main()
