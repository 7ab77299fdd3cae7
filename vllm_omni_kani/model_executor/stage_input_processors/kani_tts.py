"""Stage 0 → Stage 1 for Kani TTS: vLLM-Omni's producer and consumer hooks.

``*_async_chunk`` run in Stage 0's engine process on the connector's save thread, once per
step that produced output for a request; they return the next ``[left context | new frames]``
window when one is due. ``*_sync_inputs`` build the whole Stage-1 input at once when
``async_chunk`` is off. The frame and chunk rules themselves are in ``kani_chunks.py``.

Per-request state is keyed by the request's external id in the connector's
``request_payload`` and removed when the request's last chunk is sent, or by a periodic sweep
when the request was aborted (vLLM-Omni does not call the producer for aborted requests).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from vllm.v1.request import RequestStatus
from vllm_omni.data_entry_keys import CodesStruct, MetaStruct, OmniPayloadStruct
from vllm_omni.inputs.data import OmniTokensPrompt

from vllm_omni_kani.envs import trace_chunks
from vllm_omni_kani.model_executor.models.kani_tts import token_layout as tl
from vllm_omni_kani.model_executor.stage_input_processors.kani_chunks import (
    Chunk,
    ChunkPolicy,
    FrameStream,
    frames_from_parallel_output,
)

logger = logging.getLogger(__name__)

_STATE_KEY = "kani_tts"
# Sweep aborted requests' state once every this many producer calls at least, and never more often than once per
# held state: a sweep walks every state, so at 256 streams a sweep every 64 calls cost 4 checks per call (11% of the
# connector thread's GIL time, served profile, docs/BENCHMARKS.md); this way it is amortised O(1) per call.
_SWEEP_EVERY = 64
_since_sweep = 0
# Finish states after which vLLM-Omni makes no terminal producer call, so only the sweep can free the state.
_ENDED_WITHOUT_TERMINAL_CALL = frozenset(
    {RequestStatus.FINISHED_ABORTED, RequestStatus.FINISHED_ERROR, RequestStatus.FINISHED_IGNORED}
)
_TRACE = trace_chunks()
# With paced chunks on, how often a line says how many chunks went out paced (what the lead did under load).
_PACED_LOG_S = 10.0


class _PacedMeter:
    """Counts a stage's chunks and its paced ones, logged every ``_PACED_LOG_S`` while chunks go out."""

    def __init__(self) -> None:
        self.chunks = self.paced = 0
        self.since = time.monotonic()

    def note(self, chunk: Chunk, lead_s: float, now: float) -> None:
        self.chunks += 1
        self.paced += chunk.paced
        if now - self.since >= _PACED_LOG_S:
            logger.info(
                "kani chunks: %d of %d in the last %.1f s went out paced (a listener within %.0f ms of running out)",
                self.paced,
                self.chunks,
                now - self.since,
                lead_s * 1000,
            )
            self.chunks = self.paced = 0
            self.since = now


_paced_meter = _PacedMeter()


def _connector_extra(transfer_manager: Any) -> Mapping[str, Any]:
    config = getattr(getattr(transfer_manager, "connector", None), "config", None) or {}
    extra = config.get("extra", config) if isinstance(config, Mapping) else {}
    return extra if isinstance(extra, Mapping) else {}


def _step_codes(multimodal_output: Mapping[str, Any] | None) -> list[int] | None:
    """This step's packed codes of one request (a CPU tensor from the runner) as plain ints."""
    codes = (multimodal_output or {}).get(tl.CODES_KEY[0])
    rows = codes.get(tl.CODES_KEY[1]) if isinstance(codes, Mapping) else None
    if rows is None:
        return None
    values = rows.tolist() if isinstance(rows, torch.Tensor) else np.asarray(rows).tolist()
    return values if isinstance(values, list) else [values]


def _sweep_aborted(payloads: dict[str, Any], keep: str) -> None:
    """Drop the state of requests that ended without a terminal producer call (aborted, errored).

    A request that finished normally still has its terminal call queued (the save thread may run behind the
    engine), and the connector drops its state after that call; sweeping it here would lose its last frames.
    """
    for ext_id in [k for k, v in payloads.items() if k != keep and isinstance(v, dict) and _STATE_KEY in v]:
        request = payloads[ext_id].get("request")
        if request is not None and request.status in _ENDED_WITHOUT_TERMINAL_CALL:
            payloads.pop(ext_id, None)


def _payload(chunk: Chunk, ext_id: str) -> OmniPayloadStruct:
    finished = torch.tensor(chunk.finished, dtype=torch.bool)
    # A 2-D codes tensor rides the payload channel into the Stage-1 model's
    # runtime_additional_information (a 1-D one would become its prompt token ids).
    return OmniPayloadStruct(
        codes=CodesStruct(audio=torch.from_numpy(chunk.window)),
        meta=MetaStruct(
            finished=finished,
            # meta.finished is consumed by the connector; stream_finished reaches the model.
            stream_finished=finished,
            left_context_size=chunk.left_context,
            # Lets a stateful codec check that a stream's chunks arrive whole and in order.
            chunk_seq=chunk.index,
            req_id=[ext_id],
        ),
    )


