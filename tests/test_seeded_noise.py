"""The seeded code-head noise has one definition in two forms: the Triton kernel that the GPU runs writes, into each
seeded request's batch row, the noise of the torch reference (the same hashed bits; the log within float32 rounding)
and leaves every other row alone. On CPU the kernel runs under Triton's interpreter, in a subprocess because the
interpreter is chosen when Triton compiles the kernel's module."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from vllm.v1.sample.ops.topk_topp_sampler import sample_with_exponential_noise

from tests.conftest import run_python
from vllm_omni_kani.model_executor.models.kani_tts.code_sampler import sample_codes
from vllm_omni_kani.model_executor.models.kani_tts.seeded_noise import (
    CODEBOOK1_SALT,
    SALT,
    _key_words,
    exponential_of_bits,
    fused_kernel_available,
    hashed_exponentials,
    noise_table,
    scatter_hashed_exponentials,
    seed_keys,
)

WIDTH = 3 * 4032  # three code heads of 4,032 codes: the width the model asks for
OTHER_SALT = CODEBOOK1_SALT  # another use of the same hash: codebook 1's noise
SEEDS = (0, 1, 7, 2**40 + 7, 2**64 - 1)  # both 32-bit words of the seed matter, up to the largest seed
ROWS = (5, 0, 7, 2, 3)  # their batch rows in a step of 8, out of order


def _generators(device: str) -> list[torch.Generator]:
    generators = [torch.Generator(device=device).manual_seed(seed) for seed in SEEDS]
    for generator in generators[:2]:  # two of them a step further on, as after vLLM's draw
        torch.empty(16, device=device).exponential_(generator=generator)
    return generators


def _kernel_against_reference(device: str, salt: int = SALT) -> None:
    """Raises AssertionError unless the kernel's rows match the reference within float32 rounding of the log."""
    generators = _generators(device)
    reference = hashed_exponentials(seed_keys(generators).to(device), WIDTH, salt=salt)
    out = torch.full((8, WIDTH), -1.0, device=device)
    scatter_hashed_exponentials(out, noise_table(list(ROWS), generators).to(device), salt=salt)
    # The uniforms are bit-identical; two log implementations differ by a few units in the last place.
    ulps = 4 * torch.finfo(torch.float32).eps
    assert torch.all((out[list(ROWS)] - reference).abs() <= ulps * reference.abs().clamp_min(1.0))
    others = [row for row in range(8) if row not in ROWS]
    assert torch.all(out[others] == -1.0)  # rows of unseeded requests keep their own noise


def test_the_kernel_writes_the_reference_noise_into_the_seeded_rows_under_the_interpreter():
    code = (
        "import torch, tests.test_seeded_noise as t\n"
        "from vllm_omni_kani.model_executor.models.kani_tts.seeded_noise import fused_kernel_available\n"
        "assert fused_kernel_available(torch.device('cpu'))\n"
        "t._kernel_against_reference('cpu')\n"
        "t._kernel_against_reference('cpu', t.OTHER_SALT)\n"
        "print('kernel ok')\n"
    )
    assert "kernel ok" in run_python(code, env={"TRITON_INTERPRET": "1"}).stdout


def test_every_uniform_gives_positive_finite_noise():
    """All 2**23 uniforms are exact and below 1, so the noise is never 0: a race's p / q stays 0 for a code of
    probability 0 instead of NaN (which argmax would pick)."""
    noise = exponential_of_bits(torch.arange(2**23))
    assert torch.all(noise > 0) and torch.all(torch.isfinite(noise))
    assert torch.all(noise[1:] < noise[:-1])  # every uniform distinct
    assert noise.min().item() == pytest.approx(2.0**-24, rel=1e-6) and noise.max().item() == pytest.approx(
        16.636, rel=1e-4
    )


# (seed, column) at generator position 7 whose 24-bit uniform rounded to 1.0 (noise 0) before the uniforms had 23 bits.
ZERO_NOISE_BEFORE = ((201, 10232), (571, 9306), (1831, 10753))


def test_draws_that_gave_zero_noise_now_leave_zero_probability_codes_unpicked():
    generators = [torch.Generator().manual_seed(seed) for seed, _ in ZERO_NOISE_BEFORE]
    noise = hashed_exponentials(torch.from_numpy(_key_words(generators, [7] * len(generators))), WIDTH)
    columns = [column for _, column in ZERO_NOISE_BEFORE]
    assert torch.all(noise[range(len(columns)), columns] > 0)
    probs = torch.zeros(len(columns), WIDTH)
    probs[:, :10] = 0.1  # ten allowed codes; the columns above have probability 0
    picked = sample_with_exponential_noise(probs, noise)
    assert torch.all(picked < 10), picked


def test_the_kernel_is_used_only_where_it_can_run():
    assert fused_kernel_available(torch.device("cpu")) == (os.environ.get("TRITON_INTERPRET") == "1")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the compiled kernel needs a CUDA device (CPU CI has none)")
@pytest.mark.parametrize("salt", [SALT, OTHER_SALT])
def test_the_compiled_kernel_matches_the_reference_on_cuda(salt):
    _kernel_against_reference("cuda", salt)


def test_two_salts_draw_unrelated_noise_for_one_seed_and_position():
    keys = seed_keys(_generators("cpu"))
    heads, other = hashed_exponentials(keys, WIDTH), hashed_exponentials(keys, WIDTH, salt=OTHER_SALT)
    assert not torch.any(heads == other)  # not one of the 60k shared columns gives the same value
    # Independent Exp(1) draws: their correlation is within a few standard errors (1/sqrt(n)) of 0.
    pair = torch.stack([heads.flatten(), other.flatten()])
    assert abs(torch.corrcoef(pair)[0, 1].item()) < 4 / heads.numel() ** 0.5


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the compiled kernel needs a CUDA device (CPU CI has none)")
def test_a_seeded_request_samples_the_same_codes_in_any_batch_on_cuda():
    from tests.test_code_sampler import metadata

    torch.manual_seed(0)
    logits = torch.randn(5, 3, 64, device="cuda")
    meta = metadata(5, {0: 11, 3: 12}, device="cuda")
    first = sample_codes(logits, meta)
    other = logits.clone()
    other[[1, 2, 4]] = torch.randn(3, 3, 64, device="cuda")
    assert torch.equal(sample_codes(other, meta)[[0, 3]], first[[0, 3]])
    assert torch.equal(sample_codes(logits[3:4], metadata(1, {0: 12}, device="cuda"))[0], first[3])


def test_key_words_are_each_generators_seed_and_position_in_32_bit_halves():
    seeds = [0, 1, 2**32 - 1, 2**32, 2**63 + 5, 2**64 - 1]
    generators = [torch.Generator().manual_seed(s) for s in seeds]
    positions = [0, 7, 2**32 + 3, 2**40, 2**63, 2**64 - 4]
    words = _key_words(generators, positions)
    assert words.dtype == np.int64 and words.shape == (len(seeds), 4)
    for row, seed, position in zip(words.tolist(), seeds, positions, strict=True):
        assert row == [seed & 0xFFFFFFFF, seed >> 32, position & 0xFFFFFFFF, position >> 32]
    with pytest.raises(ValueError, match="2 positions for 6 generators"):
        _key_words(generators, positions[:2])
