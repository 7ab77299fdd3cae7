"""Host cost of Stage 0's chunk producer: what the connector's save thread spends per step on N streams.

    python3 benchmarks/chunk_producer.py [--streams 256] [--steps 250]

vLLM-Omni calls ``parallel_async_chunk`` on Stage 0's save thread once per request per step, holding the GIL that
the engine's own step needs. This replays that call pattern (the per-request payload the runner hands over, a
growing token list, the shipped chunk policy) with stand-ins for the connector and the engine's request, and
reports microseconds per call and milliseconds per step; chunks are built but not sent.
"""

from __future__ import annotations

import argparse
import time
import types
from pathlib import Path

import numpy as np
import torch
import yaml
from vllm.v1.request import RequestStatus
from vllm_omni.data_entry_keys import unflatten_payload

from vllm_omni_kani.model_executor.models.kani_tts import token_layout as tl
from vllm_omni_kani.model_executor.stage_input_processors.kani_tts import parallel_async_chunk

SHIPPED = Path(__file__).resolve().parents[1] / "stage_configs" / "kani_tts.yaml"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", type=int, default=256)
    parser.add_argument("--steps", type=int, default=250)
    args = parser.parse_args()
    # The shipped chunk policy, as the connector hands it to the producer.
    extra = yaml.safe_load(SHIPPED.read_text())["connectors"]["shm"]["extra"]
    manager = types.SimpleNamespace(request_payload={}, connector=types.SimpleNamespace(config={"extra": extra}))
    requests = [
        types.SimpleNamespace(
            external_req_id=f"req-{i}", output_token_ids=[tl.START_OF_SPEECH], status=RequestStatus.RUNNING
        )
        for i in range(args.streams)
    ]
    rng = np.random.default_rng(0)
    cb1 = rng.integers(0, tl.CODEBOOK_SIZE, size=(args.steps, args.streams)).tolist()
    packed = tl.pack_codes(torch.from_numpy(rng.integers(0, tl.CODEBOOK_SIZE, size=(args.steps, args.streams, 3))))
    chunks, spent = 0, 0.0
    for step in range(args.steps):
        last = step == args.steps - 1
        for i, request in enumerate(requests):
            request.output_token_ids.append(tl.AUDIO_TOKEN_OFFSET + cb1[step][i])
            payload = {"codes.audio": packed[step, i : i + 1].clone()}  # as the runner's per-request CPU payload
            started = time.perf_counter()
            chunks += parallel_async_chunk(manager, unflatten_payload(payload), request, last) is not None
            spent += time.perf_counter() - started
    calls = args.steps * args.streams
    print(
        f"{args.streams} streams x {args.steps} steps: {1e6 * spent / calls:.1f} us per call, "
        f"{1e3 * spent / args.steps:.2f} ms per step, {chunks} chunks"
    )


if __name__ == "__main__":
    main()
