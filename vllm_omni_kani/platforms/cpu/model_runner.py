"""Omni model runners on vLLM's CPU model runner.

``class CPUARModelRunner(GPUARModelRunner, CPUModelRunner)`` puts Omni's runner first so that its overrides
(``load_model`` with the Omni post-load hooks, ``execute_model``/``sample_tokens`` with multimodal outputs and
inter-stage payloads, the async-chunk connectors) run, and each of their ``super()`` calls lands in vLLM's CPU
runner before the GPU one. The resulting order is::

    CPUARModelRunner → _CPURunnerFixups → GPUARModelRunner → OmniGPUModelRunner → CPUModelRunner → GPUModelRunner

so the CPU runner supplies ``load_model``, ``_to_list``, ``_sync_device``, ``warming_up_model``,
``initialize_kv_cache`` and the buffer aliasing, and Omni supplies everything Omni-specific.
"""

from __future__ import annotations

import torch
from vllm.config import VllmConfig
from vllm.v1.worker.cpu_model_runner import CPUModelRunner
from vllm_omni.worker.gpu_ar_model_runner import GPUARModelRunner
from vllm_omni.worker.gpu_generation_model_runner import GPUGenerationModelRunner

from vllm_omni_kani import patch
from vllm_omni_kani.platforms.cpu import kernels


class _CPURunnerFixups:
    """What both Omni runners need beyond the MRO on CPU."""

    def __init__(self, vllm_config: VllmConfig, device: torch.device) -> None:
        kernels.check_weights_supported(vllm_config.model_config.hf_config)
        patch.default_cudagraph_capture_size_on_cpu(vllm_config)
        super().__init__(vllm_config, device)  # type: ignore[call-arg]
        # The CPU runner aliases each buffer's device half to its CPU half, but it does so inside Omni's
        # super().__init__(), before Omni creates its own buffers; alias those too (idempotent).
        self._postprocess_tensors()  # type: ignore[attr-defined]

    def load_model(self, *args: object, **kwargs: object) -> None:
        super().load_model(*args, **kwargs)  # type: ignore[misc]
        # Omni's post-load hooks may add buffers (talker MTP); keep every buffer CPU-only.
        self._postprocess_tensors()  # type: ignore[attr-defined]

    def capture_model(self) -> int:
        # No graphs on CPU. vLLM's CPU worker never calls this; it is here so no path can reach CUDA capture.
        return 0


class CPUARModelRunner(_CPURunnerFixups, GPUARModelRunner, CPUModelRunner):
    """Autoregressive Omni stages (LM, talker) on CPU."""

    def _should_use_async_omni_output(self) -> bool:
        # The async output path copies payloads on CUDA streams and events. vLLM's CPU platform already turns
        # async scheduling off (which makes Omni return False), so this only keeps it off if that ever changes.
        return False


class CPUGenerationModelRunner(_CPURunnerFixups, GPUGenerationModelRunner, CPUModelRunner):
    """Non-autoregressive Omni stages (codec decoders) on CPU."""
