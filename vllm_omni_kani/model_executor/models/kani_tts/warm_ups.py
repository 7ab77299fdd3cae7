"""Stage 0's load-time warm-ups, run one after another or at once.

Each warm-up is a call that makes Triton compile one kernel specialisation at model load rather than in a served step
(``code_sampler``, ``code_race``, ``codebook1_noise``, ``open_columns``). On a machine that has not compiled them, a
Stage-0 engine's model load took 81-127 s with them run one after another, against ~2 s for a later engine reading
them from Triton's disk cache (docs/BENCHMARKS.md, forty-sixth set). Triton's compile runs partly outside the GIL
(``ptxas`` is a subprocess; two threads compiled four kernels 1.42x as fast as one on a 2-core CPU,
``benchmarks/triton_compile_threads.py``), so the warm-ups run in threads (``KANI_CONCURRENT_WARM_UPS=0``: one after
another). A fresh H200 engine's model load took 32.7 s so, against 77.9 s one after another (forty-seventh set).

A warm-up names the kernel it compiles. Triton creates a kernel's per-device cache on its first launch there, without a
lock, so each kernel's first warm-up runs alone (one after another); the rest, whose specialisations only add entries
to caches that exist, then run at once.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import torch

from vllm_omni_kani import envs

# At most this many warm-ups compile at once (and never more than the host's cores).
MAX_THREADS = 16

# The kernels the warm-ups compile, by the name a warm-up gives (each has its own per-device cache in Triton).
TOPK_TOPP_KERNEL = "vllm top-k/top-p"
CODE_RACE_KERNEL = "code race"
HASHED_NOISE_KERNEL = "hashed exponentials"


class WarmUp(NamedTuple):
    """One warm-up: the Triton kernel it compiles (a name shared by its specialisations) and the call that does it."""

    kernel: str
    call: Callable[[], object]


def first_of_each_kernel(warm_ups: Sequence[WarmUp]) -> tuple[list[WarmUp], list[WarmUp]]:
    """``warm_ups`` split into each kernel's first, in order, and the rest, in order."""
    seen: set[str] = set()
    first, rest = [], []
    for warm_up in warm_ups:
        (rest if warm_up.kernel in seen else first).append(warm_up)
        seen.add(warm_up.kernel)
    return first, rest


def run(warm_ups: Sequence[WarmUp], device: torch.device) -> None:
    """Run ``warm_ups``: each kernel's first alone and then the rest in threads on ``device``, or with
    ``KANI_CONCURRENT_WARM_UPS=0`` one after another. A warm-up's exception is raised here once every thread has
    ended."""
    first, rest = first_of_each_kernel(warm_ups) if envs.concurrent_warm_ups() else (list(warm_ups), [])
    threads = min(len(rest), os.cpu_count() or 1, MAX_THREADS)
    if threads <= 1:
        first, rest = first + rest, []
    for warm_up in first:
        warm_up.call()
    if not rest:
        return

    # A thread starts on CUDA's device 0: an engine on another device must compile and launch there. A device given
    # as plain "cuda" means the caller's current one, which the threads do not inherit.
    index = None
    if device.type == "cuda":
        index = torch.cuda.current_device() if device.index is None else device.index

    def in_thread(warm_up: WarmUp) -> None:
        if index is not None:
            torch.cuda.set_device(index)
        warm_up.call()

    with ThreadPoolExecutor(threads, thread_name_prefix="kani-warm-up") as pool:
        futures = [pool.submit(in_thread, warm_up) for warm_up in rest]
    for future in futures:
        future.result()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
