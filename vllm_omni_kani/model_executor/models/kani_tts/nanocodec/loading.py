"""Find, read and write NanoCodec weights: NeMo ``.nemo`` archives and our ``config.json + model.safetensors``.

Our format keeps NeMo's tensors unchanged — the decoder's ``audio_decoder.*`` tensors under their NeMo
names, weight norm still split into ``g``/``v`` — and ``config.json`` holds the decode-relevant part of
NeMo's model config (plus ``"format": "nanocodec"``). Keeping the split lets every loader fold the
weights on the device that runs them, the way NeMo does, so a ``.nemo`` and its conversion decode
identically. Already-folded ``.weight`` tensors and the legacy ``weight_g``/``weight_v`` names load too.
"""

from __future__ import annotations

import json
import re
import tarfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import yaml

from vllm_omni_kani.model_executor.models.kani_tts.configuration import CONFIG_KEY, KaniTTSSettings
from vllm_omni_kani.model_executor.models.kani_tts.nanocodec.config import (
    CodecConfigError,
    NanoCodecConfig,
    check_matches_stage0,
)
from vllm_omni_kani.model_executor.models.kani_tts.nanocodec.decoder import NARROW_CONV_DTYPES, NanoCodecDecoder

CODEC_SUBDIR = "codec"  # where a Stage-0 checkpoint keeps its codec
CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
FORMAT = "nanocodec"
NEMO_CONFIG_MEMBER = "model_config.yaml"
NEMO_WEIGHTS_MEMBER = "model_weights.ckpt"
DECODER_PREFIX = "audio_decoder."

# NeMo module path suffix → ours. Weight-norm halves become weight_g / weight_v, folded at load.
_RENAMES = (
    (re.compile(r"\.activation\.snake_act\.alpha$"), ".alpha"),
    (re.compile(r"\.conv\.parametrizations\.weight\.original0$"), ".weight_g"),
    (re.compile(r"\.conv\.parametrizations\.weight\.original1$"), ".weight_v"),
    (re.compile(r"\.conv\.(weight_g|weight_v|weight|bias)$"), r".\1"),
)
_AUDIO_FIELDS = ("sample_rate", "frame_rate", "num_codebooks", "codebook_size")


# -- locating ------------------------------------------------------------------------------------
def find_codec(path: str | Path) -> Path:
    """A ``.nemo`` file or a codec directory, given either of those or a Stage-0 checkpoint directory.

    In a directory, ``config.json + model.safetensors`` (our format) wins over a single ``*.nemo``.
    """
    path = Path(path)
    if path.is_file():
        if path.suffix == ".nemo":
            return path
        raise CodecConfigError(f"{path} is not a .nemo archive")
    if path.is_dir():
        if (path / CODEC_SUBDIR).is_dir():
            return find_codec(path / CODEC_SUBDIR)
        if _is_codec_dir(path):
            return path
        nemos = sorted(path.glob("*.nemo"))
        if len(nemos) == 1:
            return nemos[0]
        if len(nemos) > 1:
            raise CodecConfigError(f"{path} holds several .nemo files ({', '.join(p.name for p in nemos)}); keep one")
    raise FileNotFoundError(
        f"no NanoCodec at {path}: expected a .nemo file, a directory with {CONFIG_NAME} + {WEIGHTS_NAME} "
        f'("format": "{FORMAT}") or a .nemo, or a checkpoint with a {CODEC_SUBDIR}/ sub-directory'
    )


def _is_codec_dir(path: Path) -> bool:
    config = path / CONFIG_NAME
    return (
        (path / WEIGHTS_NAME).is_file() and config.is_file() and json.loads(config.read_text()).get("format") == FORMAT
    )


def _nemo_member(tar: tarfile.TarFile, name: str) -> Any:
    # NeMo writes "./model_config.yaml"; other writers drop the "./".
    for member in tar.getmembers():
        if Path(member.name).name == name:
            return tar.extractfile(member)
    raise CodecConfigError(f"{tar.name} has no {name}: not a NeMo model archive")


# -- reading -------------------------------------------------------------------------------------
def read_nemo_config(path: str | Path) -> dict[str, Any]:
    """The full NeMo model config of a codec (yaml of a ``.nemo``, or our ``config.json``)."""
    codec = find_codec(path)
    if codec.is_dir():
        return json.loads((codec / CONFIG_NAME).read_text())
    with tarfile.open(codec, "r:*") as tar:
        return yaml.safe_load(_nemo_member(tar, NEMO_CONFIG_MEMBER))


def read_codec_config(path: str | Path) -> NanoCodecConfig:
    return NanoCodecConfig.from_nemo(read_nemo_config(path))


def read_decoder_tensors(path: str | Path) -> dict[str, torch.Tensor]:
    """The ``audio_decoder.*`` tensors of a codec, NeMo names, on the CPU."""
    codec = find_codec(path)
    if codec.is_dir():
        from safetensors.torch import load_file

        state = load_file(codec / WEIGHTS_NAME)
    else:
        with tarfile.open(codec, "r:*") as tar:
            state = torch.load(_nemo_member(tar, NEMO_WEIGHTS_MEMBER), map_location="cpu", weights_only=True)
    return {name: t for name, t in state.items() if name.startswith(DECODER_PREFIX)}


