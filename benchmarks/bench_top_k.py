"""Device time of Stage 0's top-k/top-p filter: vLLM's function against ``top_k_candidates`` (Kani's sampling).

    python3 benchmarks/bench_top_k.py [--rows 64 256] [--top-k 50] [--top-p 0.95] [--iters 200] [--out DIR]

For codebook 1's rows (the ``lm_head``, 68,442 wide) and the code heads' rows (three per request, 4,032 wide), at each
request count: the filter alone, then the filter with the rest of vLLM's sampling (softmax and the exponential race),
each way. Timed with CUDA events over ``--iters`` calls (on a CPU: the wall clock), every call starting from a fresh
copy of the same logits; the copy alone is timed too and subtracted. Also checks, per shape, that both ways keep the
same logits. Writes ``top-k.json``.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path

import torch
from vllm.v1.sample.ops import topk_topp_sampler as ops

from vllm_omni_kani.model_executor.models.kani_tts import token_layout as tl
from vllm_omni_kani.model_executor.models.kani_tts.kani_tts_lm import NUM_CODE_HEADS
from vllm_omni_kani.model_executor.models.kani_tts.top_k_candidates import filter_candidates


def _timed(fn: Callable[[], object], iters: int, device: torch.device) -> float:
    """Mean ms per call of ``fn`` over ``iters`` calls after three warm-up calls."""
    for _ in range(3):
        fn()
    if device.type != "cuda":
        start = time.perf_counter()
        for _ in range(iters):
            fn()
        return (time.perf_counter() - start) / iters * 1e3
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    begin.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return begin.elapsed_time(end) / iters


def _sample(logits: torch.Tensor) -> torch.Tensor:
    """The rest of vLLM's sampling after the filter (``forward_native``'s softmax and ``random_sample``)."""
    return ops.random_sample(logits.softmax(dim=-1, dtype=torch.float32), {})


def measure(rows: int, width: int, top_k: int, top_p: float, iters: int, device: torch.device) -> dict:
    gen = torch.Generator(device="cpu").manual_seed(rows + width)
    source = torch.randn(rows, width, generator=gen).mul_(2).to(device)
    work = torch.empty_like(source)
    k = torch.full((rows,), top_k, dtype=torch.int32, device=device)
    p = torch.full((rows,), top_p, device=device)

    def vllm() -> torch.Tensor:
        return ops.apply_top_k_top_p(work.copy_(source), k, p)

    def candidates() -> torch.Tensor:
        return filter_candidates(work.copy_(source), k, p, top_k)

    same = torch.equal(vllm().clone(), candidates().clone())
    copy_ms = _timed(lambda: work.copy_(source), iters, device)
    result = {"rows": rows, "width": width, "top_k": top_k, "top_p": top_p, "same_kept_logits": same}
    result["copy_ms"] = copy_ms
    for name, fn in (("vllm", vllm), ("candidates", candidates)):
        result[f"{name}_filter_ms"] = _timed(fn, iters, device) - copy_ms
        result[f"{name}_with_sampling_ms"] = _timed(lambda fn=fn: _sample(fn()), iters, device) - copy_ms
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="+", default=[64, 256], help="requests per step")
    parser.add_argument("--top-k", type=int, default=50)
    parser.add_argument("--top-p", type=float, default=0.95)
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    device = torch.device(args.device)
    results = []
    for requests in args.rows:
        for rows, width in ((requests, tl.PARALLEL_VOCAB_SIZE), (requests * NUM_CODE_HEADS, tl.CODEBOOK_SIZE)):
            r = measure(rows, width, args.top_k, args.top_p, args.iters, device)
            results.append(r)
            print(
                f"{rows:5d} x {width:6d}: filter vLLM {r['vllm_filter_ms']:.3f} ms, candidates "
                f"{r['candidates_filter_ms']:.3f} ms; with sampling {r['vllm_with_sampling_ms']:.3f} / "
                f"{r['candidates_with_sampling_ms']:.3f} ms; same kept logits: {r['same_kept_logits']}",
                flush=True,
            )
    report = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "iters": args.iters,
        "results": results,
    }
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "top-k.json").write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
