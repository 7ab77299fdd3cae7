"""Stage-0 decode step time at batch sizes 1…256, and greedy codes for precision agreement.

``python -m vllm_omni_kani.benchmarks.step_time --engine {vllm,omni} CKPT --out DIR --label NAME``

* ``vllm``: plain vLLM ``LLM`` on a flattened checkpoint, i.e. stock ``Lfm2ForCausalLM`` with no heads and no
  grammar mask: the price of the backbone alone.
* ``omni``: the checkpoint through vLLM-Omni's engine with our LM-only pipeline (Stage 0 alone, from
  ``benchmarks/configs/kani_tts_lm.yaml``): for a parallel-head checkpoint the step includes the grammar mask,
  the three code heads, their sampling and the per-step code payload.

A step is timed as the difference of two runs of the same batch that differ only in the number of decode steps
(``min_tokens = max_tokens``, so nothing stops early): ``(t(long) - t(short)) / (long - short)``. Prefill,
scheduling of new requests and output collection cancel out. ``--codes`` also records greedy frames of fixed
prompts, which ``--compare`` turns into code agreement between two runs (bf16 vs fp8, or vs a W4A16
checkpoint of ``tools/quantize_w4a16.py``, whose quantization vLLM reads from its ``config.json``).

``--torch-profile DIR`` then runs ``PROFILE_STEPS`` decode steps of the largest batch (or ``--profile-batch``),
greedy (and sampled with ``--sampled``), under vLLM's torch profiler in the engine's worker (Stage 0's for
``omni``): its tables of kernels and ops by self device time (self CPU time on a CPU) go to
``OUT/LABEL-profile/{greedy,sampled}/``, the traces to DIR.
What the sampled step adds over the greedy one, and what ours adds over stock, is then read per kernel.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from vllm_omni_kani.benchmarks import report
from vllm_omni_kani.model_executor.models.kani_tts import token_layout as tl

REPO_ROOT = Path(__file__).resolve().parents[2]
LM_ONLY_YAML = REPO_ROOT / "benchmarks" / "configs" / "kani_tts_lm.yaml"
PROMPT_TEXT_TOKENS = 24  # a short sentence; prefill is excluded from the step time anyway
SHORT_STEPS, LONG_STEPS = 16, 112
CODES_PROMPTS, CODES_FRAMES = 32, 64
SOAK_STEPS = 900  # within the 1,024-token model length with the prompt
PROFILE_STEPS = 48  # decode steps per profiled run (one prefill among them)

Generate = Callable[[list[list[int]], Any], list[Any]]
Profile = Callable[[bool], None]  # start (True) or stop (False) the worker's profiler


def prompts(batch: int, offset: int = 0) -> list[list[int]]:
    """Distinct prompts (no shared prefix beyond the layout's control tokens)."""
    starts = [300 + 97 * (i + offset) % (tl.TOKENISER_LENGTH - 1000) for i in range(batch)]
    return [tl.build_prompt([tl.START_OF_TEXT, *range(s, s + PROMPT_TEXT_TOKENS)]) for s in starts]


def derived_yaml(base: Path, stage0: dict[str, Any], top: dict[str, Any] | None = None) -> Path:
    """``base`` with Stage 0's fields and top-level keys updated (written to a temporary file)."""
    config = yaml.safe_load(base.read_text())
    config.update(top or {})
    config["stages"][0].update(stage0)
    tmp = Path(tempfile.mkdtemp(prefix="kani-bench-")) / base.name
    tmp.write_text(yaml.safe_dump(config, sort_keys=False))
    return tmp


def profiler_config(trace_dir: str | None) -> dict[str, Any] | None:
    """vLLM's torch profiler in the worker, writing to ``trace_dir`` (no Python stacks: they distort host time)."""
    if not trace_dir:
        return None
    return {
        "profiler": "torch",
        "torch_profiler_dir": str(trace_dir),
        "torch_profiler_with_stack": False,
        "torch_profiler_use_gzip": False,  # gzipping a 48-step trace of batch 256 takes longer than the steps
    }


def make_engine(args: argparse.Namespace) -> tuple[Generate, Callable[[], None], Profile]:
    """``(generate(prompts, params) -> outputs in prompt order, close(), profile(start))`` for the chosen engine."""
    max_seqs = max([*args.batches, CODES_PROMPTS])
    profiling = profiler_config(args.torch_profile)
    if args.engine == "vllm":
        from vllm import LLM

        llm = LLM(
            model=args.ckpt,
            max_num_seqs=max_seqs,
            max_model_len=1024,
            max_num_batched_tokens=8192,
            kv_cache_memory_bytes=args.kv_bytes,
            gpu_memory_utilization=0.1,
            enable_prefix_caching=False,
            quantization=args.quantization,
            dtype=args.dtype,
            enforce_eager=args.enforce_eager,
            async_scheduling=args.async_scheduling or None,
            seed=0,
            **({"profiler_config": profiling} if profiling else {}),
        )

        def generate_vllm(ps: list[list[int]], sp: Any) -> list[Any]:
            return llm.generate([{"prompt_token_ids": p} for p in ps], sp, use_tqdm=False)

        def profile_vllm(start: bool) -> None:
            llm.start_profile() if start else llm.stop_profile()

        return generate_vllm, lambda: None, profile_vllm

    import vllm_omni_kani

    vllm_omni_kani.register()  # offline: vLLM-Omni resolves the pipeline before it loads plugins
    from vllm_omni.entrypoints.omni import Omni

    stage0: dict[str, Any] = {"max_num_seqs": max_seqs, "kv_cache_memory_bytes": args.kv_bytes}
    if args.quantization:
        stage0["quantization"] = args.quantization
    if args.dtype != "auto":
        stage0["dtype"] = args.dtype
    if args.enforce_eager:
        stage0["enforce_eager"] = True
    if args.async_scheduling:
        stage0["async_scheduling"] = True
    if profiling:
        stage0["profiler_config"] = profiling
    top: dict[str, Any] = {}
    if args.async_output:
        # vLLM-Omni's deferred output building: the model's switch, plus the served pipeline's conditions for it
        # (async scheduling on Stage 0, and async_chunk, which a lone stage never uses to send anything).
        stage0["async_scheduling"] = True
        stage0["additional_config"] = {"kani_async_omni_output": True}
        top["async_chunk"] = True
    omni = Omni(model=args.ckpt, deploy_config=str(derived_yaml(Path(args.deploy_config), stage0, top)))

    def generate(ps: list[list[int]], params: Any) -> list[Any]:
        outs = omni.generate([{"prompt_token_ids": p} for p in ps], [params])
        return sorted(outs, key=lambda o: int(str(o.request_id).split("_")[0]))

    def profile(start: bool) -> None:
        omni.start_profile(stages=[0]) if start else omni.stop_profile(stages=[0])

    return generate, omni.close, profile


def params(steps: int, greedy: bool) -> Any:
    from vllm import SamplingParams

    sampling = {"temperature": 0.0} if greedy else {"temperature": 0.6, "top_p": 0.95, "repetition_penalty": 1.1}
    return SamplingParams(max_tokens=steps, min_tokens=steps, ignore_eos=True, detokenize=False, seed=0, **sampling)


def step_times(generate: Callable[..., list[Any]], batches: list[int], greedy: bool, log: Any) -> dict[str, float]:
    out = {}
    for b in batches:
        ps = prompts(b)
        generate(ps, params(SHORT_STEPS, greedy))  # warm-up of this batch size
        started = time.perf_counter()
        generate(ps, params(SHORT_STEPS, greedy))
        short = time.perf_counter() - started
        started = time.perf_counter()
        generate(ps, params(LONG_STEPS, greedy))
        long = time.perf_counter() - started
        out[str(b)] = (long - short) / (LONG_STEPS - SHORT_STEPS) * 1000.0
        log(f"batch {b:>4}: {out[str(b)]:.2f} ms/step ({'greedy' if greedy else 'sampled'})")
    return out


def soak(generate: Callable[..., list[Any]], batch: int, seconds: float, log: Any, greedy: bool = True) -> None:
    """Decode ``batch`` streams, run after run, for ``seconds``: a steady window for a profiler."""
    log(f"soak: start, batch {batch}, {seconds:.0f} s, {'greedy' if greedy else 'sampled'}", flush=True)
    ends = time.perf_counter() + seconds
    while time.perf_counter() < ends:
        generate(prompts(batch), params(SOAK_STEPS, greedy=greedy))
    log("soak: end", flush=True)


def profile_steps(
    generate: Generate, profile: Profile, batch: int, modes: list[str], trace_dir: Path, dest: Path, log: Any
) -> None:
    """``PROFILE_STEPS`` decode steps of ``batch`` streams per mode under the profiler; its tables go to ``dest``."""
    for mode in modes:
        ps = prompts(batch)
        generate(ps, params(SHORT_STEPS, mode == "greedy"))  # this shape's warm-up, outside the window
        before = {table: table.stat().st_mtime_ns for table in trace_dir.rglob("*.txt")}
        profile(True)
        generate(ps, params(PROFILE_STEPS, mode == "greedy"))
        profile(False)
        # vLLM's profiler rewrites one table per run, vLLM-Omni's writes a new one: take what is new or rewritten.
        tables = sorted(t for t in trace_dir.rglob("*.txt") if before.get(t) != t.stat().st_mtime_ns)
        (dest / mode).mkdir(parents=True, exist_ok=True)
        for table in tables:
            shutil.copy(table, dest / mode / table.name)
        log(f"profile {mode}, batch {batch}: {len(tables)} table(s) -> {dest / mode}", flush=True)


def greedy_frames(generate: Callable[..., list[Any]], alone: bool = False) -> list[list[list[int]]]:
    """``CODES_FRAMES`` greedy frames of ``CODES_PROMPTS`` fixed prompts, decoded as one batch, or one prompt at a time
    with ``alone``. A batch's rows are not batch-invariant (how the engine happens to split its admission and which
    rows are still running pick the GEMM shapes): on an H200 a compile and a load of one graph agreed on 88.5% of a
    batch's codes (docs/BENCHMARKS.md, forty-sixth set). Alone, every step has one row, as the served e2e check's
    requests do, so only the kernels themselves can make two runs differ."""
    from vllm import SamplingParams

    from vllm_omni_kani.model_executor.stage_input_processors.kani_chunks import frames_from_parallel_output

    sp = SamplingParams(max_tokens=CODES_FRAMES, temperature=0.0, detokenize=False, stop_token_ids=[tl.END_OF_SPEECH])
    batch = prompts(CODES_PROMPTS, offset=500)
    outs = [out for p in batch for out in generate([p], sp)] if alone else generate(batch, sp)
    frames = []
    for out in outs:
        packed = np.asarray(out.multimodal_output["codes"]["audio"])
        token_ids = list(out.request_output.outputs[0].token_ids)
        frames.append(frames_from_parallel_output(token_ids, packed).tolist())
    return frames


def agreement(a: list[list[list[int]]], b: list[list[list[int]]]) -> dict[str, float]:
    """Greedy code agreement: first frame (same input: pure numerics), every position, identical prefix length."""
    first, cells, equal, prefix = [], 0, 0, []
    for fa, fb in zip(a, b, strict=True):
        x, y = np.asarray(fa).reshape(-1, tl.NUM_CODEBOOKS), np.asarray(fb).reshape(-1, tl.NUM_CODEBOOKS)
        n = min(len(x), len(y))
        if n == 0:
            continue
        same = (x[:n] == y[:n]).all(axis=1)
        first.append(float((x[0] == y[0]).mean()))
        cells += n * tl.NUM_CODEBOOKS
        equal += int((x[:n] == y[:n]).sum())
        prefix.append(int(n if same.all() else np.argmin(same)))
    return {
        "prompts": len(first),
        "first_frame_code_agreement": float(np.mean(first)) if first else 0.0,
        "all_code_agreement": equal / cells if cells else 0.0,
        "identical_prefix_frames_mean": float(np.mean(prefix)) if prefix else 0.0,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("ckpt", nargs="?")
    parser.add_argument("--engine", choices=("vllm", "omni"), default="omni")
    parser.add_argument("--label", default="")
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--batches", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8, 32, 64, 128, 256])
    parser.add_argument(
        "--quantization",
        default=None,
        help="e.g. fp8 (Stage 0 weights); a compressed-tensors checkpoint (W4A16) needs none: vLLM reads config.json",
    )
    parser.add_argument("--dtype", default="auto", help="Stage 0 dtype (CPU W4A16 kernels take bfloat16 only)")
    parser.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs, no torch.compile")
    parser.add_argument("--deploy-config", default=str(LM_ONLY_YAML), help="omni engine: LM-only deploy YAML")
    parser.add_argument(
        "--async-output",
        action="store_true",
        help="omni engine: async scheduling and vLLM-Omni's deferred output building (GPU; synchronous on CPU)",
    )
    parser.add_argument(
        "--async-scheduling",
        action="store_true",
        help="async scheduling on (as Stage 0 is served): the next step's host work overlaps this step's forward",
    )
    parser.add_argument("--kv-bytes", type=int, default=4 << 30)
    parser.add_argument("--sampled", action="store_true", help="also time the serving default sampling")
    parser.add_argument("--codes", action="store_true", help="record greedy frames (omni engine, parallel heads)")
    parser.add_argument(
        "--codes-alone", action="store_true", help="--codes with each prompt decoded alone (batch 1): batch-invariant"
    )
    parser.add_argument(
        "--soak-seconds",
        type=float,
        default=0.0,
        help="after timing, decode the largest batch for this long (logs 'soak: start' / 'soak: end') for a profiler",
    )
    parser.add_argument(
        "--soak-batches",
        type=lambda s: [int(x) for x in s.split(",")],
        default=None,
        help="soak each of these batches in turn (default: the largest of --batches); with KANI_SAMPLER_AB_PERIOD_S "
        "the step meter's A/B windows of each are read by benchmarks/ab_windows.py",
    )
    parser.add_argument("--soak-sampled", action="store_true", help="soak with the serving default sampling")
    parser.add_argument(
        "--torch-profile",
        metavar="DIR",
        default="",
        help=f"after timing, profile {PROFILE_STEPS} steps of the largest batch (traces in DIR, tables in OUT)",
    )
    parser.add_argument("--profile-batch", type=int, default=0, help="profile this batch instead of the largest")
    parser.add_argument("--compare", nargs=2, metavar=("A_JSON", "B_JSON"), help="code agreement of two runs")
    args = parser.parse_args(argv)
    out = Path(args.out)
    if args.compare:
        a, b = (json.loads(Path(p).read_text()) for p in args.compare)
        row = {"a": a["label"], "b": b["label"], **agreement(a["codes"], b["codes"])}
        label = args.label or f"agreement-{a['label']}-{b['label']}"
        path = report.write_result(out, label, {"kind": "agreement", "label": label, "rows": [row]})
        print(json.dumps(row), f"-> {path}")
        return 0
    label = args.label or args.engine
    generate, close, profile = make_engine(args)
    started = time.perf_counter()
    result: dict[str, Any] = {
        "kind": "step",
        "label": label,
        "engine": args.engine
        + (f" {args.quantization}" if args.quantization else "")
        + (" async-output" if args.async_output else "")
        + (" async-scheduling" if args.async_scheduling else ""),
        "meta": report.environment(),
        "ckpt": args.ckpt,
        "step_ms": step_times(generate, args.batches, greedy=True, log=print),
    }
    if args.sampled:
        result["step_ms_sampled"] = step_times(generate, args.batches, greedy=False, log=print)
    if args.codes or args.codes_alone:
        result["codes"] = greedy_frames(generate, alone=args.codes_alone)
        result["codes_alone"] = args.codes_alone
    if args.soak_seconds > 0:
        for batch in args.soak_batches or [max(args.batches)]:
            soak(generate, batch, args.soak_seconds, print, greedy=not args.soak_sampled)
    if args.torch_profile:
        dest = out / f"{label}-profile"
        modes = ["greedy", "sampled"] if args.sampled else ["greedy"]
        batch = args.profile_batch or max(args.batches)
        profile_steps(generate, profile, batch, modes, Path(args.torch_profile), dest, print)
        result["profile_tables"] = str(dest)
    result["bench_s"] = time.perf_counter() - started
    path = report.write_result(out, label, result)
    print(f"wrote {path}", flush=True)
    close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
