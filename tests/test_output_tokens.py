"""The penalties' output-token array built incrementally equals vLLM's own padding, step after step, and vLLM's
penalties give the same logits through the patch."""

from __future__ import annotations

import random

import numpy as np
import torch
from vllm.utils.torch_utils import make_ndarray_with_pad

from vllm_omni_kani.sample.output_tokens import OutputTokenArrays

PAD = 1000


def test_incremental_arrays_equal_vllms_padding_through_a_batch_life():
    """Requests join, grow, leave and change rows; async placeholders are overwritten in place; a list shrinks."""
    rng = random.Random(0)
    arrays = OutputTokenArrays()
    live: list[list[int]] = []
    for step in range(300):
        if rng.random() < 0.3 or not live:
            live.append([rng.randrange(PAD) for _ in range(rng.randrange(3))])
        if len(live) > 3 and rng.random() < 0.2:
            live.pop(rng.randrange(len(live)))
        rng.shuffle(live)  # the batch is condensed and reordered
        for tokens in live:
            if tokens and tokens[-1] == -1:
                tokens[-1] = rng.randrange(PAD)  # last step's placeholder gets its token
            tokens.append(-1 if step % 3 == 0 else rng.randrange(PAD))
        if step == 150:
            del live[0][-2:]  # a list that shrinks is copied afresh
        got = arrays.padded(live, PAD)
        want = make_ndarray_with_pad(live, PAD, np.int64)
        assert got.dtype == want.dtype and np.array_equal(got, want), step
    assert arrays.padded([], PAD).shape == (0, 0)


def test_vllms_penalties_give_the_same_logits_through_the_patch():
    from vllm.v1.sample.ops import penalties

    from vllm_omni_kani import patch

    original = penalties._convert_to_tensors
    assert patch.incremental_penalty_token_arrays()
    patched = penalties._convert_to_tensors
    assert patched is not original
    torch.manual_seed(0)
    rows, vocab = 8, 64
    outputs = [torch.randint(0, vocab, (n,)).tolist() for n in (0, 1, 5, 17, 3, 40, 2, 9)]
    prompts = torch.randint(0, vocab + 1, (rows, 6))  # vocab pads, as vLLM's prompt tensor does
    logits = torch.randn(rows, vocab)
    args = (prompts, torch.full((rows,), 0.2), torch.full((rows,), 0.1), torch.full((rows,), 1.1), outputs)
    try:
        for _ in range(3):  # the incremental copies are reused on later calls
            with_patch = penalties.apply_all_penalties(logits.clone(), *args)
            penalties._convert_to_tensors = original
            stock = penalties.apply_all_penalties(logits.clone(), *args)
            penalties._convert_to_tensors = patched
            assert torch.equal(with_patch, stock)
            for tokens in outputs:
                tokens.append(int(torch.randint(0, vocab, ())))
    finally:
        penalties._convert_to_tensors = patched
