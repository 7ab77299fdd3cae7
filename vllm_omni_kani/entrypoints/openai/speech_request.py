"""The Kani view of an OpenAI speech request: voice, sampling and output-rate fields, checked.

vLLM-Omni's request model has no top-level ``temperature``/``top_p``/``top_k``/
``repetition_penalty``/``sample_rate``; with ``extra="allow"`` (see ``patch.py``) they arrive
in ``request.model_extra`` and are validated here, so a typo is a 400, not a silent default.
The same knobs are also accepted in ``extra_params`` (vLLM-Omni's generic channel).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vllm_omni_kani.model_executor.models.kani_tts.configuration import KaniTTSSettings

# OpenAI's voice names: accepted so OpenAI clients work unchanged, spoken by the default speaker.
OPENAI_VOICES = frozenset(
    {"alloy", "ash", "ballad", "coral", "echo", "fable", "nova", "onyx", "sage", "shimmer", "verse", "marin", "cedar"}
)
# Output rates a client may ask for (the codec's own rate is always allowed).
SUPPORTED_SAMPLE_RATES = (8000, 12000, 16000, 22050, 24000, 32000, 44100, 48000)
OPUS_SAMPLE_RATES = frozenset({8000, 12000, 16000, 24000, 48000})
# Longest input accepted at all; longer text than one generation holds is split into segments.
MAX_INPUT_CHARS = 10_000
# Characters per generation (~25 s of speech): sentence-aligned segments stay well inside one generation.
MAX_SEGMENT_CHARS = 400
# Request fields of vLLM-Omni's speech API that a Kani checkpoint cannot honour. The voice-cloning fields are answered
# by the adapter first (entrypoints/openai/voice_clone.py: Kani-TTS-2 clones, other checkpoints say why not); these
# messages are the fallback for a model the adapter does not route to cloning.
UNSUPPORTED_FIELDS = {
    "instructions": "Kani has no instruction-following voice design",
    "task_type": "Kani has one task (speak the text with a built-in speaker)",
    "language": "the language is fixed by the checkpoint",
    "ref_audio": "only Kani-TTS-2 checkpoints clone voices",
    "ref_text": "only Kani-TTS-2 checkpoints clone voices",
    "ref_audio_2": "only Kani-TTS-2 checkpoints clone voices",
    "speaker_embedding": "only Kani-TTS-2 checkpoints clone voices",
    "x_vector_only_mode": "only Kani-TTS-2 checkpoints clone voices",
    "ambient_sound": "not a Kani feature",
    "duration_seconds": "Kani ends speech by itself (use max_new_tokens to bound it)",
    "initial_codec_chunk_frames": "chunking is set in the deploy YAML (initial_codec_chunk_frames)",
    "non_streaming_mode": "not a Kani feature",
}
SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "repetition_penalty")
EXTRA_FIELDS = (*SAMPLING_FIELDS, "sample_rate")


class SpeechRequestError(ValueError):
    """A request the server answers with 400 and this message."""


@dataclass(frozen=True)
class KaniSpeechOptions:
    speaker: str | None
    temperature: float
    top_p: float
    top_k: int
    repetition_penalty: float
    sample_rate: int | None  # None: the codec's native rate
    lora_voice: str | None = None  # a LoRA voice (lower case): Stage 0 runs with its adapter


def resolve_speaker(
    voice: str | None, settings: KaniTTSSettings, lora_voices: Mapping[str, str | None] | None = None
) -> str | None:
    """Speaker prefix for ``voice`` (case-insensitive); OpenAI names and no voice → default speaker.

    ``lora_voices`` maps each LoRA voice (lower case) to the speaker it is prompted with; the checkpoint's own
    speakers and the OpenAI names come first."""
    if voice is None or voice.lower() in OPENAI_VOICES or voice.lower() == "default":
        return settings.default_speaker
    by_lower = {s.lower(): s for s in settings.speakers}
    if voice.lower() in by_lower:
        return by_lower[voice.lower()]
    if lora_voices and voice.lower() in lora_voices:
        return lora_voices[voice.lower()]
    available = ", ".join(sorted(settings.speakers)) or "(this checkpoint has no named speakers)"
    if lora_voices:
        available += f"; LoRA voices: {', '.join(sorted(lora_voices))}"
    raise SpeechRequestError(
        f"Unknown voice '{voice}'. Available: {available}. OpenAI voice names "
        f"({', '.join(sorted(OPENAI_VOICES))}) use the default speaker."
    )


def lora_voice_of(voice: str | None, settings: KaniTTSSettings, lora_voices: Mapping[str, Any] | None) -> str | None:
    """``voice`` (lower case) when it names a LoRA voice rather than a built-in one, else None."""
    if not voice or not lora_voices or voice.lower() not in lora_voices:
        return None
    builtin = {s.lower() for s in settings.speakers} | OPENAI_VOICES | {"default"}
    return None if voice.lower() in builtin else voice.lower()


def _number(name: str, value: Any, *, integer: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise SpeechRequestError(f"'{name}' must be a number, got {value!r}")
    if integer and value != int(value):
        raise SpeechRequestError(f"'{name}' must be an integer, got {value!r}")
    return value


def parse_options(
    request: Any, settings: KaniTTSSettings, lora_voices: Mapping[str, str | None] | None = None
) -> KaniSpeechOptions:
    """Check every Kani-relevant field of ``request``; raise :class:`SpeechRequestError` on the first problem.

    ``lora_voices``: the server's LoRA voices, lower case → speaker (see :func:`resolve_speaker`)."""
    for name, why in UNSUPPORTED_FIELDS.items():
        if getattr(request, name, None) not in (None, False):
            raise SpeechRequestError(f"'{name}' is not supported by Kani TTS: {why}.")
    extra = dict(request.model_extra or {})
    unknown = sorted(set(extra) - set(EXTRA_FIELDS))
    if unknown:
        raise SpeechRequestError(
            f"Unknown field(s): {', '.join(map(repr, unknown))}. Kani also accepts: {', '.join(EXTRA_FIELDS)}."
        )
    params = request.extra_params
    if params is not None and not isinstance(params, dict):
        raise SpeechRequestError("'extra_params' must be a JSON object")
    for name, value in (params or {}).items():
        if name in EXTRA_FIELDS:
            extra.setdefault(name, value)

    defaults = settings.sampling
    temperature = _number("temperature", extra.get("temperature", defaults.temperature))
    top_p = _number("top_p", extra.get("top_p", defaults.top_p))
    top_k = _number("top_k", extra.get("top_k", defaults.top_k), integer=True)
    penalty = _number("repetition_penalty", extra.get("repetition_penalty", defaults.repetition_penalty))
    if temperature < 0:
        raise SpeechRequestError(f"'temperature' must be >= 0, got {temperature}")
    if not 0 < top_p <= 1:
        raise SpeechRequestError(f"'top_p' must be in (0, 1], got {top_p}")
    if top_k == 0 or top_k < -1:
        raise SpeechRequestError(f"'top_k' must be -1 (off) or >= 1, got {top_k}")
    if penalty <= 0:
        raise SpeechRequestError(f"'repetition_penalty' must be > 0, got {penalty}")

    sample_rate = extra.get("sample_rate")
    if sample_rate is not None:
        _number("sample_rate", sample_rate, integer=True)
        if int(sample_rate) not in SUPPORTED_SAMPLE_RATES:
            raise SpeechRequestError(
                f"'sample_rate' {sample_rate} is not supported; choose one of "
                f"{', '.join(map(str, SUPPORTED_SAMPLE_RATES))} (native: {settings.sample_rate})"
            )
        sample_rate = int(sample_rate)
    if request.response_format == "opus":
        if sample_rate is None and settings.sample_rate not in OPUS_SAMPLE_RATES:
            sample_rate = 24000  # Opus cannot carry 22,050 Hz; 24 kHz is the closest it can.
        elif sample_rate is not None and sample_rate not in OPUS_SAMPLE_RATES:
            raise SpeechRequestError(
                f"response_format 'opus' supports sample_rate {', '.join(map(str, sorted(OPUS_SAMPLE_RATES)))}, "
                f"not {sample_rate}"
            )
    if sample_rate == settings.sample_rate:
        sample_rate = None

    return KaniSpeechOptions(
        speaker=resolve_speaker(request.voice, settings, lora_voices),
        temperature=float(temperature),
        top_p=float(top_p),
        top_k=int(top_k),
        repetition_penalty=float(penalty),
        sample_rate=sample_rate,
        lora_voice=lora_voice_of(request.voice, settings, lora_voices),
    )


def check_text(text: str) -> None:
    if not text or not text.strip():
        raise SpeechRequestError("Input text cannot be empty.")
    if len(text) > MAX_INPUT_CHARS:
        raise SpeechRequestError(f"Input is {len(text)} characters; the maximum is {MAX_INPUT_CHARS}.")


def check_max_new_tokens(value: int | None, limit: int) -> None:
    if value is None:
        return
    if value <= 0:
        raise SpeechRequestError(f"'max_new_tokens' must be >= 1, got {value}")
    if value > limit:
        raise SpeechRequestError(f"'max_new_tokens' {value} exceeds this model's limit of {limit} tokens per request")
