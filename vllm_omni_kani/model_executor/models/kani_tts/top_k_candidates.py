"""Top-k / top-p over each row's k best logits, not over the whole vocabulary.

vLLM's combined top-k/top-p kernel (``topk_topp_triton``) searches every row of the vocabulary for its k-th value: in a
served Stage-0 step at 256 streams on an H200 it took 1.12–1.19 ms of the step's 3.55 ms of GPU time for the 256 ×
68,442 ``lm_head`` rows (docs/BENCHMARKS.md, "Twenty-fourth set"); on a CPU its sort-based fallback takes ~0.6 s for
the same rows. Kani samples with top-k 50, so a row's kept tokens are among its ``torch.topk`` of the batch's largest
k: top-p then runs over those candidates, already sorted, and the row is masked outside what survives.

The batch's largest k has to be known on the host (it is ``topk``'s width). The input batch knows every request's
top_k when it builds the sampling metadata, so ``patch.choose_top_k_candidates`` writes that bound on the device
tensor it describes (``mark_bound``); a k tensor without a bound, or a bound above ``MAX_CANDIDATES`` (a request
without top-k has k = the vocabulary), takes vLLM's function.

The result is vLLM's kernel's: exactly k tokens kept per row (ties at the k-th value broken by ``torch.topk``), then
top-p over the kept tokens' probabilities (a token stays while the probability of the better ones is below p, so the
best always stays), every other logit set to ``-inf`` in place.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from vllm_omni_kani import sampler_ab

logger = logging.getLogger(__name__)

NAME = "top_k_candidates"  # its name in KANI_STAGE0_SAMPLER_PATCHES and KANI_SAMPLER_AB_PATCHES
# Largest batch top-k filtered by candidates; above it vLLM's full-row kernel is the cheaper one.
MAX_CANDIDATES = 1024
_BOUND = "_kani_top_k_bound"
_widths_seen: set[int] = set()  # row widths this process has filtered by candidates (each logged once)

ApplyTopKTopP = Callable[[torch.Tensor, torch.Tensor | None, torch.Tensor | None], torch.Tensor]


def mark_bound(k: torch.Tensor, bound: int) -> None:
    """Record on ``k`` (a request's top-k per row) the largest value it holds, read from the host copy it was made
    from."""
    setattr(k, _BOUND, int(bound))


def bound_of(k: torch.Tensor | None) -> int | None:
    """The host-side largest k recorded on ``k`` by ``mark_bound``, or None."""
    return None if k is None else getattr(k, _BOUND, None)


def applies(logits: torch.Tensor, k: torch.Tensor | None, bound: int | None) -> bool:
    """Whether the candidates path takes this call: a top-k whose host bound is known and small, one k per row."""
    return (
        k is not None
        and bound is not None
        and 0 < bound <= MAX_CANDIDATES
        and logits.dim() == 2
        and k.shape == (logits.shape[0],)
    )


def filter_candidates(
    logits: torch.Tensor, k: torch.Tensor, p: torch.Tensor | None, bound: int, mask_value: float = float("-inf")
) -> torch.Tensor:
    """Mask ``logits`` ``[rows, vocab]`` in place to each row's top ``k`` (``k <= bound``) and then its top ``p``."""
    width = min(bound, logits.shape[1])
    values, index = logits.topk(width, dim=-1)  # sorted, best first
    keep = torch.arange(width, device=logits.device) < k.view(-1, 1)
    if p is not None:
        probs = values.masked_fill(~keep, float("-inf")).softmax(dim=-1, dtype=torch.float32)
        better = probs.cumsum(dim=-1).sub_(probs)  # probability of the candidates ranked above each one
        keep &= better < p.view(-1, 1).to(torch.float32)
        keep[:, 0] = True
    logits.fill_(mask_value)
    return logits.scatter_(1, index, values.masked_fill_(~keep, mask_value))


def apply_top_k_top_p(
    original: ApplyTopKTopP,
    logits: torch.Tensor,
    k: torch.Tensor | None,
    p: torch.Tensor | None,
    bound: int | None,
) -> torch.Tensor:
    """``original`` (vLLM's ``apply_top_k_top_p``) unless the candidates path applies (and it is this patch's A/B
    window, ``sampler_ab``)."""
    if applies(logits, k, bound) and sampler_ab.patched_now(NAME):
        assert k is not None and bound is not None
        if logits.shape[1] not in _widths_seen:
            _widths_seen.add(logits.shape[1])
            logger.info(
                "top-k/top-p over candidates: first call at width %d (%d rows, top-k <= %d)",
                logits.shape[1],
                logits.shape[0],
                bound,
            )
        return filter_candidates(logits, k, p, bound)
    return original(logits, k, p)


def with_candidates(original: ApplyTopKTopP) -> ApplyTopKTopP:
    """vLLM's ``apply_top_k_top_p`` with the calls whose k carries a small host bound filtered by candidates."""

    def apply(logits: torch.Tensor, k: torch.Tensor | None, p: torch.Tensor | None) -> torch.Tensor:
        return apply_top_k_top_p(original, logits, k, p, bound_of(k))

    apply.__wrapped__ = original  # type: ignore[attr-defined]
    return apply
