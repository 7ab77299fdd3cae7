"""What a checkpoint says about itself: variant, speakers, languages, audio format, sampling defaults
and the Kani-TTS-2 additions to LFM2.

Factory checkpoints carry a ``kani_tts`` block in ``config.json``. Stock Kani-TTS checkpoints do
not; they are read the way the official ``kani-tts`` / ``kani-tts-2`` packages read them:
speakers from ``speaker_settings``, language tags from ``language_settings``, sampling defaults
from ``generation_config.json``, and (Kani-TTS-2) frame-level positions, learnable RoPE and the
speaker embedding from top-level ``config.json`` fields. The variant is inferred from the
architecture and vocabulary size.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from vllm_omni_kani.model_executor.models.kani_tts import token_layout as tl

PARALLEL_ARCH = "ParallelHeadLfm2ForCausalLM"
FLATTENED_ARCH = "Lfm2ForCausalLM"
# Kani-TTS-2 (the official ``kani-tts-2`` package's class): the flattened layout plus frame-level
# positions, learnable RoPE and a speaker embedding.
V2_ARCH = "KaniTTS2ForCausalLM"
# What Stage 0 runs a flattened checkpoint as (vLLM's LFM2 plus the speech grammar); the serving
# side sees this name once the pipeline has overridden the architecture.
FLATTENED_STAGE_ARCH = "KaniFlattenedLfm2ForCausalLM"
CONFIG_KEY = "kani_tts"

SAMPLE_RATE = 22050
FRAME_RATE = 12.5
SAMPLES_PER_FRAME = 1764

Variant = Literal["parallel", "flattened"]


def additional_config(vllm_config: Any) -> Mapping[str, Any]:
    """A stage's ``additional_config`` block of the deploy YAML ({} when absent)."""
    config = getattr(vllm_config, "additional_config", None) or {}
    return config if isinstance(config, Mapping) else {}


def additional_config_int(vllm_config: Any, key: str, default: int, least: int) -> int:
    """An integer key of a stage's ``additional_config`` (``default`` when absent); ValueError unless an int (not a
    bool) of at least ``least``, so a typo in a deploy file stops the engine instead of being read as something else."""
    raw = additional_config(vllm_config).get(key, default)
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < least:
        raise ValueError(f"additional_config.{key}={raw!r}: expected an integer >= {least}")
    return raw


def boolean_key(config: Mapping[str, Any], key: str) -> bool:
    """A switch of a stage's ``additional_config`` block (default off); a YAML boolean only, so a quoted "false" is
    refused instead of read as on."""
    raw = config.get(key, False)
    if not isinstance(raw, bool):
        raise ValueError(f"{key} must be true or false, got {raw!r}")
    return raw


class KaniConfigError(ValueError):
    """A checkpoint whose config cannot be served as Kani TTS."""


@dataclass(frozen=True)
class SamplingDefaults:
    """Per-request defaults; requests override them.

    The values are the official packages': they call ``generate(do_sample=True, temperature=1.0,
    top_p=0.95, repetition_penalty=1.1)`` and leave ``top_k`` to transformers' ``GenerationConfig``
    default (50) unless the checkpoint's ``generation_config.json`` sets one.
    """

    temperature: float = 1.0
    top_p: float = 0.95
    top_k: int = 50
    repetition_penalty: float = 1.1
    # 1,200 frames = 96 s of audio at 12.5 frames/s.
    max_new_frames: int = 1200


# generation_config.json keys that set a sampling default (do_sample is not one: the official
# packages always sample, whatever the file says).
GENERATION_CONFIG_KEYS = ("temperature", "top_p", "top_k", "repetition_penalty")


def read_generation_config(model: str | Path) -> dict[str, Any]:
    """The checkpoint's ``generation_config.json`` as written (no transformers defaults filled in); {} if absent.

    ``model`` is a local directory or a hub id already in the local cache.
    """
    path = Path(model) / "generation_config.json"
    if not path.is_file():
        try:
            from transformers.utils import cached_file

            found = cached_file(str(model), "generation_config.json", _raise_exceptions_for_missing_entries=False)
        except Exception:
            found = None
        if found is None:
            return {}
        path = Path(found)
    data = json.loads(path.read_text())
    return data if isinstance(data, dict) else {}


