"""Device time of Stage 0's top-k/top-p filter over codebook 1's rows: vLLM's function on whole rows, on the columns
the speech mask can leave open (``open_columns``), and ``torch.topk`` candidates (an alternative measured once).

    python3 benchmarks/bench_top_k.py [--rows 64 256] [--top-k 50] [--top-p 0.95] [--iters 200] [--out DIR]

Rows of the ``lm_head``'s 68,442 columns, either random (``dense``) or masked as Stage 0's ``compute_logits`` masks
them (``speech``: every column before START_OF_SPEECH ``-inf``, as served), and the code heads' rows (three per
request, 4,032 wide) for scale. Each way the filter alone, then the filter with the rest of vLLM's sampling (softmax
and the exponential race). Timed with CUDA events over ``--iters`` calls (on a CPU: the wall clock), every call from
a fresh copy of the same logits, the copy alone timed and subtracted. Also says, per shape, whether each way keeps
vLLM's whole-row logits. Writes ``top-k.json``.
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
from vllm_omni_kani.model_executor.models.kani_tts.speech_mask import Phase, SpeechMask


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


def filter_candidates(logits: torch.Tensor, k: torch.Tensor, p: torch.Tensor, bound: int) -> torch.Tensor:
    """Top-k as ``torch.topk`` of the batch's largest k, then top-p over those sorted candidates, masked in place."""
    values, index = logits.topk(bound, dim=-1)
    keep = torch.arange(bound, device=logits.device) < k.view(-1, 1)
    probs = values.masked_fill(~keep, float("-inf")).softmax(dim=-1)
    keep &= probs.cumsum(dim=-1).sub_(probs) < p.view(-1, 1)
    keep[:, 0] = True
    return logits.fill_(float("-inf")).scatter_(1, index, values.masked_fill_(~keep, float("-inf")))


def measure(rows: int, width: int, kind: str, top_k: int, top_p: float, iters: int, device: torch.device) -> dict:
    gen = torch.Generator(device="cpu").manual_seed(rows + width)
    source = torch.randn(rows, width, generator=gen).mul_(2)
    first_open = 0
    if kind == "speech":
        mask = SpeechMask(width, "parallel")
        source = mask.apply(source, torch.full((rows,), int(Phase.SPEECH_0)))
        first_open = mask.first_open
    source = source.to(device)
    work = torch.empty_like(source)
    k = torch.full((rows,), top_k, dtype=torch.int32, device=device)
    p = torch.full((rows,), top_p, device=device)

    def whole_rows() -> torch.Tensor:
        return ops.apply_top_k_top_p(work.copy_(source), k, p)

    def open_columns() -> torch.Tensor:
        work.copy_(source)
        ops.apply_top_k_top_p(work[:, first_open:], k, p)
        return work

    def candidates() -> torch.Tensor:
        return filter_candidates(work.copy_(source), k, p, top_k)

    ways = {"whole_rows": whole_rows, "candidates": candidates}
    if first_open:
        ways["open_columns"] = open_columns
    want = whole_rows().clone()
    result = {"rows": rows, "width": width, "logits": kind, "top_k": top_k, "top_p": top_p}
    result["copy_ms"] = copy_ms = _timed(lambda: work.copy_(source), iters, device)
    for name, fn in ways.items():
        result[f"{name}_same_as_whole_rows"] = bool(torch.equal(fn(), want))
        result[f"{name}_filter_ms"] = _timed(fn, iters, device) - copy_ms
        result[f"{name}_with_sampling_ms"] = _timed(lambda fn=fn: _sample(fn()), iters, device) - copy_ms
    if first_open:  # the sampling on the open columns too (softmax and race over 4,041 columns, not 68,442)
        result["open_columns_sampled_there_ms"] = (
            _timed(lambda: _sample(open_columns()[:, first_open:]) + first_open, iters, device) - copy_ms
        )
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
        shapes = [(requests, tl.PARALLEL_VOCAB_SIZE, "speech"), (requests, tl.PARALLEL_VOCAB_SIZE, "dense")]
        shapes.append((requests * NUM_CODE_HEADS, tl.CODEBOOK_SIZE, "dense"))
        for rows, width, kind in shapes:
            r = measure(rows, width, kind, args.top_k, args.top_p, args.iters, device)
            results.append(r)
            ways = [key.removesuffix("_filter_ms") for key in r if key.endswith("_filter_ms")]
            print(
                f"{rows:5d} x {width:6d} {kind:6s}: "
                + "; ".join(
                    f"{w} {r[w + '_filter_ms']:.3f} ms ({r[w + '_with_sampling_ms']:.3f} with sampling"
                    f"{'' if r[w + '_same_as_whole_rows'] else ', differs'})"
                    for w in ways
                ),
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
