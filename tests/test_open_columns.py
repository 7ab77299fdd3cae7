"""Top-k / top-p over the columns the speech mask can leave open (``open_columns``, a Kani Stage-0 sampler patch):
the rows vLLM's function keeps of the whole row, for the logits the model declared, and vLLM's call for the rest."""

from __future__ import annotations

import pytest
import torch
from vllm.v1.sample.ops import topk_topp_sampler as ops

from vllm_omni_kani.model_executor.models.kani_tts import open_columns, warm_ups
from vllm_omni_kani.model_executor.models.kani_tts import token_layout as tl
from vllm_omni_kani.model_executor.models.kani_tts.speech_mask import Phase, SpeechMask

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")


@pytest.fixture
def declared(monkeypatch):
    """Open columns declared as the parallel-head Stage 0 declares them; undeclared again afterwards."""
    mask = SpeechMask(tl.PARALLEL_VOCAB_SIZE, "parallel")
    monkeypatch.setattr(open_columns, "_open", None)
    open_columns.open_from(mask.first_open, tl.PARALLEL_VOCAB_SIZE)
    return mask


def _masked_logits(mask: SpeechMask, rows: int, device: str, seed: int = 0) -> torch.Tensor:
    """Distinct float32 logits (no ties at a k-th value) masked as Stage 0's ``compute_logits`` masks them, every
    phase present."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    logits = torch.randn(rows, tl.PARALLEL_VOCAB_SIZE, generator=gen, dtype=torch.float64).mul_(2).float()
    phases = torch.tensor(
        [[Phase.SPEECH_0, Phase.SPEECH_0, Phase.AFTER_AI, Phase.AFTER_HUMAN][i % 4] for i in range(rows)]
    )
    return mask.apply(logits, phases).to(device)


def _filters(rows: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    k = torch.tensor([[1, 7, 50, 200, tl.PARALLEL_VOCAB_SIZE][i % 5] for i in range(rows)], dtype=torch.int32)
    p = torch.tensor([[0.05, 0.5, 0.9, 0.95, 1.0, 0.99][i % 6] for i in range(rows)])
    return k.to(device), p.to(device)


def test_every_phase_opens_at_or_after_start_of_speech():
    for variant, width in (("parallel", tl.PARALLEL_VOCAB_SIZE), ("flattened", tl.FLATTENED_VOCAB_SIZE)):
        mask = SpeechMask(width, variant)
        assert mask.first_open == tl.START_OF_SPEECH
        assert not (mask.allowed[:, : mask.first_open].any() or mask.fallback[: mask.first_open].any())


@pytest.mark.parametrize(("with_k", "with_p"), [(True, True), (True, False), (False, True)])
def test_the_open_columns_keep_what_the_whole_row_keeps(declared, with_k, with_p):
    """On the CPU vLLM's sort-based function is exact: the same logits either way, bit for bit."""
    logits = _masked_logits(declared, 40, "cpu")
    k, p = _filters(40, "cpu")
    k, p = (k if with_k else None), (p if with_p else None)
    want = ops.apply_top_k_top_p_pytorch(logits.clone(), k, p)
    got = open_columns.with_open_columns(ops.apply_top_k_top_p_pytorch)(logits.clone(), k, p)
    assert torch.equal(got, want)
    assert not torch.isfinite(got[:, : declared.first_open]).any()
    assert torch.isfinite(got).sum(dim=-1).min() >= 1


@CUDA
def test_on_cuda_vllms_kernel_runs_on_a_view_of_the_open_columns(declared):
    """vLLM's Triton kernel takes the open columns as a strided view: the same as on a copy of those columns."""
    logits = _masked_logits(declared, 256, "cuda", seed=1)
    k, p = _filters(256, "cuda")
    got = open_columns.with_open_columns(ops.apply_top_k_top_p)(logits.clone(), k, p)
    want = torch.full_like(logits, float("-inf"))
    want[:, declared.first_open :] = ops.apply_top_k_top_p(logits[:, declared.first_open :].contiguous(), k, p)
    assert torch.equal(got, want)
    # Top-k alone is exact in vLLM's kernel: the whole row's result.
    k_only = open_columns.with_open_columns(ops.apply_top_k_top_p)(logits.clone(), k, None)
    assert torch.equal(k_only, ops.apply_top_k_top_p_pytorch(logits.clone(), k, None))


def test_other_widths_and_undeclared_processes_go_to_vllms_function(monkeypatch):
    calls = []

    def original(logits, k, p):
        calls.append(logits.shape)
        return logits

    apply = open_columns.with_open_columns(original)
    k = torch.full((3,), 50, dtype=torch.int32)
    monkeypatch.setattr(open_columns, "_open", None)
    apply(torch.zeros(3, tl.PARALLEL_VOCAB_SIZE), k, None)  # nothing declared
    open_columns.open_from(tl.START_OF_SPEECH, tl.PARALLEL_VOCAB_SIZE)
    apply(torch.zeros(9, tl.CODEBOOK_SIZE), k.repeat(3), None)  # the code heads' rows
    apply(torch.zeros(3, tl.PARALLEL_VOCAB_SIZE), None, None)  # no filter
    assert calls == [(3, tl.PARALLEL_VOCAB_SIZE), (9, tl.CODEBOOK_SIZE), (3, tl.PARALLEL_VOCAB_SIZE)]
    apply(torch.zeros(3, tl.PARALLEL_VOCAB_SIZE), k, None)
    assert calls[-1] == (3, tl.PARALLEL_VOCAB_SIZE - tl.START_OF_SPEECH)
    with pytest.raises(ValueError, match="outside a row"):
        open_columns.open_from(tl.PARALLEL_VOCAB_SIZE, tl.PARALLEL_VOCAB_SIZE)


@CUDA
def test_the_warm_up_compiles_what_served_steps_run(declared, monkeypatch):
    """After ``warm_up`` no row count (a multiple of 16 or not) or filter set compiles vLLM's kernel again: a compile
    inside a served step stalls every stream."""
    from triton import knobs

    warm_ups.run(open_columns.kernel_warm_ups(torch.device("cuda")), torch.device("cuda"))
    compiles = []
    monkeypatch.setattr(knobs.runtime, "jit_post_compile_hook", lambda **kw: compiles.append(kw.get("fn")))
    apply = open_columns.with_open_columns(ops.apply_top_k_top_p)
    for rows in (37, 64, 200, 256):
        logits = _masked_logits(declared, rows, "cuda", seed=rows)
        k, p = _filters(rows, "cuda")
        for top_k, top_p in ((k, None), (None, p), (k, p)):
            apply(logits.clone(), top_k, top_p)
    assert compiles == []
