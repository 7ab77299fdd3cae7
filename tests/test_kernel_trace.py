"""``KANI_KERNEL_TRACE``: one torch-profiler window per engine process, opened by a file, and the traces' summary.

The window is the real ``torch.profiler`` (CPU activity here; CUDA is added where a GPU is present) around real ops,
and ``benchmarks/kernel_share.py`` reads what it wrote. The engines' hooks are checked in the codec stage test and in
the served test (``tests/test_serving.py``), which record and summarise a window of a real server. The codec's kernel
table (``benchmarks/codec_kernel_table.py``) reads GPU kernels, which a CPU run has none of: its tests feed it a trace
written here in the profiler's format, with kernel names as a served H200 trace has them.
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from tests.conftest import REPO_ROOT, benchmark_script, run_benchmark_script
from vllm_omni_kani.envs import (
    KANI_KERNEL_TRACE,
    KANI_KERNEL_TRACE_HOST,
    KANI_KERNEL_TRACE_S,
    KERNEL_TRACE_DEFAULT_S,
    kernel_trace_host,
)
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


codec_kernel_table = benchmark_script("codec_kernel_table")

# One codec step's worth of kernels, named as a served H200 trace names them: a channels-last conv (CUTLASS TF32,
# its input and weights converted first), a channel-major one (converted to NHWC and back), the Triton kernels between.
CODEC_KERNELS = [
    ("void cudnn::engines_precompiled::convertTensor_kernel<float, float, float, (cudnnKernelDataType_t)2>(float)", 90),
    ("void cudnn::engines_precompiled::convertTensor_kernel<float, float, float, (cudnnKernelDataType_t)2>(float)", 4),
    ("void cutlass__5x_cudnn::Kernel<cutlass_tensorop_s1688fprop_optimized_tf32_128x128_16x4_nhwc_align4>(p)", 145),
    ("_residual_kernel", 112),
    ("void cudnn::engines_precompiled::nchwToNhwcKernel<float, float, float, false, true>(x)", 25),
    ("sm90_xmma_fprop_implicit_gemm_f32f32_tf32f32_f32_nhwckrsc_nhwc_tilesize128x128x32_warpgroupsize1x1x1", 172),
    ("void cudnn::engines_precompiled::nhwcToNchwKernel<float, float, float, true, false>(x)", 26),
    ("_half_snake_channels_last_kernel", 100),
    ("void at::native::(anonymous namespace)::indexSelectSmallIndex<float, long, unsigned int, 2, 2, -2>(x)", 11),
]


def codec_trace(repeats: int) -> dict:
    events, ts = [], 1000.0
    for _ in range(repeats):
        for name, dur in CODEC_KERNELS:
            events.append({"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur, "args": {"grid": [1, 1, 1]}})
            ts += dur + 1.0
    events.append({"ph": "X", "cat": "cpu_op", "name": "aten::conv2d", "ts": 1000.0, "dur": 5.0})
    return {"schemaVersion": 1, "traceEvents": events}


def test_codec_table_charges_each_conversion_to_the_conv_beside_it(tmp_path):
    result = codec_kernel_table.table(codec_kernel_table.gpu_events(json.dumps(codec_trace(3))))
    kinds = {row["kind"]: row for row in result["kinds"]}
    assert result["events"] == 3 * len(CODEC_KERNELS)  # the CPU op is not GPU time
    assert kinds[codec_kernel_table.CONVERSION]["ms"] == pytest.approx(3 * (90 + 4 + 25 + 26) / 1e3)
    assert kinds[codec_kernel_table.CONV]["count"] == 6
    assert kinds["state gathers and scatters"]["ms"] == pytest.approx(3 * 11 / 1e3)
    assert sum(row["share"] for row in result["kinds"]) == pytest.approx(1.0, abs=1e-3)
    assert len(result["convs"]) == 2
    cutlass = next(row for row in result["convs"] if "cutlass" in row["conv"])
    hopper = next(row for row in result["convs"] if row["conv"].startswith("sm90_xmma"))
    # Input and weights converted before the CUTLASS conv; to NHWC before and back after the channel-major one.
    assert (cutlass["count"], cutlass["conv_ms"], cutlass["conversions_ms"]) == (3, 0.435, 0.282)
    assert (hopper["count"], hopper["conv_ms"], hopper["conversions_ms"]) == (3, 0.516, 0.153)


def test_codec_table_reads_a_trace_cut_mid_archive(tmp_path):
    whole = tmp_path / "stage1-1.json.gz"
    whole.write_bytes(gzip.compress(json.dumps(codec_trace(200)).encode()))
    cut = tmp_path / "stage1-2.json.gz"
    cut.write_bytes(whole.read_bytes()[: len(whole.read_bytes()) * 2 // 3])
    text, complete = codec_kernel_table.read_trace_text(whole)
    assert complete and len(codec_kernel_table.gpu_events(text)) == 200 * len(CODEC_KERNELS)
    text, complete = codec_kernel_table.read_trace_text(cut)
    events = codec_kernel_table.gpu_events(text)
    assert not complete and 0 < len(events) < 200 * len(CODEC_KERNELS)
    assert [e["name"] for e in events] == [name for name, _ in CODEC_KERNELS * 200][: len(events)]
    out = run_benchmark_script("codec_kernel_table", cut, "--json", tmp_path / "table.json")
    assert "the trace was cut" in out and "| cuDNN conversions (convertTensor, NCHW<->NHWC) |" in out
    assert json.loads((tmp_path / "table.json").read_text())["whole_trace"] is False


def test_host_mode_is_read_per_engine_label(monkeypatch):
    monkeypatch.delenv(KANI_KERNEL_TRACE_HOST, raising=False)
    assert kernel_trace_host("stage0") == ""
    monkeypatch.setenv(KANI_KERNEL_TRACE_HOST, "Python")
    assert kernel_trace_host("stage0") == kernel_trace_host("stage1") == "python"
    monkeypatch.setenv(KANI_KERNEL_TRACE_HOST, "ops:stage0, stage2")
    assert [kernel_trace_host(label) for label in ("stage0", "stage1", "stage2")] == ["ops", "", "ops"]
    monkeypatch.setenv(KANI_KERNEL_TRACE_HOST, "stacks")
    with pytest.raises(ValueError, match="KANI_KERNEL_TRACE_HOST='stacks'"):
        kernel_trace_host("stage0")
    # The mode is read only where a window can open.
    monkeypatch.delenv(KANI_KERNEL_TRACE, raising=False)
    assert KernelTrace("stage0").host == ""


def _python_named(path, needle: str) -> list:
    events = json.loads(path.read_text())["traceEvents"]
    return [e for e in events if e.get("cat") == "python_function" and e["name"].endswith(needle)]


def _traced_helper(a):
    return a @ a


@pytest.mark.parametrize("host", ["", "python"])
def test_the_python_host_mode_records_every_call(tmp_path, host):
    (tmp_path / TRIGGER).touch()
    trace = KernelTrace("stage0", folder=str(tmp_path), seconds=0.0, cuda=False, host=host)
    trace.tick()
    a = torch.randn(8, 8)
    for _ in range(3):
        _traced_helper(a)
    trace.tick()
    assert len(_python_named(trace.path, ": _traced_helper")) == (3 if host else 0)
    assert len(mm_events(trace.path)) == 3


step_anatomy = benchmark_script("step_anatomy")


def _event(cat: str, name: str, ts: float, dur: float, tid: int = 1) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 7, "tid": tid}


def anatomy_trace() -> dict:
    """Six steps of 10 ms on thread 1: two admit a request (a 4-ms ``add_request``, a 5-ms forward and a tensor's
    ``item``), the others decode (a 3-ms forward); another thread's Python, a 2-ms kernel, a 0.7-ms stream
    synchronisation (inside the forward of a step that admits, after it otherwise) and an async copy in each step."""
    events = []
    for i in range(7):
        t0 = 1000.0 + 10_000.0 * i
        events.append(_event("user_annotation", step_anatomy.STEP_RANGE, t0, 500.0))
        if i == 6:
            break  # the last range only closes the sixth step
        prefill = i in (1, 4)
        if prefill:
            events.append(_event("python_function", "vllm/v1/worker/gpu_input_batch.py(300): add_request", t0, 4000.0))
        forward = 5000.0 if prefill else 3000.0
        events.append(_event("user_annotation", "gpu_model_runner: forward", t0 + 4500.0, forward))
        events.append(_event("python_function", "m.py(1): forward", t0 + 4500.0, forward))
        events.append(_event("python_function", "m.py(2): inner", t0 + 4600.0, 1000.0))
        events.append(_event("python_function", "m.py(2): inner", t0 + 4700.0, 500.0))  # nested: counted once
        if prefill:  # a host read inside the outer inner call
            item = "<built-in method item of Tensor object at 0x7f01>"
            events.append(_event("python_function", item, t0 + 4650.0, 100.0))
        events.append(_event("python_function", "out.py(9): loop", t0, 2000.0, tid=2))
        events.append(_event("cuda_runtime", "cudaStreamSynchronize", t0 + 9000.0, 700.0))
        events.append(_event("cuda_runtime", "cudaMemcpyAsync", t0 + 4800.0, 50.0))  # returns at once: no wait
        events.append({**_event("kernel", "k", t0 + 5000.0, 2000.0), "pid": 0, "tid": 7})
    return {"traceEvents": events}


def test_step_anatomy_splits_steps_by_kind_and_charges_the_excess(tmp_path):
    summary = step_anatomy.anatomy(anatomy_trace())
    assert summary["steps"] == 6 and summary["python_calls"]
    kinds = summary["kinds"]
    assert (kinds["prefill"]["steps"], kinds["decode"]["steps"]) == (2, 4)
    assert kinds["decode"]["wall_ms"] == kinds["prefill"]["wall_ms"] == 10.0
    assert kinds["decode"]["gpu_busy_ms"] == 2.0 and kinds["decode"]["host_waits_ms"] == 0.7
    assert kinds["decode"]["other_threads_python_ms"] == 2.0
    assert kinds["decode"]["functions_ms"]["m.py: inner"] == 1.0
    excess = kinds["prefill"]["excess_over_decode_ms"]
    assert excess["vllm/v1/worker/gpu_input_batch.py: add_request"] == 4.0 and excess["m.py: forward"] == 2.0
    assert "m.py: inner" not in excess  # the same in both kinds
    assert kinds["prefill"]["ranges_excess_over_decode_ms"]["gpu_model_runner: forward"] == 2.0
    # Host reads and CUDA waits, each charged to the Python calls around it.
    assert kinds["prefill"]["host_reads"] == {
        "read: m.py: inner > <built-in method item of Tensor object>": {"calls": 1.0, "ms": 0.1},
        "wait: m.py: forward": {"calls": 1.0, "ms": 0.7},
    }
    assert kinds["decode"]["host_reads"] == {"wait: ?": {"calls": 1.0, "ms": 0.7}}
    trace = tmp_path / "stage0-7.json.gz"
    trace.write_bytes(gzip.compress(json.dumps(anatomy_trace()).encode()))
    out = run_benchmark_script(
        "step_anatomy", trace, "--json", tmp_path / "a.json", "--slim", tmp_path / "slim.json.gz", "--keep", "1"
    )
    assert "| prefill | 2 | 10.00 / 10.00 |" in out and "add_request" in out
    assert "1.00     0.700  wait: m.py: forward" in out
    slim = json.loads(gzip.decompress((tmp_path / "slim.json.gz").read_bytes()))
    starts = {e["ts"] for e in slim["traceEvents"] if e["name"] == step_anatomy.STEP_RANGE}
    assert len(starts) == 2  # one step of each kind
    assert json.loads((tmp_path / "a.json").read_text())["kinds"]["prefill"]["steps"] == 2