def _async_chunk(
    variant: str,
    transfer_manager: Any,
    multimodal_output: Mapping[str, Any] | None,
    request: Any,
    is_finished: bool,
) -> OmniPayloadStruct | None:
    ext_id = request.external_req_id
    payloads: dict[str, Any] = transfer_manager.request_payload
    global _since_sweep
    _since_sweep += 1
    if _since_sweep >= max(_SWEEP_EVERY, len(payloads)):
        _since_sweep = 0
        _sweep_aborted(payloads, keep=ext_id)
    entry = payloads.setdefault(ext_id, {})
    if _STATE_KEY not in entry:
        entry[_STATE_KEY] = FrameStream(variant)
        entry["request"] = request
        entry["policy"] = ChunkPolicy.from_extra(_connector_extra(transfer_manager))
    stream: FrameStream = entry[_STATE_KEY]
    if variant == "parallel":
        stream.add_step_codes(_step_codes(multimodal_output))
    # The live list, not a copy: it only grows, and add_tokens reads no further than the codes that arrived.
    stream.add_tokens(request.output_token_ids)
    # Only the flag captured with this step: the save thread may run behind the engine, and a live
    # request.is_finished() would close the stream before the codes of the last steps have arrived.
    finished = bool(is_finished)
    policy: ChunkPolicy = entry["policy"]
    now = time.monotonic()
    chunk = stream.next_chunk(policy, finished, now)
    if finished and (gap := stream.unpaired_rows(request.output_token_ids)):
        # Each kept step brings one token and one code row; a mismatch means a step's payload and its token parted.
        logger.warning(
            "request %s finished with %d output tokens and %d code rows: %d frame(s) %s",
            ext_id,
            len(request.output_token_ids),
            len(stream.code_rows),
            abs(gap),
            "without their codebooks 2-4 were dropped" if gap < 0 else "of codes had no kept token",
        )
    if finished and stream.variant == "flattened" and (stream.assembler.pending or stream.assembler.invalid):
        logger.warning(
            "request %s: dropped %d codes of an incomplete last frame and %d out-of-order codes",
            ext_id,
            stream.assembler.pending,
            stream.assembler.invalid,
        )
    if chunk is None:
        # Nothing new: the connector still sends its own terminal marker on finish.
        return None
    if policy.lead_s is not None:
        _paced_meter.note(chunk, policy.lead_s, now)
    if _TRACE:
        logger.info(
            "kani trace: stage0 emit req=%s chunk=%d left=%d new=%d finished=%s paced=%s frames_so_far=%d wall=%.6f",
            ext_id,
            stream.chunks - 1,
            chunk.left_context,
            chunk.new_frames,
            chunk.finished,
            chunk.paced,
            len(stream.frames),
            time.time(),
        )
    return _payload(chunk, ext_id)


def parallel_async_chunk(
    transfer_manager: Any, multimodal_output: Mapping[str, Any] | None, request: Any, is_finished: bool = False
) -> OmniPayloadStruct | None:
    """Producer for parallel-head Stage 0: cb1 from the token stream, cb2-4 from ``codes.audio``."""
    return _async_chunk("parallel", transfer_manager, multimodal_output, request, is_finished)


def flattened_async_chunk(
    transfer_manager: Any, multimodal_output: Mapping[str, Any] | None, request: Any, is_finished: bool = False
) -> OmniPayloadStruct | None:
    """Producer for flattened Stage 0: four tokens per frame from the token stream."""
    return _async_chunk("flattened", transfer_manager, multimodal_output, request, is_finished)


def _whole_request_prompt(frames: np.ndarray, request_id: str) -> OmniTokensPrompt:
    window = torch.from_numpy(np.ascontiguousarray(frames, dtype=np.int64)).reshape(-1, tl.NUM_CODEBOOKS)
    return OmniTokensPrompt(
        prompt_token_ids=[0],
        additional_information={
            "codes": {"audio": window},
            "meta": {"left_context_size": 0, "stream_finished": True, "req_id": [request_id]},
        },
    )


def parallel_sync_inputs(source_outputs: list[Any], prompt: Any = None, requires_multimodal_data: bool = False):
    """Consumer for ``async_chunk: false``: every frame of each finished request at once."""
    prompts = []
    for out in source_outputs:
        completion = out.outputs[0]
        codes = (completion.multimodal_output or {}).get("codes.audio")
        if codes is None:
            codes = ((completion.multimodal_output or {}).get("codes") or {}).get("audio")
        packed = np.zeros((0,), dtype=np.int64) if codes is None else np.asarray(codes)
        frames = frames_from_parallel_output(completion.cumulative_token_ids, packed)
        prompts.append(_whole_request_prompt(frames, out.request_id))
    return prompts


def flattened_sync_inputs(source_outputs: list[Any], prompt: Any = None, requires_multimodal_data: bool = False):
    """Consumer for ``async_chunk: false`` with a flattened Stage 0."""
    prompts = []
    for out in source_outputs:
        grouped = tl.frames_from_flat_tokens(out.outputs[0].cumulative_token_ids)
        if grouped.dropped_partial or grouped.invalid:
            logger.warning(
                "request %s: dropped %d codes of an incomplete last frame and %d out-of-order codes",
                out.request_id,
                grouped.dropped_partial,
                grouped.invalid,
            )
        prompts.append(_whole_request_prompt(grouped.frames, out.request_id))
    return prompts
