"""The vLLM-Omni platform for CPU-only machines: vLLM's ``CpuPlatform`` plus the Omni interface.

vLLM's ``CpuPlatform`` already knows the device (``cpu``), the distributed backend (gloo), the device-control
variable (``CPU_VISIBLE_MEMORY_NODES``: a stage's ``devices: "0"`` selects NUMA node 0) and that memory cannot be
pinned. What Omni adds is which workers run its stages and a few device queries; here they all have CPU answers
that touch nothing CUDA-only.

Worker classes are named by string only: importing them here would import vLLM-Omni's GPU model runner, which
resolves the current Omni platform at import time, i.e. this module while it is still loading.
"""

from __future__ import annotations

import torch
from vllm.platforms.cpu import CpuPlatform
from vllm.utils.cpu_resource_utils import get_memory_node_info, get_visible_memory_node
from vllm_omni.platforms.interface import OmniPlatform, OmniPlatformEnum

_WORKERS = "vllm_omni_kani.platforms.cpu.worker"


def _visible_nodes() -> list[int]:
    # An invalid CPU_VISIBLE_MEMORY_NODES filters down to nothing; node 0 is what the worker would use anyway.
    return get_visible_memory_node() or [0]


class CPUOmniPlatform(OmniPlatform, CpuPlatform):
    """Omni on vLLM's CPU platform. MRO: OmniPlatform → CpuPlatform → Platform; the two share no method."""

    _omni_enum = OmniPlatformEnum.OOT

    @classmethod
    def get_omni_ar_worker_cls(cls) -> str:
        return f"{_WORKERS}.CPUARWorker"

    @classmethod
    def get_omni_generation_worker_cls(cls) -> str:
        return f"{_WORKERS}.CPUGenerationWorker"

    @classmethod
    def get_default_stage_config_path(cls) -> str:
        # Same lookup as on GPU (relative to site-packages); a CPU run normally names its own --deploy-config.
        return "vllm_omni/deploy"

    @classmethod
    def get_diffusion_attn_backend_cls(
        cls, selected_backend: str | None, head_size: int, allow_trtllm_default: bool = False
    ) -> str:
        # SDPA is the only diffusion attention backend with a CPU kernel; a requested GPU backend cannot run here.
        from vllm_omni.diffusion.attention.backends.registry import DiffusionAttentionBackendEnum

        return DiffusionAttentionBackendEnum.TORCH_SDPA.get_path()

    @classmethod
    def supports_torch_inductor(cls) -> bool:
        # Models that compile sub-modules when inductor is available stay eager: compiling on a few cores costs
        # minutes at startup for no gain at the batch sizes a CPU serves.
        return False

    @classmethod
    def get_torch_device(cls, local_rank: int | None = None) -> torch.device:
        # Never indexed: vLLM's CPU model runner asserts ``device == torch.device("cpu")``.
        return torch.device("cpu")

    @classmethod
    def get_device_count(cls) -> int:
        # One "device" per visible NUMA node, like vLLM's CPU worker; never 0, so Omni's per-device init lock and
        # device arithmetic behave as on a one-GPU machine.
        return len(_visible_nodes())

    @classmethod
    def get_device_version(cls) -> str | None:
        return None

    @classmethod
    def synchronize(cls) -> None:
        # CPU kernels are synchronous.
        return None

    @classmethod
    def empty_cache(cls) -> None:
        # The system allocator has no cache to drop. Without this, Platform.__getattr__ falls through to the
        # non-existent ``torch.cpu.empty_cache`` and callers get ``None()`` → TypeError.
        return None

    @classmethod
    def get_free_memory(cls, device: torch.device | None = None) -> int:
        return cls.get_device_memory(device)[0]

    @classmethod
    def get_device_memory(cls, device: torch.device | None = None) -> tuple[int, int]:
        """(available, total) bytes of the visible NUMA nodes, clamped to the cgroup limit."""
        infos = [get_memory_node_info(node) for node in _visible_nodes()]
        return sum(i.available_memory for i in infos), sum(i.total_memory for i in infos)

    @classmethod
    def set_device_control_env_var(cls, devices: str | int | None) -> None:
        # The base class assigns the value to os.environ directly, which rejects ints and None.
        if devices is None:
            cls.unset_device_control_env_var()
        else:
            super().set_device_control_env_var(str(devices))
