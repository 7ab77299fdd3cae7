"""Write a random-weight LoRA adapter for a Kani checkpoint, in PEFT's format, for LoRA voices.

``vllm-omni-kani make-lora CKPT OUT [--rank 8] [--seed 0]``

The adapter is what ``peft`` saves for an LFM2 fine-tune: ``adapter_config.json`` (``peft_type: LORA``, ``r``,
``lora_alpha``, ``target_modules``) and ``adapter_model.safetensors`` with ``base_model.model.<module>.lora_A.weight``
``[r, in]`` and ``lora_B.weight`` ``[out, r]`` for every targeted linear layer of the backbone, in Hugging Face
names (vLLM maps LFM2's ``.conv.`` to ``.short_conv.`` and packs q/k/v and w1/w3 itself). Shapes come from the
checkpoint's own ``model.safetensors``, so it fits any LFM2 size.

The targets are the LFM2 linears vLLM's LoRA layers serve: attention ``q_proj``/``k_proj``/``v_proj``/``out_proj``,
short-conv ``in_proj``/``out_proj`` and the MLP's ``w1``/``w2``/``w3``; never the depthwise conv kernel, the
embeddings or the codebook heads. ``lora_B`` is nonzero (PEFT initialises it to zero, which would be the base
model), scaled to the size of each base weight so that the adapter changes what the model generates.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

# LFM2 linear layers (Hugging Face names) that vLLM 0.26 serves with LoRA.
LFM2_LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "out_proj", "in_proj", "w1", "w2", "w3")
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
_PEFT_PREFIX = "base_model.model."


class LoRAFactoryError(Exception):
    """Bad factory input: reported without a traceback."""


def _base_weights(checkpoint: Path) -> dict[str, tuple[tuple[int, ...], torch.dtype, float]]:
    """``{module name: (shape, dtype, std)}`` of every 2-D targetable weight in the checkpoint."""
    files = sorted(checkpoint.glob("*.safetensors"))
    if not files:
        raise LoRAFactoryError(f"{checkpoint} has no *.safetensors weights")
    found = {}
    for file in files:
        with safe_open(file, framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                module = name.removesuffix(".weight")
                if not name.endswith(".weight") or module.rsplit(".", 1)[-1] not in LFM2_LORA_TARGETS:
                    continue
                tensor = f.get_tensor(name)
                if tensor.ndim == 2:
                    found[module] = (tuple(tensor.shape), tensor.dtype, float(tensor.float().std()))
    if not found:
        raise LoRAFactoryError(f"{checkpoint} has none of the LFM2 linears {', '.join(LFM2_LORA_TARGETS)}")
    return found


def make_lora_adapter(
    checkpoint: Path | str,
    out: Path | str,
    rank: int = 8,
    seed: int = 0,
    alpha: int | None = None,
    force: bool = False,
) -> Path:
    """Write a random LoRA adapter for ``checkpoint`` into ``out`` and return ``out``."""
    checkpoint, out = Path(checkpoint), Path(out)
    if rank <= 0:
        raise LoRAFactoryError(f"rank must be >= 1, got {rank}")
    if out.exists() and not out.is_dir():
        raise LoRAFactoryError(f"{out} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise LoRAFactoryError(f"{out} is not empty; pass --force to overwrite it")
    alpha = 2 * rank if alpha is None else alpha
    scaling = alpha / rank
    base = _base_weights(checkpoint)
    generator = torch.Generator().manual_seed(seed)
    tensors: dict[str, torch.Tensor] = {}
    for module, ((rows, cols), dtype, std) in sorted(base.items()):
        # A x is about unit size per rank for inputs of unit size; B (A x) · scaling then has the spread of the base
        # weight's own outputs, so every targeted layer's output moves by about as much as the layer itself gives.
        lora_a = torch.randn(rank, cols, generator=generator) / math.sqrt(cols)
        lora_b = torch.randn(rows, rank, generator=generator) * (std * math.sqrt(cols / rank) / scaling)
        tensors[f"{_PEFT_PREFIX}{module}.lora_A.weight"] = lora_a.to(dtype).contiguous()
        tensors[f"{_PEFT_PREFIX}{module}.lora_B.weight"] = lora_b.to(dtype).contiguous()
    targets = sorted({module.rsplit(".", 1)[-1] for module in base})
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": str(checkpoint),
        "r": rank,
        "lora_alpha": alpha,
        "lora_dropout": 0.0,
        "target_modules": targets,
        "bias": "none",
        "fan_in_fan_out": False,
        "modules_to_save": None,
        "use_rslora": False,
        "use_dora": False,
        "inference_mode": True,
    }
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, out / ADAPTER_WEIGHTS, metadata={"format": "pt"})
    (out / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2) + "\n")
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", type=Path, help="the Kani checkpoint the adapter is for")
    parser.add_argument("out", type=Path, help="adapter directory to write (created; must be empty unless --force)")
    parser.add_argument("--rank", type=int, default=8, help="LoRA rank r (serve with max_lora_rank >= this)")
    parser.add_argument("--alpha", type=int, default=None, help="lora_alpha (default: 2 x rank)")
    parser.add_argument("--seed", type=int, default=0, help="seed for the random weights")
    parser.add_argument("--force", action="store_true", help="write into a non-empty directory")


def run(args: argparse.Namespace) -> int:
    try:
        path = make_lora_adapter(args.checkpoint, args.out, args.rank, args.seed, args.alpha, args.force)
    except LoRAFactoryError as exc:
        print(f"make-lora: error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote a rank-{args.rank} LoRA adapter for {args.checkpoint} to {path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vllm_omni_kani.tools.lora_factory", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
