"""One engine request for a checked Kani speech request, each stage's sampling parameters copied at most once.

vLLM-Omni's generic ``_prepare_speech_generation`` deep-copies the stages' default parameters several times a request
(to set the streaming output kind, then the whole list again for a seed or ``extra_params``), and ``copy.deepcopy`` of
a ``SamplingParams`` is tens of microseconds of Python on the API server's event loop, the thread that also takes in
every request and streams every answer. Under 64-frame requests at 256 streams on an H200 those copies were ~10% of
that thread's GIL samples and the request's whole preparation 24% (py-spy, fifty-sixth set in docs/BENCHMARKS.md).

Kani needs none of them: its adapter builds Stage 0's parameters for each request and sets every field a request can
change (``KaniTTSAdapter.build``), the seed is one more such field, and nothing of Kani reads ``extra_args``
(temperature and the other knobs in ``extra_params`` are already the adapter's options). So a stage whose default
already has the request's output kind shares it, as vLLM-Omni does, and any other gets a shallow copy with scalars
replaced; no shared default is ever changed, and each per-request copy is marked ``skip_clone`` (vLLM's flag for
parameters owned by one request), so the orchestrator's own clone of it is shallow too.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import AsyncIterator, Sequence
from typing import Any

from vllm.sampling_params import RequestOutputKind, SamplingParams
from vllm.utils import random_uuid

logger = logging.getLogger(__name__)

# The log line vLLM-Omni writes for every speech request, kept so that its readers still find Kani's requests.
_LOG_TEXT_CHARS = 50


def own_copy(params: SamplingParams) -> SamplingParams:
    """A shallow copy of ``params`` for one request: its scalar fields may be set, its containers are shared and are
    never changed in place here (a field that changes gets a new container)."""
    mine = copy.copy(params)
    mine.skip_clone = True
    return mine


def stage_params(defaults: Sequence[Any], streaming: bool) -> list[Any]:
    """Each stage's parameters for one request: deltas when streamed, the final output only otherwise.

    A default of that kind already is shared (nothing changes it); another gets its own copy of that kind.
    """
    kind = RequestOutputKind.DELTA if streaming else RequestOutputKind.FINAL_ONLY
    params = list(defaults)
    for index, default in enumerate(params):
        if isinstance(default, SamplingParams) and default.output_kind != kind:
            params[index] = own_copy(default)
            params[index].output_kind = kind
    return params


async def submit_kani_speech(
    server: Any, request: Any, request_id: str | None, has_inline_ref_audio: bool | None
) -> tuple[str, AsyncIterator[Any], dict[str, Any]]:
    """``(request_id, output generator, tts_params)`` for ``request``, already checked by the adapter's ``validate``.

    The generator is vLLM-Omni's ``generate``; its engine request is queued when it is first stepped.
    """
    engine = server.engine_client
    if engine.errored:
        raise engine.dead_error
    request_id = request_id or f"speech-{random_uuid()}"
    params = stage_params(engine.default_sampling_params_list, request.is_streaming())
    inline = request.ref_audio is not None if has_inline_ref_audio is None else has_inline_ref_audio
    prepared = await server._get_tts_adapter().build(request, params, inline)
    if request.seed is not None:
        params[0].seed = request.seed  # the adapter's own copy for this request
    text = request.input
    logger.info(
        "TTS speech request %s: text=%r, model=%s",
        request_id,
        text[:_LOG_TEXT_CHARS] + "..." if len(text) > _LOG_TEXT_CHARS else text,
        prepared.model_type,
    )
    generator = engine.generate(
        prompt=prepared.prompt, request_id=request_id, sampling_params_list=params, output_modalities=["audio"]
    )
    return request_id, generator, prepared.tts_params
