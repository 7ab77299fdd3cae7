"""What one streamed, seeded Kani request's sampling parameters cost the API server to copy, before and after
``kani_submit``.

    python3 benchmarks/sampling_copies.py [--requests 20000] [--json OUT]

Both sides run the real vLLM and vLLM-Omni calls on the shipped file's defaults (Stage 0 from a Kani checkpoint's
generation config, Stage 1 from ``default_sampling_params``), in this process, one request after another:

- ``generic``: vLLM-Omni's path as Kani requests took it before ``kani_submit``: ``coerce_param_message_types`` to
  the streaming kind, the adapter's ``clone`` of Stage 0, the seed's ``copy.deepcopy`` of the list, and the
  orchestrator's ``clone`` of Stage 0 when it builds the engine request;
- ``kani_submit``: ``stage_params`` to the streaming kind, the adapter's ``own_copy``, the seed set, and the same
  orchestrator ``clone`` (shallow now: the copy is marked ``skip_clone``).

Prints microseconds a request for each (the median of five timed rounds); a speech request's whole preparation on an
H200 host's event loop is ~0.7 ms (fifty-sixth set), so this is the part of it the change removes.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
from pathlib import Path

from vllm.sampling_params import SamplingParams
from vllm_omni.entrypoints.utils import coerce_param_message_types

from vllm_omni_kani.entrypoints.openai.kani_submit import own_copy, stage_params
from vllm_omni_kani.model_executor.models.kani_tts import token_layout as tl

SEED = 1234


def defaults() -> list[SamplingParams]:
    """The stages' shared defaults as a served Kani checkpoint has them."""
    stage0 = SamplingParams(temperature=0.6, top_p=0.95, repetition_penalty=1.1, stop_token_ids=[tl.END_OF_SPEECH])
    return [stage0, SamplingParams(temperature=0.0, max_tokens=65536)]


def adapter_fields(stage0: SamplingParams) -> None:
    """The fields ``KaniTTSAdapter.build`` sets on its Stage-0 copy."""
    stage0.temperature, stage0.top_p, stage0.top_k = 0.6, 0.95, -1
    stage0.repetition_penalty, stage0.max_tokens = 1.1, 1200
    stage0.stop_token_ids = [tl.END_OF_SPEECH]


def generic(shared: list[SamplingParams]) -> SamplingParams:
    params = coerce_param_message_types(list(shared), True)
    params[0] = params[0].clone()
    adapter_fields(params[0])
    params = copy.deepcopy(params)
    params[0].seed = SEED
    return params[0].clone()


def kani(shared: list[SamplingParams]) -> SamplingParams:
    params = stage_params(shared, True)
    params[0] = own_copy(params[0])
    adapter_fields(params[0])
    params[0].seed = SEED
    return params[0].clone()


def per_request_us(way, shared: list[SamplingParams], requests: int) -> float:
    start = time.perf_counter()
    for _ in range(requests):
        way(shared)
    return (time.perf_counter() - start) / requests * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    shared = defaults()
    before = [(p.output_kind, p.seed, p.skip_clone) for p in shared]
    assert generic(shared).seed == kani(shared).seed == SEED
    rounds = {name: [] for name in ("generic", "kani_submit")}
    for _ in range(5):
        rounds["generic"].append(per_request_us(generic, shared, args.requests))
        rounds["kani_submit"].append(per_request_us(kani, shared, args.requests))
    assert [(p.output_kind, p.seed, p.skip_clone) for p in shared] == before, "a shared default was changed"
    result = {name: round(statistics.median(times), 2) for name, times in rounds.items()}
    result["rounds_us"] = {name: [round(t, 2) for t in times] for name, times in rounds.items()}
    print(json.dumps(result, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
