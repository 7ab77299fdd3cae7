"""Stage 0's step codes held on the engine's main thread until a codec chunk is due (``KANI_HOLD_UNTIL_DUE``).

vLLM-Omni's scheduler hands every request's every step to the connector (``OmniChunkTransferAdapter.save_async``),
whose save thread then calls the chunk producer (``kani_tts.parallel_async_chunk``) for it. A chunk is due one step
in 16 to 64, so most of those calls only keep a frame; at 256 streams on an H200 they held Stage 0's GIL about 11% of
the time, time the engine's main thread waits for (docs/BENCHMARKS.md, twenty-seventh set).

Held instead, a step costs the main thread a list append and a count: ``HeldSteps`` counts the request's frames from
its output tokens with the producer's own chunk arithmetic (``ChunkCursor``) and ``save_async`` is called
only when a chunk is due, when the request ends, and for any call vLLM-Omni would drop (a preempted request's
recomputed steps), with the held steps' codes in the payload (``HELD_STEPS_KEY``, oldest first). The producer adds
them before the step's own, so it pairs the same tokens with the same codes and sends the same chunks at the same
steps. The held state lives on the main thread only and is dropped with the request's terminal save or its abort.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from vllm_omni_kani.core.sched.request_ids import external_ids
from vllm_omni_kani.model_executor.models.kani_tts import token_layout as tl
from vllm_omni_kani.model_executor.stage_input_processors.kani_chunks import HELD_STEPS_KEY, ChunkCursor, ChunkPolicy
from vllm_omni_kani.model_executor.stage_input_processors.kani_tts import connector_extra, parallel_async_chunk

logger = logging.getLogger(__name__)

_HELD_ATTR = "_kani_held_steps"
# vLLM-Omni hands save_async a step's payload with flat keys ("codes.audio").
_FLAT_CODES_KEY, _FLAT_HELD_KEY = ".".join(tl.CODES_KEY), ".".join(HELD_STEPS_KEY)


@dataclass
class HeldSteps:
    """One request's steps since its last save, and the frame count the producer will see."""

    policy: ChunkPolicy
    # each held step's codes as the runner sent them (None where a step had none), oldest first
    steps: list[Any] = field(default_factory=list)
    tokens_seen: int = 0
    frames: int = 0
    ended: bool = False
    # the producer's own progress, followed with the same arithmetic
    cursor: ChunkCursor = field(default_factory=ChunkCursor)

    def count(self, output_token_ids: Sequence[int]) -> None:
        """Count the frames among the output tokens not seen yet (codebook-1 codes before END_OF_SPEECH), as
        ``FrameStream.add_tokens`` keeps them."""
        for k in range(self.tokens_seen, len(output_token_ids)):
            tok = int(output_token_ids[k])
            if tok == tl.END_OF_SPEECH:
                self.ended = True
            elif not self.ended and tl.is_cb1_token(tok):
                self.frames += 1
        self.tokens_seen = len(output_token_ids)

    def chunk_due(self) -> bool:
        """Whether the producer sends a chunk with these frames; if so, account for it as the producer will."""
        return self.cursor.advance(self.policy, self.frames, finished=False) is not None


def _with_held(multimodal_output: dict[str, Any] | None, held: HeldSteps | None) -> dict[str, Any] | None:
    """The step's payload with the held steps' codes in front of it (the payload itself when none are held)."""
    if held is None or not held.steps:
        return multimodal_output
    payload = dict(multimodal_output or {})
    payload[_FLAT_HELD_KEY] = held.steps
    held.steps = []
    return payload


def _held(adapter: Any) -> dict[str, HeldSteps] | None:
    """The adapter's held steps by external request id, or None for a stage whose producer is not ours."""
    if adapter.custom_process_next_stage_input_func is not parallel_async_chunk:
        return None
    held = adapter.__dict__.get(_HELD_ATTR)
    if held is None:
        held = adapter.__dict__[_HELD_ATTR] = {}
        logger.info("Kani Stage-0 producer: steps held on the main thread until a chunk is due")
    return held


def hold_until_due(save_async: Callable[..., Any]) -> Callable[..., Any]:
    """``OmniChunkTransferAdapter.save_async`` holding the steps of a stage that runs ``parallel_async_chunk``."""

    @functools.wraps(save_async)
    def held_save_async(
        self: Any, multimodal_output: Any = None, request: Any = None, is_segment_finished: bool = False
    ) -> Any:
        held = _held(self)
        if held is None:
            return save_async(self, multimodal_output, request, is_segment_finished)
        ext_id = request.external_req_id
        terminal = is_segment_finished or (request.is_finished() and not getattr(request, "resumable", False))
        confirmed = self._confirmed_num_computed_tokens(request)
        if not terminal and confirmed < self.requests_num_chunks_sent.get(ext_id, 0):
            # vLLM-Omni drops this step (a preempted request's recomputation); what is held stays for the next save.
            return save_async(self, multimodal_output, request, is_segment_finished)
        state = held.pop(ext_id, None) if terminal else held.get(ext_id)
        if not terminal:
            if state is None:
                state = held[ext_id] = HeldSteps(ChunkPolicy.from_extra(connector_extra(self)))
            state.count(request.output_token_ids)
            if not state.chunk_due():
                state.steps.append((multimodal_output or {}).get(_FLAT_CODES_KEY))
                # vLLM-Omni's watermark, as its own call would have set it.
                self.requests_num_chunks_sent[ext_id] = confirmed
                return None
        return save_async(self, _with_held(multimodal_output, state), request, is_segment_finished)

    return held_save_async


def drop_on_finish(finish_requests: Callable[..., Any]) -> Callable[..., Any]:
    """``OmniChunkTransferAdapter.finish_requests`` that also drops the held steps of the requests it ends (aborted
    ones: vLLM-Omni makes no terminal save for them)."""

    @functools.wraps(finish_requests)
    def held_finish_requests(self: Any, request_ids: Any, finished_status: Any, requests: Any = None) -> Any:
        held = _held(self)
        if held:
            if request_ids is not None and not isinstance(request_ids, str):
                request_ids = list(request_ids)  # read twice
            for ext_id in external_ids(request_ids, requests):
                held.pop(ext_id, None)
        return finish_requests(self, request_ids, finished_status, requests)

    return held_finish_requests
