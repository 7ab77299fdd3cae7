"""Codebooks 2-4 sampled inside the model: seeded rows are reproducible and batch-independent, their noise is a hash
of the request's seed and generator position that reads the generator without moving it, and seeded and unseeded
draws follow the tempered softmax."""

from __future__ import annotations

import pytest
import torch
from vllm.utils.torch_utils import set_default_torch_dtype
from vllm.v1.sample.logits_processor.state import LogitsProcessors
from vllm.v1.sample.metadata import SamplingMetadata

from tests.conftest import run_python
from vllm_omni_kani import envs
from vllm_omni_kani.model_executor.models.kani_tts.code_sampler import (
    filter_set_warm_ups,
    sample_codes,
    sample_packed_codes,
    warm_up_kernels,
)
from vllm_omni_kani.model_executor.models.kani_tts.seeded_noise import seeded_exponentials

HEADS, SIZE = 3, 64


def metadata(rows: int, seeds: dict[int, int], temperature: float = 0.8, device: str = "cpu") -> SamplingMetadata:
    """vLLM's own sampling metadata for ``rows`` random-sampled requests, ``seeds`` = {row: seed}, with the
    temperatures and generators on ``device``, as vLLM keeps them."""
    return SamplingMetadata(
        temperature=torch.full((rows,), temperature, device=device),
        all_greedy=False,
        all_random=True,
        top_p=None,
        top_k=None,
        generators={row: torch.Generator(device=device).manual_seed(seed) for row, seed in seeds.items()},
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


def test_seeded_noise_reads_the_generator_and_moves_on_only_when_vllm_draws_from_it():
    """The position is vLLM's: the heads leave the generator as it was, and codebook 1's draw gives the next step
    fresh noise, the same for every generator with that seed and history."""
    torch.manual_seed(1)
    logits = torch.randn(1, HEADS, SIZE)
    meta = metadata(1, {0: 7}, temperature=1.0)
    generator = meta.generators[0]
    before = generator.get_state()
    first = seeded_exponentials([generator], HEADS * SIZE, logits.device)
    sample_codes(logits, meta)
    assert torch.equal(generator.get_state(), before)
    assert torch.equal(seeded_exponentials([generator], HEADS * SIZE, logits.device), first)
    torch.empty(SIZE).exponential_(generator=generator)  # vLLM samples codebook 1 of this step
    second = seeded_exponentials([generator], HEADS * SIZE, logits.device)
    twin = torch.Generator().manual_seed(7)
    torch.empty(SIZE).exponential_(generator=twin)
    assert torch.equal(seeded_exponentials([twin], HEADS * SIZE, logits.device), second)
    # Fresh noise: independent Exp(1) rows agree in about as many places as chance allows (none, in float32).
    assert (second == first).float().mean() < 0.01


def test_seeded_noise_is_exponential_and_independent_across_requests():
    generators = [torch.Generator().manual_seed(seed) for seed in range(2000)]
    noise = seeded_exponentials(generators, 512, torch.device("cpu")).double()
    assert noise.shape == (2000, 512) and torch.isfinite(noise).all() and (noise > 0).all()
    # 1,024,000 draws: the mean's and variance's standard errors are 0.001 and 0.0045; allow five of them.
    assert abs(noise.mean().item() - 1.0) < 5e-3
    assert abs(noise.var().item() - 1.0) < 0.0225
    # The CDF 1 - exp(-x) at its quartiles (standard error of each fraction < 0.0005).
    for quantile in (0.25, 0.5, 0.75):
        below = (noise < -torch.log(torch.tensor(1.0 - quantile, dtype=torch.float64))).double().mean().item()
        assert abs(below - quantile) < 2.5e-3
    # Neighbouring seeds are uncorrelated (standard error of a correlation over 512 x 1999 pairs: 0.001).
    a, b = noise[:-1].flatten() - 1.0, noise[1:].flatten() - 1.0
    assert abs((a * b).mean().item() / (a.std() * b.std()).item()) < 5e-3


def test_seeded_codes_win_the_race_of_their_noise_and_follow_the_tempered_softmax():
    torch.manual_seed(3)
    rows, temperature = 6000, 0.7
    head_logits = torch.randn(HEADS, SIZE)
    logits = head_logits.expand(rows, HEADS, SIZE).contiguous()
    meta = metadata(rows, {row: 1000 + row for row in range(rows)}, temperature)
    codes = sample_codes(logits, meta)
    noise = seeded_exponentials(list(meta.generators.values()), HEADS * SIZE, logits.device).view(rows, HEADS, SIZE)
    scores = (logits / temperature).softmax(dim=-1) / noise
    # Compared within float32 rounding: the two softmaxes run on different shapes (other kernels).
    chosen = scores.gather(2, codes.unsqueeze(2)).squeeze(2)
    assert torch.all(chosen >= scores.max(dim=-1).values * (1 - 8 * torch.finfo(torch.float32).eps))
    for head in range(HEADS):
        freq = torch.bincount(codes[:, head], minlength=SIZE).float() / rows
        expected = (head_logits[head] / temperature).softmax(dim=-1)
        assert (freq - expected).abs().max() < 5 * 0.0065


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


def _no_kernel_compiles_after_the_warm_up() -> None:
    """Raises AssertionError if a sampled step compiles a kernel after ``warm_up_kernels`` (the code heads, the
    one-kernel sampler's switch taken) and ``codebook1_noise.kernel_warm_ups`` (codebook 1 at the vocabulary's width),
    both run as a model load runs them: under vLLM's default dtype, the model's bfloat16. Run in a fresh process: the
    count is of the kernels compiled in this process, so an earlier test's use cannot hide a kernel the warm-up
    missed."""
    from vllm.v1.sample.ops.topk_topp_triton import _topk_topp_kernel

    from vllm_omni_kani.model_executor.models.kani_tts import code_race, codebook1_noise, warm_ups
    from vllm_omni_kani.model_executor.models.kani_tts.seeded_noise import _hashed_exponentials_kernel

    def compiled() -> int:
        kernels = (_topk_topp_kernel, _hashed_exponentials_kernel, code_race._code_race_kernel)
        return sum(len(cache[0]) for kernel in kernels for cache in kernel.device_caches.values())

    size, vocab, device = 4032, 68442, torch.device("cuda")
    assert compiled() == 0
    code_race.take()
    with set_default_torch_dtype(torch.bfloat16):
        warm_up_kernels(3, size, device, torch.bfloat16)
        warm_ups.run(codebook1_noise.kernel_warm_ups(vocab, device), device)
    before = compiled()
    # three filter sets at two row-count classes, the noise of the heads and of codebook 1, the one-kernel sampler's
    # five specialisations
    assert before >= 13
    for rows in (1, 5, 11, 16, 32, 256):  # the one-kernel sampler up to its MAX_ROWS, then vLLM's top-k/top-p
        logits = torch.randn(rows, 3, size, device=device).to(torch.bfloat16)  # as the code heads' GEMM gives them
        assert sample_packed_codes(logits, None).shape == (rows,)
        for top_k, top_p in ((None, None), (None, 0.9), (50, None), (50, 0.9)):
            meta = metadata(rows, {0: 7}, device="cuda")
            meta.top_k = None if top_k is None else torch.full((rows,), top_k, dtype=torch.int32, device=device)
            meta.top_p = None if top_p is None else torch.full((rows,), top_p, device=device)
            assert sample_packed_codes(logits, meta).shape == (rows,)
        probs = torch.rand(rows, vocab, device=device).softmax(dim=-1)
        codebook1_noise.hashed_random_sample(probs, {0: torch.Generator(device=device).manual_seed(rows)})
    assert compiled() == before


def test_the_filter_warm_up_brings_a_served_steps_dtypes_under_vllms_load_time_dtype():
    """vLLM builds and loads a model with its dtype as torch's default (bfloat16 here); vLLM samples float32 logits,
    so the warm-up's tensors name their dtypes, or it compiles kernels no step launches."""
    seen = []

    def record(logits, k, p):
        seen.append((logits.dtype, None if k is None else k.dtype, None if p is None else p.dtype))

    with set_default_torch_dtype(torch.bfloat16):
        for warm_up in filter_set_warm_ups(record, 6, SIZE, SIZE - 1, torch.device("cpu")):
            warm_up.call()
    f32, i32 = torch.float32, torch.int32
    assert seen == [(f32, None, f32), (f32, i32, None), (f32, i32, f32)]


@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="Triton compiles kernels only for a CUDA device (CPU CI has none)"
)
@pytest.mark.parametrize("concurrent", ["0", "1"])
def test_after_the_load_time_warm_up_no_sampled_step_compiles_a_kernel(concurrent):
    """Every filter set, seeded or not, at batch sizes on both sides of Triton's row-count specialisations, and
    codebook 1's seeded noise: the kernels the step launches were all compiled by the load-time warm-ups, run one after
    another or at once (``KANI_CONCURRENT_WARM_UPS``)."""
    out = run_python(
        "import tests.test_code_sampler as t; t._no_kernel_compiles_after_the_warm_up(); print('ok')",
        env={envs.KANI_CONCURRENT_WARM_UPS: concurrent},
    )
    assert out.stdout.strip().endswith("ok")
