"""LFM2's short convolution with only the convolution over the cached state left outside the compiled graph.

vLLM's ``ShortConv`` is one splitting op (``vllm::short_conv``): in a step that mixes prefill and decode rows the
piecewise CUDA graphs run around it and the whole layer runs eagerly, ten times a step: in_proj, the gates, both
Triton convolution kernels through Triton's launcher, out_proj. On an H100 that eager work was ~9 ms of a ~29-ms
traced prefill step against ~1.4 ms of GPU time (docs/BENCHMARKS.md, sixtieth set). ``LeanShortConv`` keeps in_proj,
the gates and out_proj in the graph and makes only the convolution a splitting op (``vllm::kani_short_conv_mix``):
the same arithmetic in the same order, fewer eager Python calls and launches a mixed step.

Opt-in per stage (``additional_config: {kani_lean_short_conv: true}``); the layers keep vLLM's parameters, state
layout and metadata, so checkpoints load and the KV manager sizes the state as for ``ShortConv``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from vllm.forward_context import get_forward_context
from vllm.model_executor.layers.mamba.mamba_utils import is_conv_state_dim_first
from vllm.model_executor.layers.mamba.ops.causal_conv1d import causal_conv1d_fn, causal_conv1d_update
from vllm.model_executor.layers.mamba.ops.cpu.causal_conv1d import causal_conv1d_torch, causal_conv1d_update_torch
from vllm.model_executor.layers.mamba.short_conv import ShortConv
from vllm.platforms import current_platform
from vllm.utils.torch_utils import direct_register_custom_op

from vllm_omni_kani.model_executor.models.kani_tts.configuration import boolean_key

# The splitting op's qualified name: ``patch.split_graphs_at_the_lean_short_conv`` adds it to vLLM's list of ops that
# piecewise compilation splits at.
OP_NAME = "kani_short_conv_mix"
SPLITTING_OP = f"vllm::{OP_NAME}"
CONFIG_KEY = "kani_lean_short_conv"


def enabled(additional_config: Mapping[str, Any]) -> bool:
    """Whether a stage's ``additional_config`` turns the lean layers on (ValueError unless a YAML boolean)."""
    return boolean_key(additional_config, CONFIG_KEY)


class LeanShortConv(ShortConv):
    """``ShortConv`` whose eager part is the convolution alone (``forward``); ``ShortConv.__init__`` builds it."""

    def forward(self, hidden_states: torch.Tensor, output: torch.Tensor) -> None:
        bcx, _ = self.in_proj(hidden_states)
        b, c, x = bcx.chunk(3, dim=-1)
        gated = b * x
        # Zeros, not empty: rows past the step's tokens (CUDA-graph padding) stay finite through out_proj.
        mixed = torch.zeros_like(gated)
        torch.ops.vllm.kani_short_conv_mix(gated, mixed, self.prefix)
        projected, _ = self.out_proj(c * mixed)
        output.copy_(projected)

    def mix(self, gated: torch.Tensor, mixed: torch.Tensor) -> None:
        """``mixed[:tokens]`` = the causal convolution of ``gated`` (tokens, dim) over each request's cached state,
        which it advances; decode rows first, as vLLM orders a batch."""
        metadata = get_forward_context().attn_metadata
        if metadata is None:  # the memory-profiling run: no state yet
            mixed.copy_(gated)
            return
        assert isinstance(metadata, dict)
        m = metadata[self.prefix]
        conv_state = self.kv_cache[0] if is_conv_state_dim_first() else self.kv_cache[0].transpose(-1, -2)
        weights = self.conv.weight.view(self.conv.weight.size(0), self.conv.weight.size(2))
        decodes, prefill_tokens = m.num_decode_tokens, m.num_prefill_tokens
        tokens = decodes + prefill_tokens
        if current_platform.is_cpu():
            _mix_reference(m, gated, mixed, conv_state, weights, self.conv.bias, decodes, tokens)
            return
        if m.num_prefills > 0:
            # (dim, tokens) with the channels last in memory, as the prefill kernel requires.
            prompt = gated[decodes:tokens].transpose(0, 1)
            out = causal_conv1d_fn(
                prompt,
                weights,
                self.conv.bias,
                activation=None,
                conv_states=conv_state,
                has_initial_state=m.has_initial_states_p,
                cache_indices=m.state_indices_tensor_p,
                metadata=m,
                query_start_loc=m.query_start_loc_p,
            )
            mixed[decodes:tokens] = out.transpose(0, 1)[:prefill_tokens]
        if decodes > 0:
            # The update kernel writes its output over its input: give it the output's rows (contiguous).
            rows = mixed[:decodes]
            rows.copy_(gated[:decodes])
            causal_conv1d_update(
                rows, conv_state, weights, self.conv.bias, activation=None, conv_state_indices=m.state_indices_tensor_d
            )


def _mix_reference(
    m: Any,
    gated: torch.Tensor,
    mixed: torch.Tensor,
    conv_state: torch.Tensor,
    weights: torch.Tensor,
    bias: torch.Tensor | None,
    decodes: int,
    tokens: int,
) -> None:
    """The CPU build's convolution: vLLM's reference torch kernels, as ``ShortConv.forward_native`` calls them."""
    if m.num_prefills > 0:
        out = causal_conv1d_torch(
            gated[decodes:tokens].transpose(0, 1),
            weights,
            bias,
            conv_state,
            m.query_start_loc_p,
            m.state_indices_tensor_p.flatten(),
            m.has_initial_states_p,
            activation=None,
        )
        mixed[decodes:tokens] = out.transpose(0, 1)[: tokens - decodes]
    if decodes > 0:
        rows = m.state_indices_tensor_d.flatten()
        state = conv_state[rows]  # a copy: updated here, then written back
        out = causal_conv1d_update_torch(gated[:decodes].unsqueeze(-1), state, weights, bias, activation=None)
        conv_state[rows] = state
        mixed[:decodes] = out.squeeze(-1)


def _short_conv_mix(gated: torch.Tensor, mixed: torch.Tensor, layer_name: str) -> None:
    get_forward_context().no_compile_layers[layer_name].mix(gated, mixed)


def _short_conv_mix_fake(gated: torch.Tensor, mixed: torch.Tensor, layer_name: str) -> None:
    return None


direct_register_custom_op(
    op_name=OP_NAME,
    op_func=_short_conv_mix,
    mutates_args=["mixed"],
    fake_impl=_short_conv_mix_fake,
)


def make_lean(model: torch.nn.Module) -> int:
    """Turn every ``ShortConv`` of ``model`` into a ``LeanShortConv`` in place (same parameters, same registration
    in the forward context); returns how many."""
    layers = [module for module in model.modules() if type(module) is ShortConv]
    for module in layers:
        module.__class__ = LeanShortConv
    return len(layers)
