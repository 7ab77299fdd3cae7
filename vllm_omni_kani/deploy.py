"""Which deploy YAML and checkpoint to use when the user names none."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

STAGE_CONFIGS = Path(__file__).resolve().parents[1] / "stage_configs"
GPU_CONFIG = "kani_tts.yaml"
CPU_CONFIG = "kani_tts_cpu.yaml"
# Where `scripts/serve.sh` and the examples put the factory checkpoint when none is given.
DEFAULT_CHECKPOINT_DIR = Path(__file__).resolve().parents[1] / "checkpoints"


def has_nvidia_gpu() -> bool:
    """True when an NVIDIA driver answers (the same test ``scripts/setup.sh`` uses)."""
    if shutil.which("nvidia-smi") is None:
        return False
    return subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode == 0


def default_deploy_config() -> Path:
    return STAGE_CONFIGS / (GPU_CONFIG if has_nvidia_gpu() else CPU_CONFIG)


def default_checkpoint(preset: str | None = None, variant: str = "parallel") -> Path:
    """A factory checkpoint (random weights) under ``checkpoints/``, written on first use.

    ``350m`` (the real LFM2-350M shape) on a GPU machine, ``tiny`` elsewhere.
    """
    from vllm_omni_kani.tools.make_checkpoint import make_checkpoint

    preset = preset or ("350m" if has_nvidia_gpu() else "tiny")
    out = DEFAULT_CHECKPOINT_DIR / f"kani-{preset}-{variant}"
    if not (out / "config.json").exists():
        make_checkpoint(out, preset=preset, variant=variant, force=True)
    return out


def main() -> None:
    """Print the default checkpoint (made if missing) and deploy YAML, one per line (for shell scripts)."""
    print(default_checkpoint())
    print(default_deploy_config())


if __name__ == "__main__":
    main()
