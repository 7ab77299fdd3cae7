"""vLLM's Triton kernels of a short-conv (LFM2) engine, compiled at start-up in the specialisations a burst meets first.

Triton compiles a kernel once per specialisation: an integer argument that is 1 or a multiple of 16 and a pointer
that is or is not 16-byte aligned each make another one, compiled (or read back from Triton's disk cache) inside
the step that first launches it. vLLM 0.26 warms such kernels for Qwen3-Next / 3.5 only
(``vllm/model_executor/warmup/qwen_triton_warmup.py``). A Kani engine warmed by one request at a time never meets
them: served, the first burst of requests stalled both Stage-0 engines for ~270 ms at their first step that admitted
several prompts beside a running one, and later bursts stalled one engine ~60 ms (docs/BENCHMARKS.md, fifty-ninth
set). Warmed here, before vLLM's JIT monitor starts and before the server takes traffic:

- ``_zero_kv_blocks_kernel`` (vLLM zeroes the KV blocks a step allocates): 1, 2 and 16 blocks.
- ``causal_conv1d_fn`` (a step's prompts through each short conv), with the layer's weights and conv state and
  prompt state indices laid out as vLLM's metadata builder lays them out (rows of the short-conv group's block
  table, after 0 or 1 decode rows: the rows' pointer aligned or not).
- ``causal_conv1d_update`` (the decode rows of a step that also admits prompts, run outside the CUDA graphs) at 1,
  2 and 16 rows.

Every index is vLLM's null block (``NULL_BLOCK_ID``), which the kernels neither read nor write, so no cached state
changes. Each warm-up that fails is logged and skipped: a server that cannot warm up still serves.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

logger = logging.getLogger(__name__)

# Triton specialises an integer argument that is 1 or a multiple of 16: one count of each kind.
ZERO_KV_BLOCK_COUNTS = (1, 2, 16)
DECODE_ROWS = (1, 2, 16)
# A step's prompt rows follow its decode rows: after none the rows' pointer is aligned, after one it is not (for a
# block table of one int32 column, the short-conv group's layout).
PROMPT_ROW_OFFSETS = (0, 1)
PROMPTS = 2
PROMPT_TOKENS = 3


def short_conv_layers(runner: Any) -> list[Any]:
    """The short-conv layers of ``runner``'s model (vLLM's ``ShortConv``), in its static forward context."""
    from vllm.model_executor.layers.mamba.short_conv import ShortConv

    context = getattr(getattr(runner, "compilation_config", None), "static_forward_context", None) or {}
    return [layer for layer in context.values() if isinstance(layer, ShortConv)]


def block_table_width(runner: Any, layer: Any) -> int:
    """Columns of the block table of the KV-cache group that holds ``layer`` (the state indices' row stride)."""
    for index, group in enumerate(runner.kv_cache_config.kv_cache_groups):
        if layer.prefix in group.layer_names:
            return int(runner.input_batch.block_table[index].block_table.gpu.shape[1])
    raise LookupError(f"no KV-cache group holds {layer.prefix}")


def _conv_state(layer: Any) -> torch.Tensor:
    from vllm.model_executor.layers.mamba.mamba_utils import is_conv_state_dim_first

    state = layer.kv_cache[0]
    return state if is_conv_state_dim_first() else state.transpose(-1, -2)


def _table_rows(width: int, offset: int, rows: int, device: torch.device) -> torch.Tensor:
    """``rows`` rows of a block table ``width`` columns wide after ``offset`` others, every entry the null block."""
    from vllm.v1.attention.backends.utils import NULL_BLOCK_ID

    return torch.full((offset + rows, width), NULL_BLOCK_ID, dtype=torch.int32, device=device)[offset:]


def warm_prefill_conv(layer: Any, width: int) -> None:
    from vllm.model_executor.layers.mamba.ops.causal_conv1d import causal_conv1d_fn

    weight = layer.conv.weight.view(layer.conv.weight.size(0), layer.conv.weight.size(2))
    device, dim = weight.device, weight.size(0)
    lengths = torch.full((PROMPTS,), PROMPT_TOKENS, dtype=torch.int32, device=device)
    query_start_loc = torch.nn.functional.pad(lengths.cumsum(0, dtype=torch.int32), (1, 0))
    for offset in PROMPT_ROW_OFFSETS:
        # vLLM passes the gated input transposed: [tokens, dim] in memory, [dim, tokens] as seen.
        x = torch.zeros(PROMPTS * PROMPT_TOKENS, dim, dtype=layer.in_proj.weight.dtype, device=device).transpose(0, 1)
        causal_conv1d_fn(
            x,
            weight,
            layer.conv.bias,
            activation=None,
            conv_states=_conv_state(layer),
            has_initial_state=torch.zeros(PROMPTS, dtype=torch.bool, device=device),
            cache_indices=_table_rows(width, offset, PROMPTS, device)[:, 0],
            query_start_loc=query_start_loc,
        )


def warm_decode_conv(layer: Any, width: int) -> None:
    from vllm.model_executor.layers.mamba.ops.causal_conv1d import causal_conv1d_update

    weight = layer.conv.weight.view(layer.conv.weight.size(0), layer.conv.weight.size(2))
    for rows in DECODE_ROWS:
        x = torch.zeros(rows, weight.size(0), dtype=layer.in_proj.weight.dtype, device=weight.device)
        causal_conv1d_update(
            x,
            _conv_state(layer),
            weight,
            layer.conv.bias,
            activation=None,
            conv_state_indices=_table_rows(width, 0, rows, weight.device)[:, :1],
        )


def warm_zero_kv_blocks(runner: Any) -> bool:
    """Zero the first blocks of the KV cache (nothing holds them before the server serves); False without a
    zeroer (a model whose blocks need no zeroing)."""
    zeroer = getattr(runner, "_kv_block_zeroer", None) or getattr(runner, "kv_block_zeroer", None)
    if zeroer is None or getattr(zeroer, "_meta", None) is None:
        return False
    for count in ZERO_KV_BLOCK_COUNTS:
        zeroer.zero_block_ids(list(range(count)))
    return True


def warm_up(runner: Any) -> list[str]:
    """Warm the kernels above for ``runner`` (a GPU model runner with its KV caches bound); returns what was warmed.

    A model without short-conv layers warms nothing. Runs on CUDA only (vLLM's CPU path has no Triton kernels)."""
    device = getattr(runner, "device", None)
    if device is None or torch.device(device).type != "cuda":
        return []
    layers = short_conv_layers(runner)
    if not layers:
        return []
    steps: list[tuple[str, Callable[[], object]]] = [("zero kv blocks", lambda: warm_zero_kv_blocks(runner))]
    try:
        width = block_table_width(runner, layers[0])
    except (AttributeError, LookupError, IndexError) as exc:
        logger.warning("short-conv Triton warm-up: no block table for %s (%s); conv kernels not warmed", layers[0], exc)
    else:
        steps += [
            ("prefill conv", lambda: warm_prefill_conv(layers[0], width)),
            ("decode conv", lambda: warm_decode_conv(layers[0], width)),
        ]
    warmed = []
    with torch.inference_mode():
        for name, call in steps:
            try:
                if call() is not False:
                    warmed.append(name)
            except Exception as exc:  # a warm-up never stops a server: its first steps are then slower
                logger.warning("short-conv Triton warm-up: %s failed, not warmed: %s", name, exc)
        torch.cuda.synchronize(device)
    return warmed
