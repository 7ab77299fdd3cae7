"""The penalties' padded output-token rows built incrementally (``penalty_tokens``, patched into vLLM's sampler by a
Kani Stage-0 process) equal vLLM's own array step after step, whatever the requests do between steps."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from vllm.utils.torch_utils import make_ndarray_with_pad
from vllm.v1.sample.ops import penalties

from vllm_omni_kani.model_executor.models.kani_tts.penalty_tokens import (
    OutputTokenRows,
    PinnedStaging,
    convert_to_tensors_with,
)

PAD = 68442


def test_the_rows_equal_vllms_array_through_appends_finishes_arrivals_reorders_rewrites_and_rewinds():
    rng = random.Random(0)
    rows = OutputTokenRows()
    live = [[rng.randrange(PAD) for _ in range(rng.randrange(0, 3))] for _ in range(40)]
    for step in range(400):
        for tokens in live:
            tokens.append(rng.randrange(PAD))
        event = rng.random()
        if event < 0.05 and live:  # a request finishes
            live.pop(rng.randrange(len(live)))
        elif event < 0.15:  # requests arrive (past the first row and width capacity, over the steps)
            live.extend([rng.randrange(PAD)] for _ in range(rng.randrange(1, 30)))
        elif event < 0.25:  # the batch is reordered
            rng.shuffle(live)
        elif event < 0.35 and live:  # a placeholder written last step gets its token (async scheduling)
            tokens = rng.choice(live)
            tokens[-1] = -1
            assert np.array_equal(rows.padded(live, PAD), make_ndarray_with_pad(live, PAD, np.int64))
            tokens[-1] = rng.randrange(PAD)
        elif event < 0.40 and live:  # a rewind: the last tokens are dropped and others written
            tokens = rng.choice(live)
            del tokens[max(len(tokens) - rng.randrange(1, 12), 0) :]
            tokens.extend(rng.randrange(PAD) for _ in range(rng.randrange(0, 3)))
        elif event < 0.45 and live:  # a list replaced by a new one with the same tokens (speculative decoding)
            i = rng.randrange(len(live))
            live[i] = list(live[i])
        got, want = rows.padded(live, PAD), make_ndarray_with_pad(live, PAD, np.int64)
        assert got.dtype == want.dtype and np.array_equal(got, want), step
    assert max(map(len, live)) > 256 and len(live) > 64  # both of the store's dimensions grew


def test_an_empty_step_and_empty_lists():
    rows = OutputTokenRows()
    assert rows.padded([], PAD).shape == (0, 0)
    assert np.array_equal(rows.padded([[], [3]], PAD), np.array([[PAD], [3]]))


def test_the_tensor_stand_in_gives_vllms_tensor():
    rng = random.Random(1)
    lists = [[rng.randrange(PAD) for _ in range(rng.randrange(0, 50))] for _ in range(16)]
    convert = convert_to_tensors_with(OutputTokenRows())
    got = convert(lists, PAD, torch.device("cpu"))
    want = penalties._convert_to_tensors(lists, PAD, torch.device("cpu"))
    assert got.dtype == want.dtype == torch.int64 and torch.equal(got, want)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="pinned staging copies to a CUDA device (CPU CI has none)")
def test_the_pinned_ring_delivers_every_steps_array_to_the_device():
    rng = random.Random(2)
    staging = PinnedStaging(slots=2)
    sent = []
    for step in range(12):  # more steps than slots, growing: buffers are reused and regrown
        array = np.array([[rng.randrange(PAD) for _ in range(step + 1)] for _ in range(3 + step)], dtype=np.int64)
        sent.append((array, staging.to_device(array, torch.device("cuda"))))
    for array, tensor in sent:
        assert torch.equal(tensor.cpu(), torch.from_numpy(array))
