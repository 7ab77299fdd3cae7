"""Write a random-weight NanoCodec as a NeMo ``.nemo`` archive, the way a trained codec ships.

The archive is a plain tar of ``model_config.yaml`` (a complete ``AudioCodecModel`` config that
NeMo 3.0 constructs offline) and ``model_weights.ckpt`` (``torch.save`` of the state dict, weight
norm as ``parametrizations.weight.original0/1``). Encoder weights are included so NeMo restores a
complete model; Kani only ever decodes.

Weights come from a private generator seeded per part (decoder, encoder), so the decoder of a given
seed is the same whatever else is written, and tests can rebuild it without the file.
"""

from __future__ import annotations

import io
import math
import tarfile
from pathlib import Path
from typing import Any

import torch
import yaml

from vllm_omni_kani.model_executor.models.kani_tts.nanocodec import CODEC_SUBDIR, DEFAULT_CONFIG, NanoCodecConfig
from vllm_omni_kani.model_executor.models.kani_tts.nanocodec.loading import (
    DECODER_PREFIX,
    NEMO_CONFIG_MEMBER,
    NEMO_WEIGHTS_MEMBER,
)

NEMO_FILE = "nanocodec.nemo"
NEMO_MODEL = "nemo.collections.tts.models.audio_codec.AudioCodecModel"
NEMO_ENCODER = "nemo.collections.tts.modules.audio_codec_modules.HiFiGANEncoder"

# The real codec; "tiny" keeps every rate, kernel and dilation (so 1,764 samples per frame and the
# same 28-frame receptive field) with 96 base channels (…→ 3 output channels: an odd half-snake split
# like the real 27), so CPU tests decode in milliseconds.
CODEC_PRESETS: dict[str, NanoCodecConfig] = {
    "350m": DEFAULT_CONFIG,
    "tiny": NanoCodecConfig(base_channels=96),
}
ENCODER_BASE_CHANNELS = {"350m": 24, "tiny": 2}
ENCODER_KERNEL_SIZE = 7


def _conv(
    state: dict[str, torch.Tensor], gen: torch.Generator, path: str, shape: tuple[int, int, int], gain: float, bias: int
) -> None:
    """A weight-normed conv: direction ``v`` ~ N(0,1), magnitude ``g`` = gain · U(0.5, 1.5) per dim-0 row."""
    v = torch.randn(shape, generator=gen)
    g = gain * (0.5 + torch.rand(shape[0], 1, 1, generator=gen))
    state[f"{path}.conv.parametrizations.weight.original0"] = g
    state[f"{path}.conv.parametrizations.weight.original1"] = v
    state[f"{path}.conv.bias"] = 0.05 * torch.randn(bias, generator=gen)


