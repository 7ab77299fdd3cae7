"""``benchmarks/wave_steps.py``: a burst's Stage-0 steps per engine and the Triton compiles met on the way, from the
lines a served log holds (``[KaniFirstOutput]`` of each scheduler, ``[KaniJit]`` with ``KANI_JIT_EVENTS=1``)."""

from __future__ import annotations

import json

from tests.conftest import benchmark_script, run_benchmark_script

wave_steps = benchmark_script("wave_steps")


def first_output(replica: int, rid: str, added: float, scheduled: float, output: float) -> str:
    return (
        f"(StageEngineCoreProc_stage0_replica{replica} pid={100 + replica}) INFO 12-07 04:18:25 [first_outputs.py:76] "
        f"[KaniFirstOutput] stage=0 request_id={rid} added={added:.6f} scheduled={scheduled:.6f} output={output:.6f} "
        "arrival_lag_ms=1.0"
    )


def jit(replica: int, kernel: str, start: float, ms: float) -> str:
    return (
        f"(StageEngineCoreProc_stage0_replica{replica} pid={100 + replica}) INFO 12-07 04:18:25 [jit_events.py:50] "
        f"[KaniJit] kernel={kernel} start={start:.6f} ms={ms:.1f} warmup=False spec=[('*bf16', 'D')]"
    )


def served_log() -> list[str]:
    lines = [first_output(0, "speech-warmup-0-aaaaaaaa", 10.0, 10.0, 10.1)]  # alone: no burst
    # A burst of 8: engine 0 admits every 15 ms; engine 1 admits at 100.000 and then not for 60 ms (a compile).
    for k in range(4):
        t = 100.0 + 0.015 * k
        lines.append(first_output(0, f"speech-a{k}-bbbbbbbb", t, t + 0.001, t + 0.030))
    for k, (added, scheduled) in enumerate([(100.001, 100.002), (100.010, 100.070), (100.011, 100.070)]):
        lines.append(first_output(1, f"speech-b{k}-cccccccc", added, scheduled, scheduled + 0.025))
    lines.append(first_output(1, "speech-b3-dddddddd", 100.012, 100.070, 100.095))
    lines.append(jit(1, "_zero_kv_blocks_kernel", 100.004, 58.0))
    lines.append(jit(0, "_code_race_kernel", 50.0, 900.0))  # at start-up: outside the burst
    lines.append("(APIServer pid=1) INFO something else")
    return lines


def test_bursts_are_split_per_engine_with_the_compiles_inside_them(tmp_path):
    lines = served_log()
    (report,) = [
        wave_steps.burst_report(b, wave_steps.jit_events(lines))
        for b in wave_steps.bursts(wave_steps.first_outputs(lines), 0.05, 8)
    ]
    assert report["requests"] == 8
    fast, slow = report["engines"]["0"], report["engines"]["1"]
    assert [s["admitted"] for s in fast["steps"]] == [1, 1, 1, 1] and fast["longest_gap_between_admissions_ms"] == 15.0
    assert [(s["scheduled_ms"], s["admitted"]) for s in slow["steps"]] == [(2.0, 1), (70.0, 3)]
    assert slow["longest_gap_between_admissions_ms"] == 68.0
    assert [(e["kernel"], e["start_ms"], e["ms"]) for e in report["jit"]] == [("_zero_kv_blocks_kernel", 4.0, 58.0)]
    log = tmp_path / "serve.log"
    log.write_text("\n".join(lines) + "\n")
    out = run_benchmark_script("wave_steps", log, "--min-burst", "8", "--json", tmp_path / "w.json")
    assert (
        "burst 0: 8 requests" in out and "compile _zero_kv_blocks_kernel in StageEngineCoreProc_stage0_replica1" in out
    )
    assert "compiles in the log: 2 (958 ms)" in out
    assert len(json.loads((tmp_path / "w.json").read_text())["bursts"]) == 1
