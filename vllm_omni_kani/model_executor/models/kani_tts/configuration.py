"""What a checkpoint says about itself: variant, speakers, audio format and sampling defaults.

Factory checkpoints carry a ``kani_tts`` block in ``config.json``; stock Kani-TTS checkpoints
do not, so every field has the stock value as its default and the variant is inferred from the
architecture and vocabulary size.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from vllm_omni_kani.model_executor.models.kani_tts import token_layout as tl

PARALLEL_ARCH = "ParallelHeadLfm2ForCausalLM"
FLATTENED_ARCH = "Lfm2ForCausalLM"
# What Stage 0 runs a flattened checkpoint as (vLLM's LFM2 plus the speech grammar); the serving
# side sees this name once the pipeline has overridden the architecture.
FLATTENED_STAGE_ARCH = "KaniFlattenedLfm2ForCausalLM"
CONFIG_KEY = "kani_tts"

SAMPLE_RATE = 22050
FRAME_RATE = 12.5
SAMPLES_PER_FRAME = 1764

Variant = Literal["parallel", "flattened"]


class KaniConfigError(ValueError):
    """A checkpoint whose config cannot be served as Kani TTS."""


@dataclass(frozen=True)
class SamplingDefaults:
    temperature: float = 0.6
    top_p: float = 0.95
    top_k: int = -1
    repetition_penalty: float = 1.1
    # 1,200 frames = 96 s of audio at 12.5 frames/s.
    max_new_frames: int = 1200


@dataclass(frozen=True)
class KaniTTSSettings:
    variant: Variant
    speakers: tuple[str, ...] = ()
    default_speaker: str | None = None
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
        return d

    @classmethod
    def from_hf_config(cls, hf_config: Any) -> KaniTTSSettings:
        """Read (and check) the Kani settings of a loaded HF config."""
        arch = (getattr(hf_config, "architectures", None) or [None])[0]
        vocab = getattr(hf_config, "vocab_size", None)
        raw = dict(getattr(hf_config, CONFIG_KEY, None) or {})
        if arch == PARALLEL_ARCH:
            inferred: Variant = "parallel"
            need_vocab = tl.PARALLEL_VOCAB_SIZE
        elif arch in (FLATTENED_ARCH, FLATTENED_STAGE_ARCH):
            inferred = "flattened"
            need_vocab = tl.AUDIO_TOKEN_OFFSET + tl.NUM_CODEBOOKS * tl.CODEBOOK_SIZE
        else:
            raise KaniConfigError(
                f"architecture {arch!r} is not a Kani TTS model; expected {PARALLEL_ARCH} "
                f"(parallel heads) or {FLATTENED_ARCH} (flattened Kani-TTS)"
            )
        if vocab is None or vocab < need_vocab:
            raise KaniConfigError(
                f"{arch} with vocab_size={vocab} cannot hold the Kani audio codes "
                f"(needs at least {need_vocab} ids: codes start at {tl.AUDIO_TOKEN_OFFSET})"
            )
        variant = raw.pop("variant", inferred)
        if variant != inferred:
            raise KaniConfigError(f"config says variant {variant!r} but architecture {arch} is {inferred!r}")
        sampling = SamplingDefaults(**raw.pop("sampling", {}))
        raw["speakers"] = tuple(raw.get("speakers", ()))
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
