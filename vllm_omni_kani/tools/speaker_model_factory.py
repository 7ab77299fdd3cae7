"""Write a random-weight Kani-TTS-2 speaker model, the way the official one ships (a transformers WavLM folder).

The real model (``nineninesix/speaker-emb-tbr``) is WavLM-large with the official top layers. This one keeps the
parts every reader depends on: hidden size 1,024 (the official top layers take exactly 2,048 pooled statistics),
WavLM-large's layer-normed feature encoder and stable-layer-norm encoder, the 320-sample frame hop and 128 output
floats. It is thin everywhere else (one encoder layer, 32 conv channels; ~6 M parameters, float32), so CPU tests
embed a clip in well under a second.

The BatchNorm statistics of the top layers are measured on synthetic clips (tones and noise), as training would
have set them, so different clips get clearly different embeddings instead of near-identical ReLU outputs.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from transformers import WavLMConfig

from vllm_omni_kani.model_executor.models.kani_tts.speaker_embedder import (
    SAMPLE_RATE,
    SPEAKER_MODEL_SUBDIR,
    SpeakerEmbeddingModel,
)

EMBEDDING_DIM = 128
# Offset of the speaker model's seed from the checkpoint's, so its weights do not depend on the backbone's draws.
_SEED_OFFSET = 7919


def tiny_config() -> WavLMConfig:
    return WavLMConfig(
        hidden_size=1024,
        num_hidden_layers=1,
        num_attention_heads=4,
        intermediate_size=64,
        conv_dim=(32,) * 7,
        conv_stride=(5, 2, 2, 2, 2, 2, 2),
        conv_kernel=(10, 3, 3, 3, 3, 2, 2),
        feat_extract_norm="layer",
        do_stable_layer_norm=True,
        num_conv_pos_embeddings=8,
        num_conv_pos_embedding_groups=16,
        mask_time_prob=0.0,
        embd_size=EMBEDDING_DIM,
        top_interm_size=512,
    )


def _calibration_clips(generator: torch.Generator, count: int = 16, seconds: float = 2.0) -> torch.Tensor:
    """Half frequency-modulated tones (100–300 Hz), half noise: ``[count, samples]`` at 16 kHz."""
    n = int(seconds * SAMPLE_RATE)
    t = torch.arange(n) / SAMPLE_RATE
    clips = []
    for i in range(count):
        if i % 2:
            clips.append(0.1 * torch.randn(n, generator=generator))
        else:
            f0 = 100 + 200 * torch.rand((), generator=generator)
            tone = 0.3 * torch.sin(2 * math.pi * f0 * t + 3 * torch.sin(2 * math.pi * 3 * t))
            clips.append(tone + 0.01 * torch.randn(n, generator=generator))
    return torch.stack(clips)


def random_speaker_model(seed: int = 0) -> SpeakerEmbeddingModel:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed + _SEED_OFFSET)
        model = SpeakerEmbeddingModel(tiny_config()).float().eval()
        clips = _calibration_clips(torch.Generator().manual_seed(seed + _SEED_OFFSET))
    top = model.top_layers
    for norm in (top.batchnorm1, top.batchnorm2):
        norm.reset_running_stats()
        norm.momentum = None  # a cumulative average over the calibration batch
    with torch.no_grad():
        top.train()
        model(clips)
        top.eval()
    for norm in (top.batchnorm1, top.batchnorm2):
        norm.momentum = 0.1  # back to the module default, so the saved model is an ordinary one
    return model


def write_speaker_model(out: Path | str, seed: int = 0) -> Path:
    """Write ``config.json`` and ``model.safetensors`` of a random speaker model into ``out``."""
    out = Path(out)
    random_speaker_model(seed).save_pretrained(out, safe_serialization=True)
    return out


def write_speaker_model_part(out: Path, preset: str, variant: str, seed: int) -> None:
    """Checkpoint part: ``<ckpt>/speaker_model/`` for Kani-TTS-2 checkpoints (the only ones with a speaker
    embedding); every preset gets the same small model."""
    if variant == "v2":
        write_speaker_model(Path(out) / SPEAKER_MODEL_SUBDIR, seed)
