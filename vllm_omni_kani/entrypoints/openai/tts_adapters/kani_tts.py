"""Kani TTS on vLLM-Omni's ``/v1/audio/speech``: validation and request → Stage-0 prompt.

The whole serving surface of the model: speakers and language tags from the checkpoint, OpenAI
voice names mapped to the default speaker, Kani's prompt layout around ``"{tag}: {speaker}: {text}"``,
the request's sampling knobs on top of the checkpoint's defaults (``kani_tts.sampling``, else its
``generation_config.json``, else the official packages' values), and a Kani-TTS-2 speaker embedding:
precomputed (``speaker_embedding``), or from reference audio, uploaded as a voice or inline as
``ref_audio`` (``voice_clone.py``), and LoRA voices: a ``voice`` that names a fine-tuned speaker adapter, which
Stage 0 runs with (``lora_voices.py``). Long input, resampling and output shaping live in ``kani_speech.py``.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

import torch
from vllm.sampling_params import RequestOutputKind
from vllm_omni.entrypoints.openai.tts_adapters.base import ARTTSAdapter, PreparedRequest, SpeechServingContext

from vllm_omni_kani.entrypoints.openai.kani_submit import own_copy
from vllm_omni_kani.entrypoints.openai.load_once import LoadOnce
from vllm_omni_kani.entrypoints.openai.lora_voices import LORA_REQUEST_KEY, LoRAVoices
from vllm_omni_kani.entrypoints.openai.speech_request import (
    MAX_SEGMENT_CHARS,
    KaniSpeechOptions,
    SpeechRequestError,
    check_max_new_tokens,
    check_text,
    parse_options,
)
from vllm_omni_kani.entrypoints.openai.voice_clone import VoiceCloning
from vllm_omni_kani.model_executor.models.kani_tts import token_layout as tl
from vllm_omni_kani.model_executor.models.kani_tts.configuration import (
    FrameLevelSettings,
    KaniTTSSettings,
    read_generation_config,
)

MODEL_TYPE = "kani_tts"
# Longest prompt a segment can produce: ~1 token per character plus the layout's control tokens.
_PROMPT_TOKEN_BUDGET = MAX_SEGMENT_CHARS + 64
# Where a checked language tag travels with the request: vLLM-Omni's generic per-request channel, which the
# Kani option parser leaves alone (the top-level `language` field is refused there for checkpoints without tags).
LANGUAGE_PARAM = "language"
# The same channel for a precomputed Kani-TTS-2 speaker embedding and for an inline reference clip (the option
# parser refuses both top-level fields; the adapter checks them and says why a model cannot take them).
SPEAKER_EMBEDDING_PARAM = tl.SPEAKER_EMBEDDING_KEY
REF_AUDIO_PARAM = "ref_audio"
# And for a `voice` that names an uploaded voice this model clones: moved off `voice`, whose built-in speakers the
# option parser checks; such a voice is spoken as no built-in speaker, its embedding being the voice.
UPLOADED_VOICE_PARAM = "uploaded_voice"
# vLLM-Omni's other cloning fields, which Kani-TTS-2's cloning has no use for.
_CLONING_FIELDS_UNUSED = {
    "ref_text": "Kani-TTS-2 clones a voice from the audio alone (send 'ref_audio' without a transcript)",
    "ref_audio_2": "Kani-TTS-2 clones from one reference clip",
    "x_vector_only_mode": "Kani-TTS-2 always clones from the speaker embedding alone",
}
# `language` values that ask for no tag (vLLM-Omni's other TTS models default to "Auto").
_NO_LANGUAGE = frozenset({"", "auto"})


class KaniTTSAdapter(ARTTSAdapter):
    name = MODEL_TYPE
    stage_keys = frozenset({MODEL_TYPE})

    def __init__(self, ctx: SpeechServingContext):
        super().__init__(ctx)
        server = ctx.server
        stage_args = server._tts_stage.engine_args
        self.model_path = str(getattr(stage_args, "model", None) or server.engine_client.model_config.model)
        hf_config = server.engine_client.model_config.hf_config
        self.settings = KaniTTSSettings.from_hf_config(hf_config, read_generation_config(self.model_path))
        self.max_model_len = int(getattr(stage_args, "max_model_len", None) or 4096)
        self.max_new_tokens_max = self.max_model_len - _PROMPT_TOKEN_BUDGET
        server.supported_speakers |= {s.lower() for s in self.settings.speakers}
        if self.settings.languages:
            server.supported_languages = frozenset(self.settings.languages)
        frame_level = FrameLevelSettings.from_hf_config(hf_config)
        # Floats a request's speaker embedding must have; None: the model takes none.
        self.speaker_emb_dim = None if frame_level is None else frame_level.speaker_emb_dim
        self.cloning = VoiceCloning(
            server, self.speaker_emb_dim, self.model_path, getattr(stage_args, "additional_config", None)
        )
        self.cloning.install()
        self.lora_voices = LoRAVoices(server, stage_args, self.settings.speakers, self.settings.default_speaker)
        self.lora_voices.install()
        self.tokenizer: LoadOnce[Any] = LoadOnce(self._load_tokenizer)
        # With async_chunk the codec reads Stage 0's frames from the connector and nothing in this process uses
        # Stage 0's per-step outputs, which vLLM-Omni would otherwise build and route here, one per stream per
        # step (4,500 a second at 256 streams on an H200): Stage 0 reports once, when it finishes (its stats).
        async_chunk = getattr(server.engine_client.model_config, "async_chunk", False)
        self.stage0_output_kind = RequestOutputKind.FINAL_ONLY if async_chunk else None

    def normalize(self, request: Any) -> None:
        """Move ``language`` (checkpoints with tags), ``speaker_embedding``, ``ref_audio`` and an uploaded ``voice``
        (models that clone) into ``extra_params``, where they are checked; otherwise the option parser answers them
        with a 400. Idempotent."""
        cloned_voice = self.speaker_emb_dim and self.cloning.uploaded(request.voice) is not None
        moves = {
            "language": LANGUAGE_PARAM if self.settings.languages else None,
            "speaker_embedding": SPEAKER_EMBEDDING_PARAM,
            "ref_audio": REF_AUDIO_PARAM,
            "voice": UPLOADED_VOICE_PARAM if cloned_voice else None,
        }
        for field_name, param in moves.items():
            value = getattr(request, field_name, None)
            if value is None or param is None:
                continue
            params = dict(request.extra_params) if isinstance(request.extra_params, dict) else {}
            params[param] = value
            request.extra_params = params
            setattr(request, field_name, None)

    def validate(self, request: Any) -> str | None:
        # Kani's own serving path calls validate without normalize first.
        self.normalize(request)
        try:
            check_text(request.input)
            check_max_new_tokens(request.max_new_tokens, self.max_new_tokens_max)
            self.voice_source(request)
            self.options(request)
            self.language_tag(request)
        except SpeechRequestError as exc:
            return str(exc)
        return None

    def options(self, request: Any) -> KaniSpeechOptions:
        """The request's checked options (after ``normalize``)."""
        lora_voices = {name.lower(): self.lora_voices.speaker_for(name) for name in self.lora_voices.names()}
        try:
            return parse_options(request, self.settings, lora_voices)
        except SpeechRequestError:
            if self.cloning.uploaded(request.voice) is not None:
                self.cloning.check_uploaded_voice(request.voice)  # says why this model cannot speak an upload
            raise

    def voice_source(self, request: Any) -> str | None:
        """Which field the request's speaker embedding comes from (``speaker_embedding``, ``ref_audio`` or
        ``uploaded_voice``: the ``extra_params`` key), checked; None for none. One source at most."""
        for name, why in _CLONING_FIELDS_UNUSED.items():
            if getattr(request, name, None) not in (None, False):
                raise SpeechRequestError(f"'{name}' is not supported by Kani TTS: {why}.")
        params = request.extra_params if isinstance(request.extra_params, dict) else {}
        keys = (SPEAKER_EMBEDDING_PARAM, REF_AUDIO_PARAM, UPLOADED_VOICE_PARAM)
        sources = [key for key in keys if params.get(key) is not None]
        if len(sources) > 1:
            named = " and ".join("an uploaded 'voice'" if s == UPLOADED_VOICE_PARAM else f"'{s}'" for s in sources)
            raise SpeechRequestError(
                f"Give one voice source ('speaker_embedding', 'ref_audio', an uploaded 'voice'), not {named}."
            )
        if not sources:
            return None
        source = sources[0]
        if source == UPLOADED_VOICE_PARAM:
            self.cloning.check_uploaded_voice(params[UPLOADED_VOICE_PARAM])
        elif source == REF_AUDIO_PARAM:
            self.ref_audio(request)
        else:
            self.speaker_embedding(request)
        return source

    def ref_audio(self, request: Any) -> str | None:
        """The request's inline reference clip (one URL, data URL or file URI), or None."""
        params = request.extra_params if isinstance(request.extra_params, dict) else {}
        clip = params.get(REF_AUDIO_PARAM)
        if clip is None:
            return None
        reason = self.cloning.unavailable()
        if reason:
            raise SpeechRequestError(f"'ref_audio' is not supported by Kani TTS: {reason}.")
        if isinstance(clip, list) and len(clip) == 1:
            clip = clip[0]  # one clip in vLLM-Omni's list form
        if not isinstance(clip, str) or not clip.startswith(("http://", "https://", "data:", "file://")):
            raise SpeechRequestError(
                "'ref_audio' must be one clip: an http(s) URL, a data: URL with base64 audio, or a file:// URI"
            )
        return clip

    def speaker_embedding(self, request: Any) -> list[float] | None:
        """The request's precomputed speaker embedding (``speaker_emb_dim`` finite numbers), or None."""
        params = request.extra_params if isinstance(request.extra_params, dict) else {}
        vector = params.get(SPEAKER_EMBEDDING_PARAM)
        if vector is None:
            return None
        if not self.speaker_emb_dim:
            raise SpeechRequestError(f"'speaker_embedding' is not supported by Kani TTS: {self.cloning.unavailable()}.")
        if isinstance(vector, list) and len(vector) == 1 and isinstance(vector[0], list):
            vector = vector[0]  # one vector in vLLM-Omni's list-of-vectors form
        ok = isinstance(vector, list) and all(
            isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) for x in vector
        )
        if not ok or len(vector) != self.speaker_emb_dim:
            raise SpeechRequestError(
                f"'speaker_embedding' must be one vector of {self.speaker_emb_dim} finite numbers "
                f"(this model's speaker_emb_dim)" + (f", got {len(vector)}" if isinstance(vector, list) else "")
            )
        return [float(x) for x in vector]

    def language_tag(self, request: Any) -> str | None:
        """The checkpoint's spelling of the request's language tag; None for none ("auto" or not given)."""
        params = request.extra_params if isinstance(request.extra_params, dict) else {}
        language = params.get(LANGUAGE_PARAM)
        if language is None or str(language).strip().lower() in _NO_LANGUAGE:
            return None
        by_lower = {t.lower(): t for t in self.settings.languages}
        if not isinstance(language, str) or language.strip().lower() not in by_lower:
            available = ", ".join(self.settings.languages) or "(this checkpoint has no language tags)"
            raise SpeechRequestError(f"Unknown language {language!r}. Available: {available}, or 'auto' for none.")
        return by_lower[language.strip().lower()]

    async def build(self, request: Any, sampling_params_list: list, has_inline_ref_audio: bool) -> PreparedRequest:
        self.normalize(request)
        source = self.voice_source(request)
        options = self.options(request)
        language = self.language_tag(request)
        vector = await self._speaker_vector(request, source)
        prompt_ids = await self._prompt_ids(request.input.strip(), options.speaker, language)
        prompt: dict[str, Any] = {"prompt_token_ids": prompt_ids}
        if options.lora_voice is not None:
            lora_request = self.lora_voices.request_for(options.lora_voice)
            if lora_request is None:  # unloaded since the request was checked
                raise SpeechRequestError(f"Unknown voice '{request.voice}'.")
            prompt[LORA_REQUEST_KEY] = lora_request
        if vector is not None:
            # The embedding becomes the prompt's second row (see kani_tts2_lm.SpeakerSplice).
            prompt_ids = prompt["prompt_token_ids"] = tl.with_speaker_slot(prompt_ids)
            prompt["additional_information"] = {tl.SPEAKER_EMBEDDING_KEY: torch.tensor(vector, dtype=torch.float32)}
        default_tokens = self.settings.sampling.max_new_frames * self.settings.tokens_per_frame
        max_tokens = request.max_new_tokens or min(default_tokens, self.max_model_len - len(prompt_ids))
        if len(prompt_ids) + max_tokens > self.max_model_len:
            raise SpeechRequestError(
                f"prompt ({len(prompt_ids)} tokens) plus max_new_tokens ({max_tokens}) exceeds "
                f"max_model_len {self.max_model_len}; shorten the input or lower max_new_tokens"
            )
        # The list is what the server sends to the engine; element 0 may be the engine's shared default.
        stage0 = own_copy(sampling_params_list[0])
        stage0.temperature = options.temperature
        stage0.top_p = options.top_p
        stage0.top_k = options.top_k
        stage0.repetition_penalty = options.repetition_penalty
        stage0.max_tokens = max_tokens
        stage0.stop_token_ids = [tl.END_OF_SPEECH]
        if self.stage0_output_kind is not None:
            stage0.output_kind = self.stage0_output_kind
        sampling_params_list[0] = stage0
        tts_params = {"speaker": [options.speaker], "text": [request.input]}
        if options.lora_voice is not None:
            tts_params["lora_voice"] = [options.lora_voice]
        return PreparedRequest(prompt=prompt, tts_params=tts_params, model_type=MODEL_TYPE)

    async def _speaker_vector(self, request: Any, source: str | None) -> list[float] | None:
        """The speaker embedding from the request's checked source (see ``voice_source``)."""
        if source == UPLOADED_VOICE_PARAM:
            return await self.cloning.voice_embedding(request.extra_params[UPLOADED_VOICE_PARAM])
        if source == REF_AUDIO_PARAM:
            return await self.cloning.clip_embedding(self.ref_audio(request))
        return self.speaker_embedding(request)

    def _load_tokenizer(self) -> Any:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(self.model_path)

    async def _prompt_ids(self, text: str, speaker: str | None, language: str | None = None) -> list[int]:
        """The prompt's token ids: the tokenizer is loaded once, in a worker thread (seconds), then used on the loop.

        A segment (at most ``MAX_SEGMENT_CHARS``) tokenizes in 0.04-0.14 ms, where a hop to an executor thread and
        back waits for the GIL twice on a busy loop (at 64 streams the segment holding it took 31 ms p50 on a GPU
        server, 6-9 ms against 0.5 on a CPU one: docs/BENCHMARKS.md, fifteenth set).
        """
        if not self.tokenizer.loaded:
            await asyncio.get_running_loop().run_in_executor(None, self.tokenizer.get)
        return tl.text_prompt_ids(self.tokenizer.get(), text, speaker, language)
