"""Stage 0's per-step codes reach each request whether vLLM-Omni builds the step's outputs at once or deferred.

vLLM-Omni cuts a per-token payload into requests (``to_payload_element``) only when its length is the step's hidden
rows (the synchronous builder passes them) or its scheduled tokens (the deferred builder, under async scheduling,
passes only those). A payload as long as the CUDA-graph-padded hidden rows went whole to every request under the
deferred builder; each request then took the batch's last row. Here vLLM-Omni's own slicing runs with both builders'
arguments on a padded mixed step.
"""

from __future__ import annotations

import pytest
import torch
from vllm_omni.utils.mm_outputs import to_payload_element

from vllm_omni_kani.model_executor.models.kani_tts import token_layout as tl
from vllm_omni_kani.model_executor.models.kani_tts.kani_tts_lm import scheduled_tokens
from vllm_omni_kani.model_executor.stage_input_processors.kani_tts import _step_codes

# A decode, a 5-token prompt, a decode: 7 scheduled tokens, padded to a captured size of 8 rows.
SPANS = [(0, 1), (1, 6), (6, 7)]
PADDED_ROWS = 8
OWN_CODES = [101, 202, 303]


def step_codes(rows: int) -> torch.Tensor:
    """What ``make_omni_output`` fills: NO_CODES except each request's sampled (last) token."""
    codes = torch.full((rows,), tl.NO_CODES, dtype=torch.long)
    for (_, end), code in zip(SPANS, OWN_CODES, strict=True):
        codes[end - 1] = code
    return codes


def per_request(codes: torch.Tensor, seq_len: int) -> list[int | None]:
    """Each request's code as the producer reads it, from vLLM-Omni's slicing with these arguments."""
    out = []
    for idx, (start, end) in enumerate(SPANS):
        element = to_payload_element({"audio": codes}, idx, start, end, seq_len=seq_len, scheduled_seq_len=SPANS[-1][1])
        values = _step_codes({"codes": element})
        out.append(None if values is None or values[-1] == tl.NO_CODES else values[-1])
    return out


def test_the_payload_is_as_long_as_the_scheduled_tokens():
    hidden = torch.zeros(PADDED_ROWS, 4)
    assert scheduled_tokens(hidden, {"request_token_spans": SPANS}) == 7
    assert scheduled_tokens(hidden, {}) == PADDED_ROWS  # no spans (a runner that passes none): the rows


@pytest.mark.parametrize("builder_seq_len", [PADDED_ROWS, 0], ids=["synchronous", "deferred"])
def test_every_request_gets_its_own_codes(builder_seq_len):
    codes = step_codes(scheduled_tokens(torch.zeros(PADDED_ROWS, 4), {"request_token_spans": SPANS}))
    assert per_request(codes, builder_seq_len) == OWN_CODES


def test_a_padded_payload_is_lost_under_the_deferred_builder():
    """Why the length matters: the padded payload goes whole to each request, whose last row is padding."""
    assert per_request(step_codes(PADDED_ROWS), PADDED_ROWS) == OWN_CODES
    assert per_request(step_codes(PADDED_ROWS), 0) == [None, None, None]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the host copy without waiting is CUDA-only")
def test_the_host_codes_are_whole_once_a_later_copy_on_the_stream_is():
    """The host codes are read only after the step's sampled tokens reach the host; a copy queued after them on the
    same stream finishing means theirs did, even behind a long queue of kernels."""
    from vllm_omni_kani.model_executor.models.kani_tts.pinned_staging import to_host_in_stream_order

    device = torch.device("cuda")
    big = torch.randn(4096, 4096, device=device)
    for _ in range(20):  # keep the stream busy so the copies queue behind work
        big = big @ big / 64
    codes = torch.arange(300, device=device) + big[0, 0].long() * 0
    host = to_host_in_stream_order(codes)
    assert host.device.type == "cpu" and host.is_pinned()
    later = torch.empty(1, dtype=torch.long, pin_memory=True)
    later.copy_(codes[:1], non_blocking=True)
    event = torch.cuda.Event()
    event.record()
    event.synchronize()
    assert torch.equal(host, torch.arange(300))
