"""NanoCodec (NeMo ``AudioCodecModel``, 22,050 Hz, 12.5 frames/s) decoding for Kani TTS Stage 1.

Codes are frame-major everywhere here: ``[..., T, 4]``, codebook order cb1..cb4, values 0..4031.
"""

from vllm_omni_kani.model_executor.models.kani_tts.nanocodec.config import (
    DEFAULT_CONFIG,
    RECEPTIVE_FIELD_FRAMES,
    CodecConfigError,
    NanoCodecConfig,
    check_matches_stage0,
)
from vllm_omni_kani.model_executor.models.kani_tts.nanocodec.decoder import NanoCodecDecoder, fsq_table
from vllm_omni_kani.model_executor.models.kani_tts.nanocodec.loading import (
    CODEC_SUBDIR,
    convert_nemo,
    find_codec,
    load_codec,
    load_decoder_state,
    read_codec_config,
    read_decoder_tensors,
    save_codec,
    stage0_audio_settings,
)

__all__ = [
    "CODEC_SUBDIR",
    "DEFAULT_CONFIG",
    "RECEPTIVE_FIELD_FRAMES",
    "CodecConfigError",
    "NanoCodecConfig",
    "NanoCodecDecoder",
    "check_matches_stage0",
    "convert_nemo",
    "find_codec",
    "fsq_table",
    "load_codec",
    "load_decoder_state",
    "read_codec_config",
    "read_decoder_tensors",
    "save_codec",
    "stage0_audio_settings",
]
