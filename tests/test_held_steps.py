"""Stage 0's steps held on the main thread until a chunk is due (``KANI_HOLD_UNTIL_DUE``) send the same chunks.

A real sending ``OmniChunkTransferAdapter`` (its shared-memory connector, the real producer) is driven the way
vLLM-Omni's scheduler and save thread drive it, step by step: once with its own ``save_async`` and once held
(``kani_held_steps``). Every chunk must leave at the same step with the same frames, far fewer saves are queued, and no
held state outlives its request, aborted or not. The offline pipeline then speaks the same audio with the switch on.
"""

from __future__ import annotations

import logging
import uuid
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from vllm.v1.request import RequestStatus

from tests.conftest import speaks_the_same_with_switch
from vllm_omni_kani import envs
from vllm_omni_kani.model_executor.models.kani_tts import token_layout as tl
from vllm_omni_kani.model_executor.stage_input_processors import kani_held_steps

PRODUCERS = "vllm_omni_kani.model_executor.stage_input_processors.kani_tts"
PROMPT_TOKENS = 12
POLICIES = {
    "shipped ramp, stateful": {"initial_codec_chunk_frames": 3, "codec_chunk_frames": 16,
                               "max_codec_chunk_frames": 64, "codec_stateful_decode": True},
    "small chunks, windows": {"initial_codec_chunk_frames": 1, "codec_chunk_frames": 2, "max_codec_chunk_frames": 8,
                              "codec_left_context_frames": 4},
    "no ramp": {"initial_codec_chunk_frames": 5, "codec_chunk_frames": 5, "codec_stateful_decode": True},
}  # fmt: skip


class Request(SimpleNamespace):
    """The request attributes the adapter and the producer read."""

    def is_finished(self) -> bool:
        return RequestStatus.is_finished(self.status)


def sending_adapter(extra: dict, producer: str = "parallel_async_chunk"):
    """A real Stage-0 adapter whose save queue the test drains itself (its threads stopped)."""
    from vllm_omni.distributed.omni_connectors.transfer_adapter.chunk_transfer_adapter import OmniChunkTransferAdapter

    config = {"name": "SharedMemoryConnector", "extra": {"stage_id": 0, **extra}}
    model_config = SimpleNamespace(
        stage_connector_config=config, custom_process_next_stage_input_func=f"{PRODUCERS}.{producer}"
    )
    adapter = OmniChunkTransferAdapter(
        SimpleNamespace(model_config=model_config, scheduler_config=SimpleNamespace(max_num_seqs=8))
    )
    adapter.stop_event.set()
    for cond in (adapter._recv_cond, adapter._save_cond):
        with cond:
            cond.notify_all()
    adapter.save_thread.join()
    adapter.recv_thread.join()
    return adapter


def script(seed: int, n_requests: int) -> list[dict]:
    """Requests with staggered starts: SOA, SOS, then codes until END_OF_SPEECH or their length, some steps without a
    token (a prompt chunk: codes all NO_CODES), one preempted step now and then (vLLM-Omni drops it)."""
    rng = np.random.default_rng(seed)
    plans = []
    for i in range(n_requests):
        frames = int(rng.integers(1, 90))
        tokens = [tl.START_OF_AI, tl.START_OF_SPEECH]
        tokens += [tl.AUDIO_TOKEN_OFFSET + int(c) for c in rng.integers(0, tl.CODEBOOK_SIZE, frames)]
        if rng.random() < 0.5:
            tokens.append(tl.END_OF_SPEECH)
        rows = tl.pack_codes(torch.from_numpy(rng.integers(0, tl.CODEBOOK_SIZE, (len(tokens), 3)))).tolist()
        steps = []
        for token, row in zip(tokens, rows, strict=True):
            while rng.random() < 0.08:
                steps.append(("empty", None, tl.NO_CODES))
            if rng.random() < 0.03:
                steps.append(("preempted", None, tl.NO_CODES))
            steps.append(("token", token, row))
        plans.append({"start": int(rng.integers(0, 40)), "steps": steps, "id": f"req-{i}"})
    return plans


def run(adapter, save_async, plans: list[dict]) -> tuple[list, int]:
    """Drive the adapter through ``plans``, one scheduler step at a time, draining the save queue after each step as
    the save thread would. Returns every chunk as (step, request, chunk index, frames, finished) and the saves
    queued."""
    tag = uuid.uuid4().hex[:8]
    chunks, queued = [], 0
    requests = {
        p["id"]: Request(
            external_req_id=f"{p['id']}-{tag}", request_id=p["id"], output_token_ids=[], resumable=False,
            status=RequestStatus.RUNNING, num_computed_tokens=PROMPT_TOKENS, num_output_placeholders=0,
        )
        for p in plans
    }  # fmt: skip
    sent = dict.fromkeys(requests, 0)
    for step in range(max(p["start"] + len(p["steps"]) for p in plans)):
        for plan in plans:
            k = step - plan["start"]
            if not 0 <= k < len(plan["steps"]):
                continue
            request = requests[plan["id"]]
            kind, token, row = plan["steps"][k]
            confirmed = request.num_computed_tokens
            if kind == "token":
                request.output_token_ids.append(token)
                request.num_computed_tokens += 1
                if token == tl.END_OF_SPEECH or k == len(plan["steps"]) - 1:
                    request.status = RequestStatus.FINISHED_STOPPED
            elif kind == "preempted":
                request.num_computed_tokens = 0  # recomputing: below the adapter's watermark
            save_async(adapter, {"codes.audio": torch.tensor([row])}, request, False)
            if kind == "preempted":
                request.num_computed_tokens = confirmed
        while adapter._pending_save_reqs:
            queued += 1
            adapter._send_single_request(adapter._pending_save_reqs.popleft())
        for rid, request in requests.items():
            while sent[rid] < adapter.put_req_chunk.get(request.external_req_id, sent[rid]):
                payload, _ = adapter.connector.get("0", "1", f"{request.external_req_id}_0_{sent[rid]}")
                codes = payload.get("codes") or {}
                window = codes.get("audio")
                frames = None if window is None else np.asarray(window).tolist()
                chunks.append((step, rid, sent[rid], frames, bool(np.asarray(payload["meta"]["finished"]))))
                sent[rid] += 1
    return chunks, queued