def _listed(settings: Any, list_key: str, off_status: str) -> tuple[str, ...]:
    """Names from an official ``{status, <list_key>: [...]}`` block, unless its status says there are none."""
    if not isinstance(settings, Mapping) or settings.get("status") == off_status:
        return ()
    names = settings.get(list_key) or ()
    return tuple(str(n).strip() for n in names if str(n).strip())


@dataclass(frozen=True)
class FrameLevelSettings:
    """Kani-TTS-2's additions to LFM2, with the official class's defaults.

    * frame-level positions: text tokens advance the position by 1, the ``tokens_per_frame``
      tokens of an audio frame share one position, which advances by ``audio_step`` per frame;
    * per-layer learnable RoPE (``use_learnable_rope``): attention layer ``l`` rotates with
      ``inv_freq · α_l``, ``α_l = alpha_min + (alpha_max − alpha_min) · sigmoid(alpha_weight_l)``;
    * a speaker embedding of ``speaker_emb_dim`` floats, projected to the hidden size and inserted
      as the prompt's second row (after START_OF_HUMAN).

    The official loader always uses audio id ``AUDIO_TOKEN_OFFSET`` as the first audio token, whatever
    ``config.json`` says, and this layout fixes four tokens per frame.
    """

    tokens_per_frame: int = tl.NUM_CODEBOOKS
    audio_step: float = 1.0
    use_learnable_rope: bool = False
    alpha_min: float = 0.1
    alpha_max: float = 2.0
    speaker_emb_dim: int | None = 128

    # config.json fields that turn frame-level positions on for a checkpoint whose architecture
    # name is not V2_ARCH (vLLM-Omni renames the architecture of a stage to the class it runs).
    KEYS = ("audio_tokens_start", "tokens_per_frame", "audio_step", "use_learnable_rope", "alpha_min", "alpha_max")

    @classmethod
    def from_hf_config(cls, hf_config: Any) -> FrameLevelSettings | None:
        """The settings of a Kani-TTS-2 config; None for a checkpoint without frame-level positions."""
        arch = (getattr(hf_config, "architectures", None) or [None])[0]
        present = {k for k in (*cls.KEYS, "speaker_emb_dim") if getattr(hf_config, k, None) is not None}
        if arch != V2_ARCH and not present & set(cls.KEYS):
            return None
        start = getattr(hf_config, "audio_tokens_start", None)
        if start is not None and int(start) != tl.AUDIO_TOKEN_OFFSET:
            raise KaniConfigError(
                f"audio_tokens_start={start} but the Kani layout puts the first audio code at {tl.AUDIO_TOKEN_OFFSET}"
            )
        values = {k: getattr(hf_config, k) for k in present - {"audio_tokens_start"}}
        if arch != V2_ARCH and "speaker_emb_dim" not in values:
            values["speaker_emb_dim"] = None  # frame-level positions alone (no speaker projection in the weights)
        settings = cls(**values)
        if settings.tokens_per_frame != tl.NUM_CODEBOOKS:
            raise KaniConfigError(
                f"tokens_per_frame={settings.tokens_per_frame} but a flattened Kani frame is {tl.NUM_CODEBOOKS} tokens"
            )
        if not settings.audio_step > 0:
            raise KaniConfigError(f"audio_step must be > 0, got {settings.audio_step}")
        if settings.use_learnable_rope and not settings.alpha_min < settings.alpha_max:
            raise KaniConfigError(f"alpha_min {settings.alpha_min} must be < alpha_max {settings.alpha_max}")
        if settings.speaker_emb_dim is not None and settings.speaker_emb_dim < 1:
            raise KaniConfigError(f"speaker_emb_dim must be >= 1, got {settings.speaker_emb_dim}")
        return settings

    def to_config_fields(self) -> dict[str, Any]:
        """The top-level ``config.json`` fields the official loader reads."""
        return {"audio_tokens_start": tl.AUDIO_TOKEN_OFFSET, **asdict(self)}


