"""The Stage-0 chunk producer says when a finished request's tokens and code rows do not pair one to one.

Every kept step brings one sampled token (codebook 1) and one code row (codebooks 2-4); a step whose payload and token
part (a runner that drops or adds a step's payload) would silently shorten or shift the audio. Driven through the real
producer the way the connector's save thread drives it.
"""

from __future__ import annotations

import logging
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from vllm.v1.request import RequestStatus

from tests.conftest import chunk_transfer_manager
from vllm_omni_kani.model_executor.models.kani_tts import token_layout as tl
from vllm_omni_kani.model_executor.stage_input_processors import kani_tts as producer

FRAMES = 20


def run(skip_codes_at: int | None) -> tuple[list, int]:
    """One request of FRAMES audio steps; the step ``skip_codes_at`` arrives without its code row. Returns the chunks'
    windows and the request's token count."""
    rng = np.random.default_rng(0)
    frames = rng.integers(0, tl.CODEBOOK_SIZE, size=(FRAMES, tl.NUM_CODEBOOKS))
    packed = tl.pack_codes(torch.from_numpy(frames[:, 1:])).tolist()
    transfer, windows = chunk_transfer_manager(), []
    request = SimpleNamespace(external_req_id="req-0", output_token_ids=[], status=RequestStatus.RUNNING)
    for k in range(FRAMES):
        request.output_token_ids.append(tl.AUDIO_TOKEN_OFFSET + int(frames[k, 0]))
        codes = None if k == skip_codes_at else {"codes": {"audio": torch.tensor([packed[k]])}}
        payload = producer.parallel_async_chunk(transfer, codes, request, is_finished=k == FRAMES - 1)
        if payload is not None:
            windows.append(payload.codes.audio)
    return windows, len(request.output_token_ids)


def test_a_whole_request_logs_nothing(caplog):
    with caplog.at_level(logging.WARNING, logger=producer.__name__):
        windows, _ = run(skip_codes_at=None)
    assert sum(w.shape[0] for w in windows) == FRAMES
    assert not [r for r in caplog.records if "code rows" in r.getMessage()]


@pytest.mark.parametrize("skip", [0, FRAMES // 2, FRAMES - 1])
def test_a_step_without_its_codes_is_reported(caplog, skip):
    with caplog.at_level(logging.WARNING, logger=producer.__name__):
        windows, tokens = run(skip_codes_at=skip)
    # The tokens after the gap pair with the next step's codes, so one frame goes missing at the end.
    assert sum(w.shape[0] for w in windows) == FRAMES - 1
    messages = [r.getMessage() for r in caplog.records if "code rows" in r.getMessage()]
    assert messages == [
        f"request req-0 finished with {tokens} output tokens and {FRAMES - 1} code rows: "
        "1 frame(s) without their codebooks 2-4 were dropped"
    ]
