"""Write a complete random-weight Kani checkpoint that the real loaders read like a trained one.

``vllm-omni-kani make-checkpoint OUT --preset {tiny,350m} --variant {parallel,flattened,v2}``

The directory holds ``config.json`` (every LFM2 field vLLM reads plus the ``kani_tts`` block),
``model.safetensors`` in HF names, ``generation_config.json`` and a real tokenizer. Extra parts
(the codec) are written by the functions in :data:`CHECKPOINT_PARTS`.

``v2`` is a Kani-TTS-2 checkpoint as the official ``kani-tts-2`` package writes one: no ``kani_tts``
block, ``architectures: [KaniTTS2ForCausalLM]``, the frame-level fields at the top of ``config.json``,
language tags in ``language_settings``, and the speaker projection and per-layer RoPE scales among the
weights (``model.speaker_emb_projection.weight``, ``model.learnable_rope_layers.{i}.alpha_weight``). It also gets a
random-weight speaker model in ``speaker_model/`` (``speaker_model_factory.py``), which turns reference audio into
the speaker embedding.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from transformers import Lfm2Config, Lfm2ForCausalLM

from vllm_omni_kani.model_executor.models.kani_tts import token_layout as tl
from vllm_omni_kani.model_executor.models.kani_tts.configuration import (
    CONFIG_KEY,
    FLATTENED_ARCH,
    PARALLEL_ARCH,
    V2_ARCH,
    FrameLevelSettings,
    KaniTTSSettings,
    SamplingDefaults,
)
from vllm_omni_kani.model_executor.models.kani_tts.modeling_hf import ParallelHeadLfm2ForCausalLM
from vllm_omni_kani.tools.codec_factory import write_codec_part
from vllm_omni_kani.tools.speaker_model_factory import write_speaker_model_part
from vllm_omni_kani.tools.tokenizer_factory import write_tokenizer

VARIANTS = ("parallel", "flattened", "v2")
SPEAKERS = ("andrew", "katie", "nova_kani", "leo")
# What factory parallel/flattened checkpoints ask for (their kani_tts.sampling block).
FACTORY_SAMPLING = SamplingDefaults(temperature=0.6, top_p=0.95, top_k=-1, repetition_penalty=1.1)
# Kani-TTS-2: learnable RoPE, and half a position per audio frame so that frame positions are not integers.
V2_SETTINGS = FrameLevelSettings(audio_step=0.5, use_learnable_rope=True)
V2_LANGUAGES = ("en", "de", "es")


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
    if variant == "v2":  # stock: what the official package reads, nothing of this project's
        extra = {
            **V2_SETTINGS.to_config_fields(),
            "language_settings": {"status": "available_language_tags", "language_tags_list": list(V2_LANGUAGES)},
        }
    else:
        settings = KaniTTSSettings(
            variant=variant, speakers=SPEAKERS, default_speaker=SPEAKERS[0], sampling=FACTORY_SAMPLING
        )
        extra = {CONFIG_KEY: settings.to_json_dict()}
    arch = {"parallel": PARALLEL_ARCH, "flattened": FLATTENED_ARCH, "v2": V2_ARCH}[variant]
    return Lfm2Config(
        architectures=[arch],
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
        **extra,
    )


def v2_tensors(config: Lfm2Config, std: float, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Kani-TTS-2's weights beyond LFM2's, in the official names: the speaker projection and one RoPE scale
    per attention layer (spread around 0 so that every layer gets its own α)."""
    settings = FrameLevelSettings.from_hf_config(config)
    tensors = {
        "model.speaker_emb_projection.weight": torch.randn(config.hidden_size, settings.speaker_emb_dim) * std,
    }
    for i, kind in enumerate(config.layer_types):
        if kind == "full_attention" and settings.use_learnable_rope:
            tensors[f"model.learnable_rope_layers.{i}.alpha_weight"] = torch.randn(()) * 1.5
    return {name: t.to(dtype) for name, t in tensors.items()}


def _write_backbone(out: Path, preset_name: str, variant: str, seed: int) -> None:
    preset = PRESETS[preset_name]
    config = lfm2_config(preset, variant)
    torch.manual_seed(seed)
    model_cls = ParallelHeadLfm2ForCausalLM if variant == "parallel" else Lfm2ForCausalLM
    dtype = getattr(torch, preset.dtype)
    model = model_cls(config).to(dtype)
    model.save_pretrained(out, safe_serialization=True)
    generation = {"bos_token_id": tl.START_OF_TEXT, "eos_token_id": tl.END_OF_SPEECH, "pad_token_id": tl.PAD}
    if variant == "v2":
        # save_pretrained names the class that wrote it; the checkpoint names the official one.
        config_json = out / "config.json"
        written = json.loads(config_json.read_text())
        config_json.write_text(json.dumps({**written, "architectures": [V2_ARCH]}, indent=2) + "\n")
        weights = out / "model.safetensors"
        save_file(
            {**load_file(weights), **v2_tensors(config, preset.init_std, dtype)}, weights, metadata={"format": "pt"}
        )
    else:
        sampling = config.kani_tts["sampling"]
        generation |= {"do_sample": True, **{k: sampling[k] for k in ("temperature", "top_p", "repetition_penalty")}}
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")


def _write_tokenizer(out: Path, preset_name: str, variant: str, seed: int) -> None:
    write_tokenizer(out)


# Each part writes into the checkpoint directory; later parts (the codec, the speaker model) append here.
CheckpointPart = Callable[[Path, str, str, int], None]
CHECKPOINT_PARTS: list[CheckpointPart] = [_write_backbone, _write_tokenizer, write_codec_part, write_speaker_model_part]


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
    parser.add_argument(
        "--variant", default="parallel", help=f"head layout or family: {', '.join(VARIANTS)} (v2 = Kani-TTS-2)"
    )
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