@pytest.mark.parametrize("policy", list(POLICIES))
def test_held_steps_send_the_same_chunks_at_the_same_steps(policy, caplog):
    plans = script(seed=len(policy), n_requests=12)
    plain = sending_adapter(POLICIES[policy])
    held = sending_adapter(POLICIES[policy])
    held_save = kani_held_steps.hold_until_due(type(held).save_async)
    try:
        with caplog.at_level(logging.WARNING):
            expected, plain_saves = run(plain, type(plain).save_async, plans)
            chunks, held_saves = run(held, held_save, plans)
        assert chunks == expected
        assert len(expected) > 2 * len(plans)
        assert sum(chunk[3] is not None and len(chunk[3]) > 0 for chunk in expected) > len(plans)
        # One save per chunk or end; the preempted steps go to vLLM-Omni, which drops them on both sides.
        preempted = sum(kind == "preempted" for p in plans for kind, _, _ in p["steps"])
        assert held_saves <= len(expected) + preempted < plain_saves / 3
        assert held.__dict__["_kani_held_steps"] == {}
        assert not [r for r in caplog.records if "code rows" in r.getMessage()]  # the producer's pairing check
    finally:
        plain.shutdown()
        held.shutdown()


def test_an_aborted_requests_held_steps_go_with_it():
    """Over 2,000 requests that finish or are aborted mid-stream, no held state is left."""
    adapter = sending_adapter(POLICIES["shipped ramp, stateful"])
    save = kani_held_steps.hold_until_due(type(adapter).save_async)
    finish = kani_held_steps.drop_on_finish(type(adapter).finish_requests)
    rng = np.random.default_rng(1)
    try:
        peak = 0
        for i in range(2000):
            request = Request(
                external_req_id=f"abort-{i}", request_id=f"abort-{i}", output_token_ids=[], resumable=False,
                status=RequestStatus.RUNNING, num_computed_tokens=PROMPT_TOKENS, num_output_placeholders=0,
            )  # fmt: skip
            steps, abort = int(rng.integers(1, 12)), rng.random() < 0.5
            for k in range(steps):
                request.output_token_ids.append(tl.START_OF_SPEECH if k == 0 else tl.AUDIO_TOKEN_OFFSET + k)
                request.num_computed_tokens += 1
                if not abort and k == steps - 1:
                    request.status = RequestStatus.FINISHED_LENGTH_CAPPED
                save(adapter, {"codes.audio": torch.tensor([k])}, request, False)
            peak = max(peak, len(adapter.__dict__["_kani_held_steps"]))
            if abort:
                request.status = RequestStatus.FINISHED_ABORTED
                finish(adapter, [request.request_id], RequestStatus.FINISHED_ABORTED, {request.request_id: request})
            while adapter._pending_save_reqs:
                adapter._send_single_request(adapter._pending_save_reqs.popleft())
        assert peak == 1
        assert adapter.__dict__["_kani_held_steps"] == {}
    finally:
        adapter.shutdown()


def test_another_producers_stage_is_not_held():
    """The flattened producer's stage (and any other) gets vLLM-Omni's save for every step."""
    adapter = sending_adapter(POLICIES["no ramp"], producer="flattened_async_chunk")
    save = kani_held_steps.hold_until_due(type(adapter).save_async)
    request = Request(
        external_req_id="flat-0", request_id="flat-0", output_token_ids=[], resumable=False,
        status=RequestStatus.RUNNING, num_computed_tokens=PROMPT_TOKENS, num_output_placeholders=0,
    )  # fmt: skip
    try:
        for k in range(6):
            request.output_token_ids.append(tl.flat_token(k, k % tl.NUM_CODEBOOKS))
            request.num_computed_tokens += 1
            save(adapter, None, request, False)
        assert len(adapter._pending_save_reqs) == 6
        assert "_kani_held_steps" not in adapter.__dict__
    finally:
        adapter.shutdown()


def test_the_offline_pipeline_speaks_the_same_with_steps_held(tiny_parallel, tmp_path):
    """The offline pipeline, greedy, with ``KANI_HOLD_UNTIL_DUE`` on and off: the same audio (within one PCM16 step),
    and the run with it on says its Stage 0 held the steps."""
    speaks_the_same_with_switch(
        tiny_parallel, tmp_path, envs.KANI_HOLD_UNTIL_DUE, "steps held on the main thread until a chunk is due"
    )
