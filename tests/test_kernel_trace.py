"""``KANI_KERNEL_TRACE``: one torch-profiler window per engine process, opened by a file, and the traces' summary.

The window is the real ``torch.profiler`` (CPU activity here; CUDA is added where a GPU is present) around real ops,
and ``benchmarks/kernel_share.py`` reads what it wrote. The engines' hooks are checked in the codec stage test and in
the served test (``tests/test_serving.py``), which record and summarise a window of a real server.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import pytest
import torch

from tests.conftest import REPO_ROOT, benchmark_script, run_benchmark_script
from vllm_omni_kani.envs import KANI_KERNEL_TRACE, KANI_KERNEL_TRACE_S, KERNEL_TRACE_DEFAULT_S
from vllm_omni_kani.model_executor.models.kani_tts.kernel_trace import POLL_S, TRIGGER, KernelTrace

kernel_share = benchmark_script("kernel_share")


def mm_events(path) -> list:
    return [e for e in kernel_share.read_events(path, ("cpu_op",)) if e[0] == "aten::mm"]


def test_the_window_opens_at_the_trigger_and_records_exactly_its_ops(tmp_path):
    a, b = torch.randn(64, 64), torch.randn(64, 64)
    trace = KernelTrace("stage0", folder=str(tmp_path), seconds=0.0)
    trace.tick()
    a @ b  # before the trigger: not recorded
    assert trace.pending and not list(tmp_path.glob("*.json"))
    (tmp_path / TRIGGER).touch()
    time.sleep(POLL_S)  # the last look was less than POLL_S ago
    trace.tick()  # opens
    for _ in range(7):
        torch.mm(a, b)
    trace.tick()  # closes: the window is 0 s long
    assert not trace.pending and trace.path is not None and trace.path.parent == tmp_path
    assert trace.path.name.startswith("stage0-")
    assert len(mm_events(trace.path)) == 7
    # One window per process: the trigger is still there, nothing more is written.
    trace.tick()
    torch.mm(a, b)
    trace.tick()
    assert [p.name for p in tmp_path.glob("*.json")] == [trace.path.name]


def test_the_window_stays_open_for_its_seconds(tmp_path):
    (tmp_path / TRIGGER).touch()
    trace = KernelTrace("stage1", folder=str(tmp_path), seconds=60.0)
    trace.tick()
    trace.tick()
    assert trace.pending and trace._profiler is not None  # still recording
    trace._profiler.stop()


def test_unset_variable_means_no_window(monkeypatch, tmp_path):
    monkeypatch.delenv(KANI_KERNEL_TRACE, raising=False)
    monkeypatch.delenv(KANI_KERNEL_TRACE_S, raising=False)
    trace = KernelTrace("stage0")
    assert trace.folder is None and not trace.pending and trace.seconds == KERNEL_TRACE_DEFAULT_S
    trace.tick()
    monkeypatch.setenv(KANI_KERNEL_TRACE, str(tmp_path))
    monkeypatch.setenv(KANI_KERNEL_TRACE_S, "0.5")
    trace = KernelTrace("stage0")
    assert trace.folder == tmp_path and trace.pending and trace.seconds == 0.5


def test_union_of_intervals():
    assert kernel_share.union_us([]) == 0.0
    assert kernel_share.union_us([(0, 10), (5, 10), (20, 1), (21, 0), (2, 3)]) == 16.0
    assert kernel_share.union_us([(0, 100), (10, 5), (50, 10)]) == 100.0


@pytest.mark.parametrize("workers", [2])
def test_each_process_writes_its_own_trace_and_the_summary_reads_them_all(tmp_path, workers):
    """Two processes watching one folder (as two Stage-0 replicas and a codec do) each record their own ops."""
    (tmp_path / TRIGGER).touch()
    script = textwrap.dedent(
        f"""
        import sys, torch
        from vllm_omni_kani.model_executor.models.kani_tts.kernel_trace import KernelTrace
        n = int(sys.argv[1])
        trace = KernelTrace("stage0", folder={str(tmp_path)!r}, seconds=0.0)
        trace.tick()
        a = torch.randn(32, 32)
        for _ in range(n):
            torch.mm(a, a)
        trace.tick()
        print(trace.path)
        """
    )
    runs = [
        subprocess.Popen([sys.executable, "-c", script, str(3 + i)], stdout=subprocess.PIPE, text=True, cwd=REPO_ROOT)
        for i in range(workers)
    ]
    paths = [run.communicate(timeout=300)[0].strip() for run in runs]
    assert all(run.returncode == 0 for run in runs) and len(set(paths)) == workers
    summary = kernel_share.summarise(tmp_path, ("cpu_op",))
    counts = sorted(next(t["count"] for t in row["top"] if t["name"] == "aten::mm") for row in summary["traces"])
    assert counts == [3 + i for i in range(workers)]
    every = summary["all"]
    assert 0 < every["union_ms"] <= every["sum_ms"] and every["union_ms"] <= every["window_ms"]
    out = run_benchmark_script("kernel_share", tmp_path, "--cat", "cpu_op")
    assert out.count("| stage0-") == workers and "all traces: window" in out
