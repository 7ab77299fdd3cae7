"""Stage 0's own count of each request's output tokens, logged as it frees the request.

The audio check (``benchmarks/audio_vs_frames.py``) compares each request's audio with the frames Stage 0 generated,
read from the API server's per-request stats. vLLM-Omni's orchestrator takes Stage 0's token count from the stage's
last output; when the codec finishes the request first, that output is dropped and the count with it (a third of the
requests at 512 streams on two GPUs: docs/BENCHMARKS.md, fortieth set). With ``KANI_LOG_STAGE0_FINISHED=1`` Stage 0's
scheduler logs, for every request it frees,

    [KaniStage0Finished] request_id=ID tokens=N status=STATUS

where ``N`` is the request's output tokens as the engine holds them (the number the orchestrator's stats report when
they have it) and ``STATUS`` vLLM's finish status, so every request can be checked.
"""

from __future__ import annotations

import logging
from typing import Any

from vllm_omni_kani.envs import log_stage0_finished

logger = logging.getLogger(__name__)

TAG = "[KaniStage0Finished]"


class FinishedTokensLog:
    """A scheduler mixin: one ``TAG`` line per freed request when ``KANI_LOG_STAGE0_FINISHED`` is on."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.log_finished_tokens = log_stage0_finished()

    def _free_request(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        if self.log_finished_tokens:
            status = getattr(request.status, "name", request.status)
            tokens = request.num_output_tokens
            logger.info("%s request_id=%s tokens=%d status=%s", TAG, request.request_id, tokens, status)
        return super()._free_request(request, *args, **kwargs)
