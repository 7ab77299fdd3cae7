"""Codebooks 2-4 sampled inside the model: seeded rows are reproducible and batch-independent, each seeded request
draws its noise once for all three heads, and unseeded draws follow the tempered softmax."""

from __future__ import annotations

import torch
from vllm.v1.sample.logits_processor.state import LogitsProcessors
from vllm.v1.sample.metadata import SamplingMetadata

from vllm_omni_kani.model_executor.models.kani_tts.code_sampler import sample_codes

HEADS, SIZE = 3, 64


def metadata(rows: int, seeds: dict[int, int], temperature: float = 0.8) -> SamplingMetadata:
    """vLLM's own sampling metadata for ``rows`` random-sampled requests, ``seeds`` = {row: seed}."""
    return SamplingMetadata(
        temperature=torch.full((rows,), temperature),
        all_greedy=False,
        all_random=True,
        top_p=None,
        top_k=None,
        generators={row: torch.Generator().manual_seed(seed) for row, seed in seeds.items()},
        max_num_logprobs=None,
        no_penalties=True,
        prompt_token_ids=None,
        frequency_penalties=torch.zeros(rows),
        presence_penalties=torch.zeros(rows),
        repetition_penalties=torch.ones(rows),
        output_token_ids=[[] for _ in range(rows)],
        allowed_token_ids_mask=None,
        bad_words_token_ids={},
        logitsprocs=LogitsProcessors(),
    )


def test_a_seeded_request_samples_the_same_codes_whatever_shares_its_batch():
    torch.manual_seed(0)
    logits = torch.randn(5, HEADS, SIZE)
    first = sample_codes(logits, metadata(5, {0: 11, 3: 12}))
    other = logits.clone()
    other[[1, 2, 4]] = torch.randn(3, HEADS, SIZE)  # the unseeded neighbours change
    again = sample_codes(other, metadata(5, {0: 11, 3: 12}))
    assert first.shape == (5, HEADS)
    assert torch.equal(first[[0, 3]], again[[0, 3]])
    # The same request alone in a batch of one, as row 0.
    alone = sample_codes(logits[3:4], metadata(1, {0: 12}))
    assert torch.equal(alone[0], first[3])


def test_a_seeded_request_draws_all_heads_from_one_call_of_its_generator():
    """The three heads' noise is one draw of ``HEADS x SIZE`` exponentials from the request's generator."""
    torch.manual_seed(1)
    logits = torch.randn(2, HEADS, SIZE)
    codes = sample_codes(logits, metadata(2, {0: 7, 1: 8}, temperature=1.0))
    for row, seed in ((0, 7), (1, 8)):
        noise = torch.empty(HEADS, SIZE).exponential_(generator=torch.Generator().manual_seed(seed))
        scores = logits[row].softmax(dim=-1) / noise
        # The chosen code is the race's winner; the two softmaxes run on different shapes (other kernels), so the
        # winner's score is compared within float32 rounding rather than by index equality.
        chosen = scores.gather(1, codes[row].unsqueeze(1)).squeeze(1)
        assert torch.all(chosen >= scores.max(dim=-1).values * (1 - 8 * torch.finfo(torch.float32).eps))


def test_unseeded_codes_follow_the_tempered_softmax_of_each_head():
    torch.manual_seed(2)
    rows, temperature = 6000, 0.7
    head_logits = torch.randn(HEADS, SIZE)
    codes = sample_codes(head_logits.expand(rows, HEADS, SIZE).contiguous(), metadata(rows, {}, temperature))
    for head in range(HEADS):
        freq = torch.bincount(codes[:, head], minlength=SIZE).float() / rows
        expected = (head_logits[head] / temperature).softmax(dim=-1)
        # 6,000 draws: a frequency's standard error is at most 0.0065; allow five of them.
        assert (freq - expected).abs().max() < 5 * 0.0065
