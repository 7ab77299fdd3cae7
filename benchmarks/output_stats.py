"""The orchestrator's per-output stats on Stage 0's step outputs: vLLM-Omni's own against
``patch.constant_time_output_stats``.

    PYTHONPATH=. python3 benchmarks/output_stats.py [--requests 256] [--steps 250] [--rounds 3] [--json OUT]

Served with ``async_chunk``, Stage 0 still sends the orchestrator (a thread of the API-server process) one output per
request per step, and vLLM-Omni's ``MultimodalOutputProcessor`` updates each request's stats for each of them. This
drives a real processor the same way: ``--requests`` requests decoding ``--steps`` tokens each, one batch of outputs
per step with an ``IterationStats`` as the orchestrator passes (Stage 0's requests ``FINAL_ONLY``, vLLM's variables
cached, as served), and reports microseconds per output for each side in
alternating rounds (the patch's methods swapped in and out), and whether both sides left every request the same
stats record (the mean inter-token latency within float rounding).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from pathlib import Path
from typing import Any

from vllm import SamplingParams, envs
from vllm.sampling_params import RequestOutputKind
from vllm.v1.engine import EngineCoreOutput, EngineCoreRequest, FinishReason
from vllm.v1.metrics.stats import IterationStats
from vllm_omni.outputs.output_processor import MultimodalOutputProcessor

from vllm_omni_kani import patch
from vllm_omni_kani.model_executor.models.kani_tts import token_layout as tl

PATCHED = ("_update_stats_from_output", "_native_text_metric_record")


def sides() -> dict[bool, dict[str, Any]]:
    """The processor's methods each way: ``{False: vLLM-Omni's, True: the patch's}`` (the patch is applied)."""
    if not patch.constant_time_output_stats():
        raise RuntimeError("constant_time_output_stats does not apply to this vLLM-Omni")
    theirs = {name: MultimodalOutputProcessor.__dict__[name] for name in PATCHED}
    return {False: {name: method.__wrapped__ for name, method in theirs.items()}, True: theirs}


def use(methods: dict[str, Any]) -> None:
    for name, method in methods.items():
        setattr(MultimodalOutputProcessor, name, method)


PROMPT = [tl.START_OF_HUMAN, *range(300, 330), tl.END_OF_TEXT, tl.END_OF_HUMAN]


def add_stage0_request(
    processor: MultimodalOutputProcessor,
    request_id: str,
    max_tokens: int,
    kind: RequestOutputKind = RequestOutputKind.FINAL_ONLY,
    external_id: str | None = None,
) -> None:
    """Register a Stage-0 request with a real processor as the orchestrator does (no detokenizing)."""
    params = SamplingParams(max_tokens=max_tokens, detokenize=False, output_kind=kind)
    request = EngineCoreRequest(
        request_id=request_id,
        prompt_token_ids=list(PROMPT),
        mm_features=None,
        sampling_params=params,
        pooling_params=None,
        arrival_time=time.time(),
        lora_request=None,
        cache_salt=None,
        data_parallel_rank=None,
        external_req_id=external_id or request_id,
    )
    processor.add_request(request, prompt=None)


def step_outputs(ids: list[str], step: int, steps: int, output_cls: type = EngineCoreOutput) -> list[Any]:
    """Step ``step`` of ``steps``: one audio token for each request, finished at the last step."""
    last = step == steps - 1
    return [
        output_cls(
            request_id=rid,
            new_token_ids=[tl.AUDIO_TOKEN_OFFSET + (step * 7 + i) % tl.CODEBOOK_SIZE],
            finish_reason=FinishReason.LENGTH if last else None,
        )
        for i, rid in enumerate(ids)
    ]


def served_processor(requests: int, steps: int) -> tuple[MultimodalOutputProcessor, list[str]]:
    """A real processor holding ``requests`` Stage-0 requests of ``steps`` tokens, as the API server's orchestrator
    holds them under async_chunk (``FINAL_ONLY``, stats on), and their engine request ids."""
    processor = MultimodalOutputProcessor(tokenizer=None, log_stats=True)
    ids = [f"speech-{i}-0123abcd" for i in range(requests)]
    # As the Kani adapter sends Stage 0's requests with async_chunk: only the final output is built.
    for i, rid in enumerate(ids):
        add_stage0_request(processor, rid, steps, external_id=f"speech-{i}")
    return processor, ids


def run(requests: int, steps: int) -> tuple[float, dict[str, dict[str, Any]]]:
    """Seconds per output over ``requests`` × ``steps`` outputs, and the stats record of every request."""
    processor, ids = served_processor(requests, steps)
    records = {}
    elapsed = 0.0
    for step in range(steps):
        last = step == steps - 1
        outputs = step_outputs(ids, step, steps)
        if last:  # the record is handed on and dropped when a request finishes: keep it for the comparison
            records = {
                f"speech-{i}": _copy(processor._native_text_metric_record(f"speech-{i}")) for i in range(requests)
            }
        start = time.perf_counter()
        processor.process_outputs(outputs, engine_core_timestamp=time.monotonic(), iteration_stats=IterationStats())
        elapsed += time.perf_counter() - start
    return elapsed / (requests * steps), records


def _copy(record: dict[str, Any]) -> dict[str, Any]:
    """A record as it stands now (its latency list is appended to in place)."""
    return {key: list(value) if isinstance(value, list) else value for key, value in record.items()}


def same_records(a: dict[str, dict[str, Any]], b: dict[str, dict[str, Any]]) -> bool:
    """Whether two runs left each request the same record shape, token count and latency counts, and means that are
    each the mean of their own latency list (the runs' timestamps differ)."""
    for rid, ra in a.items():
        rb = b[rid]
        if ra.keys() != rb.keys() or ra["num_generation_tokens"] != rb["num_generation_tokens"]:
            return False
        for record in (ra, rb):
            itls = record["vllm_itls_ms"]
            if len(itls) != len(ra["vllm_itls_ms"]) or not math.isclose(
                record["vllm_itl_ms"], statistics.fmean(itls) if itls else 0.0, rel_tol=1e-9, abs_tol=1e-9
            ):
                return False
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--steps", type=int, default=250)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    envs.enable_envs_cache()  # as a started server has them (vLLM caches its variables after start-up)
    methods = sides()
    times: dict[bool, list[float]] = {False: [], True: []}
    records: dict[bool, dict[str, dict[str, Any]]] = {}
    for _ in range(args.rounds):
        for patched in (False, True):
            use(methods[patched])
            seconds, records[patched] = run(args.requests, args.steps)
            times[patched].append(seconds * 1e6)
    use(methods[True])
    result = {
        "requests": args.requests,
        "steps": args.steps,
        "us_per_output": {"vllm-omni": times[False], "patched": times[True]},
        "same_records": same_records(records[False], records[True]),
    }
    for patched, label in ((False, "vllm-omni"), (True, "patched")):
        print(f"{label:>9}: {statistics.median(times[patched]):.1f} us per output (rounds {times[patched]})")
    print(f"same records: {result['same_records']}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
