"""Stage 0's load-time warm-ups: by default each kernel's first alone, then the rest in threads, every call exactly once
and a failure raised after every thread has ended; with ``KANI_CONCURRENT_WARM_UPS=0`` one after another."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from vllm_omni_kani import envs
from vllm_omni_kani.model_executor.models.kani_tts import code_sampler, codebook1_noise, open_columns, warm_ups
from vllm_omni_kani.model_executor.models.kani_tts.warm_ups import WarmUp

CPU = torch.device("cpu")


class Recorder:
    """Warm-ups that record which thread ran them, when, and how many of them ran at once."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.runs: list[tuple[str, str, float]] = []  # (name, thread name, start)
        self.running = 0
        self.most_at_once = 0

    def warm_up(self, kernel: str, name: str, seconds: float = 0.3, fail: bool = False) -> WarmUp:
        def call() -> None:
            with self.lock:
                self.runs.append((name, threading.current_thread().name, time.perf_counter()))
                self.running += 1
                self.most_at_once = max(self.most_at_once, self.running)
            time.sleep(seconds)  # sleeps outside the GIL, as Triton's compile mostly runs
            with self.lock:
                self.running -= 1
            if fail:
                raise RuntimeError(f"{name} failed")

        return WarmUp(kernel, call)


def _calls(recorder: Recorder, fail: str = "") -> list[WarmUp]:
    names = [("a", "a1"), ("a", "a2"), ("b", "b1"), ("a", "a3"), ("b", "b2"), ("c", "c1"), ("b", "b3")]
    return [recorder.warm_up(kernel, name, fail=name == fail) for kernel, name in names]


def test_first_of_each_kernel_splits_in_order():
    calls = _calls(Recorder())
    first, rest = warm_ups.first_of_each_kernel(calls)
    assert [w.kernel for w in first] == ["a", "b", "c"]
    assert first == [calls[0], calls[2], calls[5]]
    assert rest == [calls[1], calls[3], calls[4], calls[6]]


def test_switched_off_they_run_one_after_another_in_the_callers_thread(monkeypatch):
    monkeypatch.setenv(envs.KANI_CONCURRENT_WARM_UPS, "0")
    recorder = Recorder()
    warm_ups.run(_calls(recorder), CPU)
    assert [name for name, _, _ in recorder.runs] == ["a1", "a2", "b1", "a3", "b2", "c1", "b3"]
    assert {thread for _, thread, _ in recorder.runs} == {threading.current_thread().name}
    assert recorder.most_at_once == 1


def test_by_default_each_kernels_first_runs_alone_then_the_rest_at_once(monkeypatch):
    monkeypatch.delenv(envs.KANI_CONCURRENT_WARM_UPS, raising=False)
    monkeypatch.setattr(warm_ups.os, "cpu_count", lambda: 8)
    recorder = Recorder()
    warm_ups.run(_calls(recorder), CPU)
    names = [name for name, _, _ in recorder.runs]
    assert sorted(names) == ["a1", "a2", "a3", "b1", "b2", "b3", "c1"]  # each exactly once
    assert names[:3] == ["a1", "b1", "c1"]  # each kernel's first, alone and in order, in the caller's thread
    caller = threading.current_thread().name
    assert all(thread == caller for name, thread, _ in recorder.runs[:3])
    assert all(thread.startswith("kani-warm-up") for _, thread, _ in recorder.runs[3:])
    assert recorder.most_at_once == 4  # the four others at once (8 cores, MAX_THREADS 16)


def test_concurrent_threads_are_bounded_by_the_cores(monkeypatch):
    monkeypatch.setenv(envs.KANI_CONCURRENT_WARM_UPS, "1")
    monkeypatch.setattr(warm_ups.os, "cpu_count", lambda: 2)
    recorder = Recorder()
    warm_ups.run(_calls(recorder), CPU)
    assert len(recorder.runs) == 7
    assert recorder.most_at_once == 2


def test_a_failing_warm_up_is_raised_after_every_other_ran(monkeypatch):
    monkeypatch.setenv(envs.KANI_CONCURRENT_WARM_UPS, "1")
    monkeypatch.setattr(warm_ups.os, "cpu_count", lambda: 8)
    recorder = Recorder()
    with pytest.raises(RuntimeError, match="a2 failed"):
        warm_ups.run(_calls(recorder, fail="a2"), CPU)
    assert sorted(name for name, _, _ in recorder.runs) == ["a1", "a2", "a3", "b1", "b2", "b3", "c1"]
    assert recorder.running == 0


def test_without_cuda_the_model_has_no_warm_ups(monkeypatch):
    """The warm-ups compile Triton kernels for CUDA; a CPU engine has none to run (and no thread is started)."""
    monkeypatch.setenv(envs.KANI_CONCURRENT_WARM_UPS, "1")
    assert code_sampler.kernel_warm_ups(3, 4032, CPU, torch.bfloat16) == []
    assert codebook1_noise.kernel_warm_ups(68442, CPU) == []
    assert open_columns.kernel_warm_ups(CPU) == []


@pytest.mark.parametrize(("device", "expected"), [(torch.device("cuda"), 3), (torch.device("cuda", 1), 1)])
def test_concurrent_threads_launch_on_the_callers_device(monkeypatch, device, expected):
    """Each thread selects the device the warm-ups are for: the given index, or for plain ``"cuda"`` the caller's
    current device (``torch.cuda.set_device`` refuses a device without an index). CUDA's device calls are replaced
    here, as this machine has none; ``tests/test_code_sampler.py``'s CUDA test runs the real ones with plain "cuda"."""
    monkeypatch.setenv(envs.KANI_CONCURRENT_WARM_UPS, "1")
    monkeypatch.setattr(warm_ups.os, "cpu_count", lambda: 8)
    selected: dict[str, object] = {}
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)

    def set_device(index: object) -> None:
        selected[threading.current_thread().name] = index

    monkeypatch.setattr(torch.cuda, "set_device", set_device)
    recorder = Recorder()
    warm_ups.run(_calls(recorder), device)
    threads = {thread for _, thread, _ in recorder.runs[3:]}
    assert threads and set(selected) == threads  # every thread that ran a warm-up selected a device first
    assert set(selected.values()) == {expected}
