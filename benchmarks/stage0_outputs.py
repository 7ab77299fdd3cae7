"""What Stage 0's step outputs cost on their way to the orchestrator, sent every step or coalesced
(``core/sched/stage0_scheduler.py``).

    PYTHONPATH=. python3 benchmarks/stage0_outputs.py [--requests 256] [--steps 250] [--every 8] [--rounds 3]
        [--json OUT]

Served with async_chunk, each Stage-0 step's outputs are built in the engine core, serialised by its output thread
(sharing the engine's GIL with the step), deserialised by the API server's socket thread and processed by its
orchestrator thread (both sharing the GIL with the event loop). This runs those parts for real on one core:
``--requests`` streams of ``--steps`` tokens, every step's outputs as the AR scheduler builds them (one token each, no
codes: with async_chunk they go through the connector), passed through an ``OutputCoalescer`` (``--every``; 1 is
vLLM-Omni's every step), vLLM's msgpack encoder and decoder, and a real ``MultimodalOutputProcessor`` as served
(``FINAL_ONLY``, stats on, ``patch.constant_time_output_stats`` applied). It reports microseconds per step for the
engine side (coalescer + encode) and the API-server side (decode + processor), alternating rounds, and checks that both
ways every request finished with all of its tokens.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

from output_stats import served_processor, step_outputs
from vllm import envs
from vllm.v1.metrics.stats import IterationStats
from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder
from vllm_omni.engine import OmniEngineCoreOutput, OmniEngineCoreOutputs

from vllm_omni_kani import patch
from vllm_omni_kani.core.sched.stage0_scheduler import DEFAULT_OUTPUT_EVERY_STEPS, OutputCoalescer


def run(requests: int, steps: int, every: int) -> dict[str, float | int | bool]:
    """One pass: microseconds per step on each side, outputs sent, and whether every request got all its tokens."""
    processor, ids = served_processor(requests, steps)
    coalescer = OutputCoalescer(every)
    encoder, decoder = MsgpackEncoder(), MsgpackDecoder(OmniEngineCoreOutputs)
    engine_s = api_s = 0.0
    sent = 0
    tokens: dict[str, int] = dict.fromkeys(ids, 0)
    finished = 0
    for step in range(steps):
        t0 = time.perf_counter()
        batch = OmniEngineCoreOutputs(outputs=step_outputs(ids, step, steps, OmniEngineCoreOutput))
        outputs = coalescer.filter({0: batch})
        frames = [encoder.encode(eco) for eco in outputs.values()]
        t1 = time.perf_counter()
        for buffers in frames:
            received = decoder.decode(buffers)
            result = processor.process_outputs(
                received.outputs, engine_core_timestamp=time.monotonic(), iteration_stats=IterationStats()
            )
            finished += sum(1 for out in result.request_outputs if out.finished)
            for out in received.outputs:
                tokens[out.request_id] += len(out.new_token_ids)
            sent += len(received.outputs)
        t2 = time.perf_counter()
        engine_s += t1 - t0
        api_s += t2 - t1
    return {
        "engine_us_per_step": engine_s / steps * 1e6,
        "api_us_per_step": api_s / steps * 1e6,
        "outputs_per_step": sent / steps,
        "all_tokens": finished == requests and all(n == steps for n in tokens.values()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--steps", type=int, default=250)
    parser.add_argument("--every", type=int, default=DEFAULT_OUTPUT_EVERY_STEPS)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    envs.enable_envs_cache()  # as a started server has them
    patch.constant_time_output_stats()  # as served
    runs: dict[int, list[dict]] = {1: [], args.every: []}
    for _ in range(args.rounds):
        for every in runs:
            runs[every].append(run(args.requests, args.steps, every))
    result = {
        "machine": platform.processor() or platform.machine(),
        "requests": args.requests,
        "steps": args.steps,
        "runs": {str(every): passes for every, passes in runs.items()},
    }
    for every, passes in runs.items():
        engine = statistics.median(p["engine_us_per_step"] for p in passes)
        api = statistics.median(p["api_us_per_step"] for p in passes)
        print(
            f"every {every} step(s): {passes[0]['outputs_per_step']:.1f} outputs a step, engine side {engine:,.0f} us,"
            f" API server {api:,.0f} us a step; every request all its tokens: {all(p['all_tokens'] for p in passes)}"
        )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
