"""Write a complete random-weight Kani checkpoint that the real loaders read like a trained one.

``vllm-omni-kani make-checkpoint OUT --preset {tiny,350m} --variant {parallel,flattened}``

The directory holds ``config.json`` (every LFM2 field vLLM reads plus the ``kani_tts`` block),
``model.safetensors`` in HF names, ``generation_config.json`` and a real tokenizer. Extra parts
(the codec) are written by the functions in :data:`CHECKPOINT_PARTS`.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import Lfm2Config, Lfm2ForCausalLM

from vllm_omni_kani.model_executor.models.kani_tts import token_layout as tl
from vllm_omni_kani.model_executor.models.kani_tts.configuration import (
    CONFIG_KEY,
    FLATTENED_ARCH,
    PARALLEL_ARCH,
    KaniTTSSettings,
)
from vllm_omni_kani.model_executor.models.kani_tts.modeling_hf import ParallelHeadLfm2ForCausalLM
from vllm_omni_kani.tools.codec_factory import write_codec_part
from vllm_omni_kani.tools.tokenizer_factory import write_tokenizer

VARIANTS = ("parallel", "flattened")
SPEAKERS = ("andrew", "katie", "nova_kani", "leo")


@dataclass(frozen=True)
class Preset:
    hidden_size: int
    num_hidden_layers: int
    attention_layers: tuple[int, ...]
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    block_multiple_of: int
    dtype: str
    init_std: float


PRESETS: dict[str, Preset] = {
    # The real LFM2-350M shape (Kani-TTS-370m's backbone).
    "350m": Preset(1024, 16, (2, 5, 8, 10, 12, 14), 16, 8, 6656, 256, "bfloat16", 0.02),
    # Same hybrid structure in a few MB; head_dim 32 is the smallest the vLLM CPU attention
    # kernels take; float32 so parity tests compare like with like; weights wide enough (std 0.1)
    # that greedy decoding walks through many different codes instead of repeating one.
    "tiny": Preset(64, 6, (2, 5), 2, 1, 192, 32, "float32", 0.1),
}


class CheckpointError(Exception):
    """Bad factory input: reported without a traceback."""


def lfm2_config(preset: Preset, variant: str) -> Lfm2Config:
    """Every field vLLM 0.26's LFM2 reads, with the architecture of the variant."""
    vocab = tl.PARALLEL_VOCAB_SIZE if variant == "parallel" else tl.FLATTENED_VOCAB_SIZE
    layer_types = [
        "full_attention" if i in preset.attention_layers else "conv" for i in range(preset.num_hidden_layers)
    ]
    settings = KaniTTSSettings(variant=variant, speakers=SPEAKERS, default_speaker=SPEAKERS[0])
    return Lfm2Config(
        architectures=[PARALLEL_ARCH if variant == "parallel" else FLATTENED_ARCH],
        vocab_size=vocab,
        hidden_size=preset.hidden_size,
        intermediate_size=preset.intermediate_size,
        num_hidden_layers=preset.num_hidden_layers,
        num_attention_heads=preset.num_attention_heads,
        num_key_value_heads=preset.num_key_value_heads,
        max_position_embeddings=128000,
        norm_eps=1e-5,
        rope_parameters={"rope_theta": 1000000.0, "rope_type": "default"},
        conv_bias=False,
        conv_L_cache=3,
        block_multiple_of=preset.block_multiple_of,
        block_ffn_dim_multiplier=1.0,
        block_auto_adjust_ff_dim=True,
        layer_types=layer_types,
        full_attn_idxs=list(preset.attention_layers),
        # LFM2 names its block and conv widths separately from hidden_size.
        block_dim=preset.hidden_size,
        block_ff_dim=preset.intermediate_size,
        conv_dim=preset.hidden_size,
        conv_dim_out=preset.hidden_size,
        tie_word_embeddings=True,
        pad_token_id=tl.PAD,
        bos_token_id=tl.START_OF_TEXT,
        eos_token_id=tl.END_OF_SPEECH,
        dtype=preset.dtype,
        initializer_range=preset.init_std,
        **{CONFIG_KEY: settings.to_json_dict()},
    )


def _write_backbone(out: Path, preset_name: str, variant: str, seed: int) -> None:
    preset = PRESETS[preset_name]
    config = lfm2_config(preset, variant)
    torch.manual_seed(seed)
    model_cls = ParallelHeadLfm2ForCausalLM if variant == "parallel" else Lfm2ForCausalLM
    model = model_cls(config).to(getattr(torch, preset.dtype))
    model.save_pretrained(out, safe_serialization=True)
    generation = {
        "bos_token_id": tl.START_OF_TEXT,
        "eos_token_id": tl.END_OF_SPEECH,
        "pad_token_id": tl.PAD,
        "do_sample": True,
        "temperature": config.kani_tts["sampling"]["temperature"],
        "top_p": config.kani_tts["sampling"]["top_p"],
        "repetition_penalty": config.kani_tts["sampling"]["repetition_penalty"],
    }
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")


def _write_tokenizer(out: Path, preset_name: str, variant: str, seed: int) -> None:
    write_tokenizer(out)


# Each part writes into the checkpoint directory; later parts (the codec) append here.
CheckpointPart = Callable[[Path, str, str, int], None]
CHECKPOINT_PARTS: list[CheckpointPart] = [_write_backbone, _write_tokenizer, write_codec_part]


def make_checkpoint(out: Path | str, preset: str, variant: str, seed: int = 0, force: bool = False) -> Path:
    """Write a checkpoint directory and return its path."""
    out = Path(out)
    if preset not in PRESETS:
        raise CheckpointError(f"unknown preset {preset!r}; choose one of: {', '.join(PRESETS)}")
    if variant not in VARIANTS:
        raise CheckpointError(f"unknown variant {variant!r}; choose one of: {', '.join(VARIANTS)}")
    if out.exists() and not out.is_dir():
        raise CheckpointError(f"{out} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise CheckpointError(f"{out} is not empty; pass --force to overwrite it")
    out.mkdir(parents=True, exist_ok=True)
    for part in CHECKPOINT_PARTS:
        part(out, preset, variant, seed)
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("out", type=Path, help="directory to write (created; must be empty unless --force)")
    parser.add_argument("--preset", default="tiny", help=f"model size: {', '.join(PRESETS)}")
    parser.add_argument("--variant", default="parallel", help=f"head layout: {', '.join(VARIANTS)}")
    parser.add_argument("--seed", type=int, default=0, help="seed for the random weights")
    parser.add_argument("--force", action="store_true", help="write into a non-empty directory")


def run(args: argparse.Namespace) -> int:
    try:
        path = make_checkpoint(args.out, args.preset, args.variant, args.seed, args.force)
    except CheckpointError as exc:
        print(f"make-checkpoint: error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {args.preset} {args.variant} checkpoint to {path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vllm_omni_kani.tools.make_checkpoint", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
