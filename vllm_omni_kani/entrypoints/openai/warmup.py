"""Warm every engine before the server takes traffic: one short speech request per replica at start-up.

A fresh engine's first request is slow: on an H200 Stage 0 took 44–81 ms from scheduling to its first output
against 12–34 ms for its second request, the codec 12–17 against 6–9 ms; on CPU the first streamed request started
audio after 338 ms against 165–187 ms for the next three (docs/BENCHMARKS.md, "Thirty-first set"). With two Stage-0
engines that first request is a user's second request, because vLLM-Omni hands new requests to a stage's replicas
in turn (``StagePool.select_replica_id``). So the speech server's start-up warm-up, which vLLM-Omni runs only for
VoxCPM2, sends Kani ``replicas`` requests one after another: the largest replica count over the stages, so each
replica of every stage serves one, and the turn comes back to the first replica afterwards. Measured with it (H200,
thirty-second set): the warm-up requests took Stage 0 90–136 ms to a first output, the first client requests after
them 14–25 ms on every engine; on CPU the first streamed request's TTFA fell from 307 to 160 ms.

The requests take the speech server's own path (``_generate_audio_bytes``, the Kani adapter, both stages, the codec's
chunks) but not the HTTP app's, so admission and the ``kani:speech_*`` counters never see them; their time to first
audio and RTF are kept out of the speech metrics too (``recording``). vLLM's and vLLM-Omni's engine counters do
count them. ``patch.warm_up_every_engine`` installs this; ``KANI_DISABLE_PATCHES=warm_up_every_engine`` turns it off.
"""

from __future__ import annotations

import contextvars
import logging
import time
from typing import Any

from vllm_omni_kani.entrypoints.openai.speech_guard import stage_replicas

logger = logging.getLogger(__name__)

WARMUP_TEXT = "Warming up."
# Frames per warm-up request: past the codec's first chunk (initial_codec_chunk_frames) into a steady one, so both
# kinds of codec step and Stage 0's decode steps have run once.
WARMUP_FRAMES = 24
WARMUP_ID_PREFIX = "speech-warmup"

_warming_up: contextvars.ContextVar[bool] = contextvars.ContextVar("kani_warming_up", default=False)


def recording() -> bool:
    """Whether the current request's timings belong in the speech metrics (False inside the warm-up)."""
    return not _warming_up.get()


async def warm_up(server: Any, request_cls: Any) -> list[float]:
    """Send as many short requests as the stage with the most replicas has, one after another, through ``server``;
    returns each one's seconds.

    ``request_cls`` is vLLM-Omni's speech request model. A request that fails is logged with its error and the next
    one still runs: a server that cannot warm up still serves (its first requests are then cold)."""
    adapter = server._get_tts_adapter()
    tokens = min(WARMUP_FRAMES * adapter.settings.tokens_per_frame, adapter.max_new_tokens_max)
    count = max(stage_replicas(server.engine_client), default=1)
    seconds: list[float] = []
    token = _warming_up.set(True)
    try:
        for index in range(count):
            request = request_cls(
                input=WARMUP_TEXT, model=server.model_name, response_format="wav", max_new_tokens=tokens
            )
            start = time.perf_counter()
            try:
                await server._generate_audio_bytes(request, request_id=f"{WARMUP_ID_PREFIX}-{index}")
            except Exception as exc:
                logger.warning("[KaniWarmup] request %d of %d failed; serving without it: %s", index + 1, count, exc)
                continue
            seconds.append(time.perf_counter() - start)
    finally:
        _warming_up.reset(token)
    logger.info(
        "[KaniWarmup] %d of %d requests (one per replica, %d tokens each) in %s s",
        len(seconds),
        count,
        tokens,
        ", ".join(f"{s:.2f}" for s in seconds) or "-",
    )
    return seconds