@dataclass(frozen=True)
class KaniTTSSettings:
    variant: Variant
    speakers: tuple[str, ...] = ()
    default_speaker: str | None = None
    # Language tags (``"{tag}: {text}"``), from ``language_settings`` of a stock checkpoint.
    languages: tuple[str, ...] = ()
    sample_rate: int = SAMPLE_RATE
    frame_rate: float = FRAME_RATE
    num_codebooks: int = tl.NUM_CODEBOOKS
    codebook_size: int = tl.CODEBOOK_SIZE
    audio_token_offset: int = tl.AUDIO_TOKEN_OFFSET
    sampling: SamplingDefaults = field(default_factory=SamplingDefaults)

    @property
    def samples_per_frame(self) -> int:
        return round(self.sample_rate / self.frame_rate)

    @property
    def tokens_per_frame(self) -> int:
        return 1 if self.variant == "parallel" else self.num_codebooks

    def to_json_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["speakers"] = list(self.speakers)
        d["languages"] = list(self.languages)
        return d

    @classmethod
    def from_hf_config(cls, hf_config: Any, generation_config: Mapping[str, Any] | None = None) -> KaniTTSSettings:
        """Read (and check) the Kani settings of a loaded HF config.

        ``generation_config`` is the checkpoint's ``generation_config.json`` (see
        :func:`read_generation_config`); a ``kani_tts.sampling`` block takes precedence over it.
        """
        arch = (getattr(hf_config, "architectures", None) or [None])[0]
        vocab = getattr(hf_config, "vocab_size", None)
        raw = dict(getattr(hf_config, CONFIG_KEY, None) or {})
        if arch == PARALLEL_ARCH:
            inferred: Variant = "parallel"
            need_vocab = tl.PARALLEL_VOCAB_SIZE
        elif arch in (FLATTENED_ARCH, FLATTENED_STAGE_ARCH, V2_ARCH):
            inferred = "flattened"
            need_vocab = tl.AUDIO_TOKEN_OFFSET + tl.NUM_CODEBOOKS * tl.CODEBOOK_SIZE
        else:
            raise KaniConfigError(
                f"architecture {arch!r} is not a Kani TTS model; expected {PARALLEL_ARCH} "
                f"(parallel heads), {FLATTENED_ARCH} (flattened Kani-TTS) or {V2_ARCH} (Kani-TTS-2)"
            )
        if vocab is None or vocab < need_vocab:
            raise KaniConfigError(
                f"{arch} with vocab_size={vocab} cannot hold the Kani audio codes "
                f"(needs at least {need_vocab} ids: codes start at {tl.AUDIO_TOKEN_OFFSET})"
            )
        variant = raw.pop("variant", inferred)
        if variant != inferred:
            raise KaniConfigError(f"config says variant {variant!r} but architecture {arch} is {inferred!r}")
        generation_config = generation_config or {}
        from_generation = {k: generation_config[k] for k in GENERATION_CONFIG_KEYS if k in generation_config}
        sampling = SamplingDefaults(**{**from_generation, **raw.pop("sampling", {})})
        if "speakers" not in raw:  # "singlspeaker" is the official packages' spelling
            raw["speakers"] = _listed(getattr(hf_config, "speaker_settings", None), "speaker_list", "singlspeaker")
        if "languages" not in raw:
            raw["languages"] = _listed(
                getattr(hf_config, "language_settings", None), "language_tags_list", "no_language_tags"
            )
        raw["speakers"] = tuple(raw["speakers"])
        raw["languages"] = tuple(raw["languages"])
        FrameLevelSettings.from_hf_config(hf_config)  # raises on an unusable Kani-TTS-2 block
        settings = cls(variant=variant, sampling=sampling, **raw)
        settings._check_layout()
        return settings

    def _check_layout(self) -> None:
        fixed = {
            "audio_token_offset": tl.AUDIO_TOKEN_OFFSET,
            "num_codebooks": tl.NUM_CODEBOOKS,
            "codebook_size": tl.CODEBOOK_SIZE,
        }
        for name, value in fixed.items():
            if getattr(self, name) != value:
                raise KaniConfigError(f"{CONFIG_KEY}.{name}={getattr(self, name)} but the Kani layout fixes {value}")
        if self.default_speaker is not None and self.default_speaker not in self.speakers:
            raise KaniConfigError(f"default_speaker {self.default_speaker!r} is not one of speakers {self.speakers}")
