"""Top-k / top-p over each row's top-k candidates (``top_k_candidates``, a Kani Stage-0 sampler patch): the same
masked logits as vLLM's top-k/top-p functions, and only for calls whose k carries a small host-side bound."""

from __future__ import annotations

import pytest
import torch
from vllm.v1.sample.ops import topk_topp_sampler as ops

from vllm_omni_kani.model_executor.models.kani_tts import top_k_candidates as tkc

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA"))]
LM_VOCAB = 68442
HEAD_VOCAB = 4032


def _logits(rows: int, width: int, device: str, seed: int = 0) -> torch.Tensor:
    """Distinct float32 logits (no ties at any k-th value, where top-k implementations may keep different tokens)."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    return torch.randn(rows, width, generator=gen, dtype=torch.float64).mul_(2).to(torch.float32).to(device)


def _filters(rows: int, device: str, bound: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row k from 1 to ``bound`` and p from 0.05 to 1."""
    k = torch.tensor([[1, 2, 7, 50, bound][i % 5] for i in range(rows)], dtype=torch.int32, device=device)
    p = torch.tensor([[0.05, 0.5, 0.9, 0.95, 1.0, 0.99][i % 6] for i in range(rows)], device=device)
    return k, p


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("rows", "width"), [(37, LM_VOCAB), (3 * 40, HEAD_VOCAB)])
@pytest.mark.parametrize("with_p", [True, False])
def test_candidates_mask_the_logits_as_vllm_does(device, rows, width, with_p):
    bound = 64
    logits = _logits(rows, width, device, seed=rows)
    k, p = _filters(rows, device, bound)
    p = p if with_p else None
    got = tkc.filter_candidates(logits.clone(), k, p, bound)
    # vLLM's sort-based reference, and the function its sampler calls on this device (its Triton kernel on CUDA).
    for want in (ops.apply_top_k_top_p_pytorch(logits.clone(), k, p), ops.apply_top_k_top_p(logits.clone(), k, p)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    kept = torch.isfinite(got).sum(dim=-1)
    assert torch.all(kept <= k) and torch.all(kept >= 1)
    if not with_p:
        assert torch.equal(kept, k.long())


@pytest.mark.parametrize("device", DEVICES)
def test_a_bound_above_the_row_width_keeps_every_candidate(device):
    """The code heads' rows (4,032 wide) under a batch whose largest k is wider than them."""
    logits = _logits(6, 40, device)
    k = torch.full((6,), 60, dtype=torch.int32, device=device)
    got = tkc.filter_candidates(logits.clone(), k, None, bound=60)
    assert torch.equal(got, logits)


def test_calls_without_a_small_host_bound_go_to_vllms_function():
    calls = []

    def original(logits, k, p):
        calls.append((k, p))
        return logits

    apply = tkc.with_candidates(original)
    logits = _logits(4, 100, "cpu")
    k = torch.full((4,), 10, dtype=torch.int32)
    p = torch.full((4,), 0.9)
    apply(logits.clone(), k, p)  # no bound written on k
    apply(logits.clone(), None, p)  # top-p alone
    wide = k.clone()
    tkc.mark_bound(wide, tkc.MAX_CANDIDATES + 1)  # a request without top-k has k = the vocabulary
    apply(logits.clone(), wide, p)
    assert len(calls) == 3
    tkc.mark_bound(k, 10)
    got = apply(logits.clone(), k, p)
    assert len(calls) == 3 and torch.isfinite(got).sum() <= 40
    assert tkc.bound_of(k) == 10 and tkc.bound_of(None) is None
