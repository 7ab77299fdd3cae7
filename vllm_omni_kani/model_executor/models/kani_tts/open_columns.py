"""Stage 0's top-k/top-p over the columns the speech mask can leave open, not over the whole vocabulary.

Stage 0's ``compute_logits`` masks every row with the speech grammar (``speech_mask``), and whatever a row's phase,
the ids it allows lie at or above the mask's first open column (START_OF_SPEECH): 4,041 of a parallel-head
checkpoint's 68,442 columns can be finite (16,138 of a flattened one's 80,539). Nothing vLLM does after the model
(penalties, temperature, logit bias, allowed-token masks) makes a ``-inf`` finite. vLLM's top-k/top-p kernel still
searches every column for each row's k-th value: 1.12–1.19 ms of a served Stage-0 step's 3.55 ms of GPU time at 256
streams (docs/BENCHMARKS.md, "Twenty-fourth set"), 0.45 ms alone against 0.07 ms on the open columns ("Twenty-fifth
set").

Here the same vLLM function runs on a view of the open columns (the row stride stays; its Triton kernel takes any row
stride); the columns before them stay ``-inf``. On a CPU (vLLM's sort-based function) the result is what it keeps of
the whole row, bit for bit; on CUDA its Triton kernel finds the top-p cut by a pivot search, which in one row of 256
can fall one token off the exact cut with either input (the twenty-fifth set's interpreter check). The Kani Stage-0
model says where its rows open (``open_from``) when the patch is installed; logits of any other width (the code
heads') go to vLLM's function as they are.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass

import torch
from vllm.v1.sample.ops import topk_topp_sampler as ops

from vllm_omni_kani import sampler_ab
from vllm_omni_kani.model_executor.models.kani_tts.code_sampler import ApplyTopKTopP, filter_set_warm_ups
from vllm_omni_kani.model_executor.models.kani_tts.warm_ups import WarmUp

logger = logging.getLogger(__name__)

NAME = "top_k_open_columns"  # its name in KANI_STAGE0_SAMPLER_PATCHES and KANI_SAMPLER_AB_PATCHES

# Row counts for the warm-up, in both of Triton's integer specialisations of the kernel's row count (a multiple of 16
# and not); vLLM runs its Triton kernel from 8 rows.
WARM_UP_ROWS = (9, 16)
WARM_UP_TOP_K = 50


@dataclass(frozen=True)
class OpenColumns:
    """Rows ``width`` wide whose columns before ``first`` are always ``-inf``."""

    first: int
    width: int


_open: OpenColumns | None = None
_engaged = False  # whether this process has filtered open columns yet (logged once)


def open_from(first: int, width: int) -> None:
    """Declare that in this process every sampled row ``width`` wide is ``-inf`` before column ``first``."""
    global _open
    if not 0 <= first < width:
        raise ValueError(f"first open column {first} outside a row of {width}")
    _open = OpenColumns(first, width)
    logger.info(
        "top-k/top-p: over columns %d-%d of rows %d wide (the speech mask's open ones)", first, width - 1, width
    )


def applies(logits: torch.Tensor) -> bool:
    """Whether a call's logits are rows whose open columns were declared."""
    return _open is not None and logits.dim() == 2 and logits.shape[1] == _open.width and _open.first > 0


def in_open_columns(original: ApplyTopKTopP, logits: torch.Tensor, k: torch.Tensor | None, p: torch.Tensor | None):
    """``original`` on the open columns of ``logits``, in place; the closed columns stay as they are (``-inf``)."""
    assert _open is not None
    view = logits[:, _open.first :]
    if k is not None:  # a request without top-k has k = the vocabulary: every open column
        k = k.clamp(max=view.shape[1])
    out = original(view, k, p)
    if out is not view:  # vLLM's function may return a new tensor for a layout it does not take
        view.copy_(out)
    return logits


def with_open_columns(original: ApplyTopKTopP) -> ApplyTopKTopP:
    """vLLM's ``apply_top_k_top_p`` on the open columns of the rows they were declared for (in this patch's A/B
    windows, ``sampler_ab``)."""

    def apply(logits: torch.Tensor, k: torch.Tensor | None, p: torch.Tensor | None) -> torch.Tensor:
        if (k is not None or p is not None) and applies(logits) and sampler_ab.patched_now(NAME):
            global _engaged
            if not _engaged:
                _engaged = True
                logger.info("top-k/top-p over the open columns: first call, %d rows", logits.shape[0])
            return in_open_columns(original, logits, k, p)
        return original(logits, k, p)

    apply.__wrapped__ = original  # type: ignore[attr-defined]
    return apply


def kernel_warm_ups(device: torch.device) -> list[WarmUp]:
    """The calls that compile vLLM's top-k/top-p kernel for the open columns at model load, not in a served step: their
    width, row stride and offset are not the whole rows' that vLLM's sampler warm-up compiles (for top-k and top-p
    together, at one row count)."""
    if _open is None or device.type != "cuda":
        return []
    original = getattr(ops.apply_top_k_top_p, "__wrapped__", ops.apply_top_k_top_p)
    apply = functools.partial(in_open_columns, original)
    return [
        call for rows in WARM_UP_ROWS for call in filter_set_warm_ups(apply, rows, _open.width, WARM_UP_TOP_K, device)
    ]