def _alpha(state: dict[str, torch.Tensor], gen: torch.Generator, path: str, channels: int) -> None:
    state[f"{path}.activation.snake_act.alpha"] = 0.5 + 1.5 * torch.rand(1, channels // 2, 1, generator=gen)


def random_decoder_tensors(config: NanoCodecConfig, seed: int) -> dict[str, torch.Tensor]:
    """Decoder state dict in NeMo names. Gains keep the signal O(1) so the output clamp rarely bites."""
    gen = torch.Generator().manual_seed(seed)
    state: dict[str, torch.Tensor] = {}
    p = DECODER_PREFIX
    c = config.base_channels
    _conv(state, gen, p + "pre_conv", (c, config.latent_dim, config.in_kernel_size), 1.0, c)
    for i, rate in enumerate(config.up_sample_rates):
        _alpha(state, gen, f"{p}activations.{i}", c)
        # Grouped transposed conv: each output sums 2 inputs × 2 taps of a 2r-tap row.
        _conv(state, gen, f"{p}up_sample_conv_layers.{i}", (c, 1, 2 * rate), math.sqrt(rate / 2), c // 2)
        c //= 2
        for j, k in enumerate(config.resblock_kernel_sizes):
            for m, _ in enumerate(config.resblock_dilations):
                unit = f"{p}res_layers.{i}.res_blocks.{j}.res_blocks.{m}"
                _alpha(state, gen, unit + ".input_activation", c)
                _conv(state, gen, unit + ".input_conv", (c, c, k), 0.5, c)
                _alpha(state, gen, unit + ".skip_activation", c)
                _conv(state, gen, unit + ".skip_conv", (c, c, k), 0.5, c)
    _alpha(state, gen, p + "post_activation", c)
    _conv(state, gen, p + "post_conv", (1, c, config.out_kernel_size), 0.3, 1)
    return state


def _random_encoder_tensors(config: NanoCodecConfig, base_channels: int, seed: int) -> dict[str, torch.Tensor]:
    """NeMo ``HiFiGANEncoder`` weights (mirror of the decoder, leaky-ReLU, so no alphas)."""
    gen = torch.Generator().manual_seed(seed)
    state: dict[str, torch.Tensor] = {}
    c = base_channels
    _conv(state, gen, "audio_encoder.pre_conv", (c, 1, ENCODER_KERNEL_SIZE), 1.0, c)
    for i, rate in enumerate(reversed(config.up_sample_rates)):
        for j, k in enumerate(config.resblock_kernel_sizes):
            for m, _ in enumerate(config.resblock_dilations):
                unit = f"audio_encoder.res_layers.{i}.res_blocks.{j}.res_blocks.{m}"
                _conv(state, gen, unit + ".input_conv", (c, c, k), 0.5, c)
                _conv(state, gen, unit + ".skip_conv", (c, c, k), 0.5, c)
        _conv(state, gen, f"audio_encoder.down_sample_conv_layers.{i}", (2 * c, c, 2 * rate), 1.0, 2 * c)
        c *= 2
    _conv(state, gen, "audio_encoder.post_conv", (config.latent_dim, c, ENCODER_KERNEL_SIZE), 1.0, config.latent_dim)
    return state


def _quantizer_buffers(config: NanoCodecConfig) -> dict[str, torch.Tensor]:
    levels = torch.tensor(config.levels, dtype=torch.int32)
    base = torch.cumprod(torch.tensor((1, *config.levels[:-1])), 0).to(torch.int32)
    state = {}
    for g in range(config.num_groups):
        state[f"vector_quantizer.fsqs.{g}.num_levels"] = levels.view(1, -1, 1).clone()
        state[f"vector_quantizer.fsqs.{g}.dim_base_index"] = base.view(1, -1, 1).clone()
    return state


def nemo_model_config(config: NanoCodecConfig, encoder_base_channels: int) -> dict[str, Any]:
    """A complete ``AudioCodecModel`` config: the decode part plus what NeMo's constructor insists on."""
    cfg = config.to_nemo()
    cfg["audio_encoder"] = {
        "_target_": NEMO_ENCODER,
        "down_sample_rates": list(reversed(config.up_sample_rates)),
        "encoded_dim": config.latent_dim,
        "base_channels": encoder_base_channels,
        "in_kernel_size": ENCODER_KERNEL_SIZE,
        "out_kernel_size": ENCODER_KERNEL_SIZE,
        "resblock_kernel_sizes": list(config.resblock_kernel_sizes),
        "resblock_dilation_sizes": list(config.resblock_dilations),
        "activation": "lrelu",
        "pad_mode": "replicate",
    }
    # Training-only keys NeMo 3.0 requires to build the model; an FSQ has no commitment loss, hence 0.
    cfg.update(
        loss_resolutions=[[512, 128, 512]],
        mel_loss_dims=[64],
        commit_loss_scale=0.0,
        generator_loss={"_target_": "nemo.collections.tts.losses.audio_codec_loss.GeneratorSquaredLoss"},
        discriminator_loss={"_target_": "nemo.collections.tts.losses.audio_codec_loss.DiscriminatorSquaredLoss"},
        target=NEMO_MODEL,
    )
    return cfg


def write_nemo(path: str | Path, preset: str, seed: int) -> Path:
    """Write a ``.nemo`` codec for ``preset`` ("tiny" or "350m") with weights drawn from ``seed``."""
    config = CODEC_PRESETS[preset]
    state = random_decoder_tensors(config, seed)
    state.update(_random_encoder_tensors(config, ENCODER_BASE_CHANNELS[preset], seed + 1))
    state.update(_quantizer_buffers(config))
    weights = io.BytesIO()
    torch.save(state, weights)
    yaml_text = yaml.safe_dump(nemo_model_config(config, ENCODER_BASE_CHANNELS[preset]), sort_keys=False)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w:") as tar:
        for name, data in ((NEMO_CONFIG_MEMBER, yaml_text.encode()), (NEMO_WEIGHTS_MEMBER, weights.getvalue())):
            info = tarfile.TarInfo(f"./{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def write_codec_part(out: Path, preset: str, variant: str, seed: int) -> None:
    """Checkpoint part: ``<ckpt>/codec/nanocodec.nemo`` (both variants share the codec)."""
    write_nemo(Path(out) / CODEC_SUBDIR / NEMO_FILE, preset, seed)
