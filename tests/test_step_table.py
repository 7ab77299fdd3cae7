"""``benchmarks/stage0_step_table.py`` rebuilds the eleventh set's served Stage-0 table (docs/BENCHMARKS.md) from the
py-spy record and GPU utilisation committed under ``benchmarks/results/h200-eleventh/instance-2/profile/``."""

from __future__ import annotations

from tests.conftest import REPO_ROOT, run_benchmark_script

PROFILE = REPO_ROOT / "benchmarks" / "results" / "h200-eleventh" / "instance-2" / "profile"


def test_the_committed_profile_gives_the_documented_table():
    out = run_benchmark_script(
        "stage0_step_table", PROFILE / "idle-978.txt.gz", "--gpu-util", PROFILE / "gpu-util-shipped.csv"
    )
    assert "GPU busy 59.9% while loaded; 9 samples at 0% after the load: 450 idle samples dropped" in out
    rows = {line.split(" | ")[0].lstrip("| "): line.split(" | ")[2].rstrip(" |") for line in out.splitlines()[3:]}
    documented = {
        "idle, no request in the engine": "9.4%",
        "vLLM's penalties": "15.8%",
        "vLLM's codebook-1 noise, one draw per seeded generator": "7.7%",
        "waiting for the GPU in `_to_list`": "8.0%",
        "`execute_model` without the heads": "17.1%",
        "scheduler `schedule`": "12.3%",
    }
    assert {k: rows[k] for k in documented} == documented
    shares = [float(v.rstrip("%")) for v in rows.values()]
    assert abs(sum(shares) - 100.0) < 0.2


def test_a_record_with_thread_roots_reads_the_main_thread_only(tmp_path):
    """``profile_served.py`` records with ``--threads``: each stack's root names its thread; only MainThread's count."""
    raw = tmp_path / "idle-1.txt"
    main = "thread (10): MainThread;<module> (<string>:1);run_busy_loop (vllm/v1/engine/core.py:1)"
    raw.write_text(
        f"{main};schedule (vllm_omni/core/sched/omni_ar_scheduler.py:1) 3\n"
        f"{main};_to_list (vllm/v1/worker/gpu_model_runner.py:1) 1\n"
        "thread (11): Thread-2 (recv_loop);_bootstrap (threading.py:1);recv_loop (base.py:1) 50\n"
    )
    out = run_benchmark_script("stage0_step_table", raw)
    assert "| scheduler `schedule` | 3 | 75.0% |" in out
    assert "| waiting for the GPU in `_to_list` | 1 | 25.0% |" in out
    assert "other" not in out
