"""NanoCodec decoder configuration, read from (and written as) NeMo's model-config dict.

Only the parts that define decoding are kept: the group FSQ (codebooks and levels) and the causal
HiFi-GAN decoder (up-sampling rates, channels, kernels). The receptive field — how many frames of
left context a streaming window needs to reproduce a full decode — is derived here, from the config.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vllm_omni_kani.model_executor.models.kani_tts.configuration import SAMPLE_RATE, KaniConfigError, KaniTTSSettings

NEMO_QUANTIZER = "nemo.collections.tts.modules.audio_codec_modules.GroupFiniteScalarQuantizer"
NEMO_DECODER = "nemo.collections.tts.modules.audio_codec_modules.CausalHiFiGANDecoder"
# What this decoder implements; anything else in the NeMo config is refused by name.
_FIXED_DECODER_OPTIONS = {
    "activation": "half_snake",
    "output_activation": "clamp",
    "n_groups_equal_to_out_channels": True,
}


class CodecConfigError(ValueError):
    """A codec config this decoder cannot reproduce exactly."""


@dataclass(frozen=True)
class NanoCodecConfig:
    """Decode-side NanoCodec geometry. Defaults are the 22 kHz, 12.5 frames/s, 4×4032-code model."""

    sample_rate: int = SAMPLE_RATE
    num_groups: int = 4  # one FSQ group per codebook
    levels: tuple[int, ...] = (9, 8, 8, 7)  # FSQ levels of each group's latent dims
    up_sample_rates: tuple[int, ...] = (7, 7, 6, 3, 2)
    base_channels: int = 864  # halved after every up-sampling stage
    in_kernel_size: int = 7
    out_kernel_size: int = 3
    resblock_kernel_sizes: tuple[int, ...] = (3, 7, 11)
    resblock_dilations: tuple[int, ...] = (1, 3, 5)

    def __post_init__(self) -> None:
        if self.base_channels % 2 ** len(self.up_sample_rates):
            raise CodecConfigError(
                f"base_channels={self.base_channels} must halve evenly through {len(self.up_sample_rates)} stages"
            )
        if self.stage_channels[-1] < 2:
            raise CodecConfigError(f"base_channels={self.base_channels} leaves fewer than 2 output channels")

    # -- derived geometry ------------------------------------------------------------------------
    @property
    def num_codebooks(self) -> int:
        return self.num_groups

    @property
    def codebook_size(self) -> int:
        return math.prod(self.levels)

    @property
    def latent_dim(self) -> int:
        return self.num_groups * len(self.levels)

    @property
    def samples_per_frame(self) -> int:
        return math.prod(self.up_sample_rates)

    @property
    def frame_rate(self) -> float:
        return self.sample_rate / self.samples_per_frame

    @property
    def stage_channels(self) -> tuple[int, ...]:
        """Channels after each up-sampling stage (864 → 432, 216, 108, 54, 27)."""
        return tuple(self.base_channels // 2 ** (i + 1) for i in range(len(self.up_sample_rates)))

    @property
    def res_layer_context(self) -> int:
        """Left context (samples at the layer's rate) of one residual layer: its widest branch."""
        return max(sum((k - 1) * d + (k - 1) for d in self.resblock_dilations) for k in self.resblock_kernel_sizes)

    def earliest_frame(self, sample: int) -> int:
        """First input frame that output ``sample`` depends on (exact integer cone, any sign)."""
        m = sample - (self.out_kernel_size - 1)
        for rate in reversed(self.up_sample_rates):
            # Residual layer, then the right-trimmed transposed conv (kernel 2r, stride r): output m
            # reads inputs m//r - 1 and m//r.
            m = (m - self.res_layer_context) // rate - 1
        return m - (self.in_kernel_size - 1)

    @property
    def receptive_field_frames(self) -> int:
        """Whole frames of left context that make a window decode equal a full decode (28).

        The first sample of a frame reaches furthest back, so it sets the bound.
        """
        frame = 1 << 20  # far from the start, so no zero padding is involved
        return frame - self.earliest_frame(frame * self.samples_per_frame)

    @property
    def receptive_field_samples(self) -> int:
        """Left extent of one output sample in output samples, layer by layer (48,286 ≈ 27.37 frames)."""
        spf = self.samples_per_frame
        total = (self.in_kernel_size - 1) * spf + (self.out_kernel_size - 1)
        rate = 1  # samples per frame before the current stage
        for r in self.up_sample_rates:
            total += spf // rate  # the transposed conv reads one earlier input sample
            rate *= r
            total += self.res_layer_context * (spf // rate)
        return total

    # -- NeMo config dict ------------------------------------------------------------------------
    @classmethod
    def from_nemo(cls, cfg: Mapping[str, Any]) -> NanoCodecConfig:
        """Read a NeMo ``AudioCodecModel`` config (the ``.nemo`` yaml, or our ``config.json``)."""
        vq = dict(cfg.get("vector_quantizer") or {})
        dec = dict(cfg.get("audio_decoder") or {})
        if not str(vq.get("_target_", "")).endswith("GroupFiniteScalarQuantizer"):
            raise CodecConfigError(f"vector_quantizer {vq.get('_target_')!r} is not a GroupFiniteScalarQuantizer")
        if not str(dec.get("_target_", "")).endswith("CausalHiFiGANDecoder"):
            raise CodecConfigError(f"audio_decoder {dec.get('_target_')!r} is not a CausalHiFiGANDecoder")
        for key, want in _FIXED_DECODER_OPTIONS.items():
            if dec.get(key, want) != want:
                raise CodecConfigError(f"audio_decoder.{key}={dec[key]!r} is not supported (only {want!r})")
        default = cls()
        config = cls(
            sample_rate=int(cfg.get("sample_rate", default.sample_rate)),
            num_groups=int(vq["num_groups"]),
            levels=tuple(int(x) for x in vq["num_levels_per_group"]),
            up_sample_rates=tuple(int(x) for x in dec["up_sample_rates"]),
            base_channels=int(dec["base_channels"]),
            in_kernel_size=int(dec.get("in_kernel_size", default.in_kernel_size)),
            out_kernel_size=int(dec.get("out_kernel_size", default.out_kernel_size)),
            resblock_kernel_sizes=tuple(
                int(x) for x in dec.get("resblock_kernel_sizes", default.resblock_kernel_sizes)
            ),
            resblock_dilations=tuple(int(x) for x in dec.get("resblock_dilation_sizes", default.resblock_dilations)),
        )
        if int(dec.get("input_dim", config.latent_dim)) != config.latent_dim:
            raise CodecConfigError(
                f"audio_decoder.input_dim={dec['input_dim']} but the quantizer yields {config.latent_dim} latent dims"
            )
        spf = int(cfg.get("samples_per_frame", config.samples_per_frame))
        if spf != config.samples_per_frame:
            raise CodecConfigError(
                f"samples_per_frame={spf} but up_sample_rates {list(config.up_sample_rates)} "
                f"give {config.samples_per_frame}"
            )
        return config

    def to_nemo(self) -> dict[str, Any]:
        """The decode-relevant part of a NeMo ``AudioCodecModel`` config (what ``config.json`` holds)."""
        return {
            "sample_rate": self.sample_rate,
            "samples_per_frame": self.samples_per_frame,
            "vector_quantizer": {
                "_target_": NEMO_QUANTIZER,
                "num_groups": self.num_groups,
                "num_levels_per_group": list(self.levels),
            },
            "audio_decoder": {
                "_target_": NEMO_DECODER,
                "up_sample_rates": list(self.up_sample_rates),
                "input_dim": self.latent_dim,
                "base_channels": self.base_channels,
                "in_kernel_size": self.in_kernel_size,
                "out_kernel_size": self.out_kernel_size,
                "resblock_kernel_sizes": list(self.resblock_kernel_sizes),
                "resblock_dilation_sizes": list(self.resblock_dilations),
                "pad_mode": "zeros",
                **_FIXED_DECODER_OPTIONS,
            },
        }


def check_matches_stage0(config: NanoCodecConfig, settings: KaniTTSSettings) -> None:
    """Refuse a codec whose frames or audio format differ from what Stage 0 emits (``KaniConfigError``)."""
    pairs = {
        "num_codebooks": (config.num_codebooks, settings.num_codebooks),
        "codebook_size": (config.codebook_size, settings.codebook_size),
        "sample_rate": (config.sample_rate, settings.sample_rate),
        "frame_rate": (config.frame_rate, settings.frame_rate),
    }
    for name, (codec, stage0) in pairs.items():
        if not math.isclose(codec, stage0):
            raise KaniConfigError(f"codec {name}={codec:g} but Stage 0 (kani_tts.{name}) expects {stage0:g}")


DEFAULT_CONFIG = NanoCodecConfig()
# Frames of left context a streaming window needs for an exact decode (28 for the Kani codec).
RECEPTIVE_FIELD_FRAMES = DEFAULT_CONFIG.receptive_field_frames
