"""A Stage-0 step's codes handed to the scheduler as one host tensor and each request's token span.

vLLM-Omni's output builder (``GPUARModelRunner._build_omni_model_runner_output_from_snapshot``) turns the step's
multimodal outputs into one payload dict per request: a slice, a flatten, a partition into inter-stage and client
keys and a tensor check, each a few Python calls per request per step. At 256 streams that was 10.8–12.5% of the
Stage-0 main thread (py-spy, docs/BENCHMARKS.md, twenty-seventh and twenty-eighth sets), for a payload that is
always the same: ``{"codes.audio": codes[start:end]}``, inter-stage only. ``StepCodeRows`` stands in for that list:
the scheduler indexes it once per request (``omni_ar_scheduler.update_from_output``) and gets the same dict, built
then, in one slice. Installed by ``patch.hand_stage0_codes_as_step_rows`` unless ``KANI_STEP_CODE_ROWS=0``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from vllm_omni_kani.model_executor.models.kani_tts import token_layout as tl

# The flat payload key of the step's codes (``vllm_omni.data_entry_keys.flatten_payload`` of ``tl.CODES_KEY``).
FLAT_CODES_KEY = ".".join(tl.CODES_KEY)


class StepCodeRows(Sequence):
    """``inter_stage_outputs`` of one step: item ``i`` is ``{"codes.audio": codes[start_i:end_i]}`` for request ``i``
    of the step (a view of the step's host tensor), or None for a request no later stage reads.

    Pickles as numpy (the runner output crosses a process boundary under vLLM's multiprocessing executor)."""

    def __init__(self, codes: torch.Tensor, starts: np.ndarray, ends: np.ndarray, downstream: np.ndarray) -> None:
        self._codes, self._starts, self._ends, self._downstream = codes, starts, ends, downstream

    def __len__(self) -> int:
        return len(self._starts)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if not self._downstream[index]:
            return None
        return {FLAT_CODES_KEY: self._codes[int(self._starts[index]) : int(self._ends[index])]}

    def __reduce__(self) -> tuple[Any, ...]:
        return _rebuild, (self._codes.numpy(), self._starts, self._ends, self._downstream)


def _rebuild(codes: np.ndarray, starts: np.ndarray, ends: np.ndarray, downstream: np.ndarray) -> StepCodeRows:
    return StepCodeRows(torch.from_numpy(codes), starts, ends, downstream)


def step_codes(multimodal_outputs: Any) -> torch.Tensor | None:
    """The step's code tensor if the model's outputs are that alone (nested or flat), else None."""
    if not isinstance(multimodal_outputs, dict) or len(multimodal_outputs) != 1:
        return None
    value = multimodal_outputs.get(FLAT_CODES_KEY)
    if value is None:
        nested = multimodal_outputs.get(tl.CODES_KEY[0])
        if isinstance(nested, dict) and len(nested) == 1:
            value = nested.get(tl.CODES_KEY[1])
    return value if isinstance(value, torch.Tensor) else None


def step_code_rows(
    codes: torch.Tensor,
    req_ids: list[str],
    req_id_to_index: dict[str, int],
    downstream_req_ids: set[str],
    query_start_loc_cpu: Any,
    num_scheduled_tokens_np: np.ndarray,
) -> StepCodeRows:
    """The rows of a step whose requests are ``req_ids``: request ``rid``'s tokens are ``[start, start + scheduled)``
    at its batch index, as the output builder cuts them."""
    index = np.fromiter((req_id_to_index[rid] for rid in req_ids), dtype=np.int64, count=len(req_ids))
    starts = np.asarray(query_start_loc_cpu)[index].astype(np.int64)
    ends = starts + np.asarray(num_scheduled_tokens_np, dtype=np.int64)[index]
    downstream = np.fromiter((rid in downstream_req_ids for rid in req_ids), dtype=np.bool_, count=len(req_ids))
    return StepCodeRows(codes, starts, ends, downstream)