def decoder_weights(state: Mapping[str, torch.Tensor], device: torch.device | str) -> dict[str, torch.Tensor]:
    """NeMo-named tensors → the decoder's parameter names, weight norm folded on ``device``.

    Unknown names pass through (renamed as far as the table applies) for the caller to report.
    """
    renamed: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        short = name.removeprefix(DECODER_PREFIX)
        for pattern, repl in _RENAMES:
            short = pattern.sub(repl, short)
        renamed[short] = tensor
    folded: dict[str, torch.Tensor] = {}
    for name, tensor in renamed.items():
        if name.endswith(".weight_g"):
            if name.removesuffix("_g") + "_v" not in renamed:
                raise CodecConfigError(
                    f"codec weight {name.removesuffix('_g')}: weight-norm magnitude without direction"
                )
            continue
        if name.endswith(".weight_v"):
            name = name.removesuffix("_v")
            g = renamed.get(name + "_g")
            if g is None:
                raise CodecConfigError(f"codec weight {name}: weight-norm direction without its magnitude")
            # torch._weight_norm on the run device is what NeMo's parametrization computes.
            tensor = torch._weight_norm(tensor.to(device, torch.float32), g.to(device, torch.float32), 0)
        if name in folded:
            raise CodecConfigError(f"codec weight {name} is given twice (folded and as a weight-norm pair)")
        folded[name] = tensor
    return folded


def load_decoder_state(decoder: NanoCodecDecoder, state: Mapping[str, torch.Tensor]) -> set[str]:
    """Fill ``decoder`` from NeMo-named tensors (see :func:`decoder_weights`).

    Strict: every parameter must be provided exactly once and every tensor must land somewhere.
    Returns the names of the loaded parameters.
    """
    folded = decoder_weights(state, decoder.device)
    params = dict(decoder.named_parameters())
    missing = sorted(params.keys() - folded.keys())
    unexpected = sorted(folded.keys() - params.keys())
    if missing or unexpected:
        raise CodecConfigError(
            f"codec weights do not fit the decoder config: {len(missing)} missing (e.g. {missing[:3]}), "
            f"{len(unexpected)} unexpected (e.g. {unexpected[:3]})"
        )
    with torch.no_grad():
        for name, tensor in folded.items():
            param = params[name]
            if tuple(tensor.shape) != tuple(param.shape):
                raise CodecConfigError(
                    f"codec weight {name} has shape {tuple(tensor.shape)}, the config needs {tuple(param.shape)}"
                )
            param.copy_(tensor)
    decoder.refresh()
    return set(params)


# -- Stage-0 settings ----------------------------------------------------------------------------
def stage0_audio_settings(kani_block: Mapping[str, Any] | None) -> KaniTTSSettings:
    """The audio format a Stage-0 ``kani_tts`` config block promises (stock Kani values by default).

    Works from the block alone because a codec stage's config carries the codec stage's architecture.
    """
    raw = dict(kani_block or {})
    return KaniTTSSettings(variant=raw.get("variant", "parallel"), **{k: raw[k] for k in _AUDIO_FIELDS if k in raw})


def _settings_near(path: Path) -> KaniTTSSettings:
    config = path / CONFIG_NAME if path.is_dir() else None
    if config is not None and config.is_file() and (path / CODEC_SUBDIR).is_dir():
        return stage0_audio_settings(json.loads(config.read_text()).get(CONFIG_KEY))
    return stage0_audio_settings(None)


# -- public entry points -------------------------------------------------------------------------
def load_codec(
    path: str | Path,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    settings: KaniTTSSettings | None = None,
    precision: str | None = None,
) -> NanoCodecDecoder:
    """Load a ready-to-run decoder from a Stage-0 checkpoint directory (its ``codec/``), a codec
    directory or a ``.nemo`` file.

    The codec must produce the frames and audio Stage 0 expects: ``settings`` if given, else the
    checkpoint's ``kani_tts`` block, else the stock Kani values (``KaniConfigError``, a ``ValueError``).
    ``dtype`` float32 (default) or float64 (analysis) sets the activations; bfloat16 / float16 mean float32
    activations with convs in that dtype (``precision`` "bf16" / "fp16"). ``precision`` is
    :meth:`NanoCodecDecoder.set_precision`'s (default "fp32": strict, NeMo parity).
    """
    narrow = {v: k for k, v in NARROW_CONV_DTYPES.items()}
    if dtype in narrow:
        if precision not in (None, narrow[dtype]):
            raise ValueError(f"dtype {dtype} and precision {precision!r} disagree")
        dtype, precision = torch.float32, narrow[dtype]
    if dtype not in (torch.float32, torch.float64):
        raise ValueError(f"NanoCodec activations are float32 or float64 (convs may be bf16/fp16); got {dtype}")
    path = Path(path)
    config = read_codec_config(path)
    check_matches_stage0(config, settings or _settings_near(path))
    with torch.device(device):
        decoder = NanoCodecDecoder(config)
    load_decoder_state(decoder, read_decoder_tensors(path))
    return decoder.to(dtype).eval().set_precision(precision or "fp32")


def save_codec(out_dir: str | Path, config: NanoCodecConfig, decoder_tensors: Mapping[str, torch.Tensor]) -> Path:
    """Write our format: ``config.json`` + ``model.safetensors`` (NeMo-named decoder tensors, unfolded)."""
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in decoder_tensors.items() if k.startswith(DECODER_PREFIX)}
    save_file(tensors, out / WEIGHTS_NAME)
    (out / CONFIG_NAME).write_text(json.dumps({"format": FORMAT, **config.to_nemo()}, indent=2) + "\n")
    return out


def convert_nemo(nemo_path: str | Path, out_dir: str | Path) -> Path:
    """``.nemo`` → ``config.json + model.safetensors`` (same tensors, so the same decode)."""
    return save_codec(out_dir, read_codec_config(nemo_path), read_decoder_tensors(nemo_path))
