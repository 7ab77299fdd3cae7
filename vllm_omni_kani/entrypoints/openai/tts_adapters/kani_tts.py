"""Kani TTS on vLLM-Omni's ``/v1/audio/speech``: validation and request → Stage-0 prompt.

The whole serving surface of the model: speakers and language tags from the checkpoint, OpenAI
voice names mapped to the default speaker, Kani's prompt layout around ``"{tag}: {speaker}: {text}"``,
and the request's sampling knobs on top of the checkpoint's defaults (``kani_tts.sampling``, else its
``generation_config.json``, else the official packages' values). Long input, resampling and output
shaping live in ``kani_speech.py``.
"""

from __future__ import annotations

import asyncio
import functools
import math
from typing import Any

import torch
from vllm_omni.entrypoints.openai.tts_adapters.base import ARTTSAdapter, PreparedRequest, SpeechServingContext

from vllm_omni_kani.entrypoints.openai.speech_request import (
    MAX_SEGMENT_CHARS,
    SpeechRequestError,
    check_max_new_tokens,
    check_text,
    parse_options,
)
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
# The same channel for a precomputed Kani-TTS-2 speaker embedding (the option parser refuses the top-level field,
# which is right for checkpoints without one).
SPEAKER_EMBEDDING_PARAM = tl.SPEAKER_EMBEDDING_KEY
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
        self._tokenizer: Any = None

    def normalize(self, request: Any) -> None:
        """Move ``language`` (checkpoints with tags) and ``speaker_embedding`` (models that take one) into
        ``extra_params``, where they are checked; otherwise the option parser answers them with a 400. Idempotent."""
        moves = {
            "language": LANGUAGE_PARAM if self.settings.languages else None,
            "speaker_embedding": SPEAKER_EMBEDDING_PARAM if self.speaker_emb_dim else None,
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
            parse_options(request, self.settings)
            self.language_tag(request)
            self.speaker_embedding(request)
        except SpeechRequestError as exc:
            return str(exc)
        return None

    def speaker_embedding(self, request: Any) -> list[float] | None:
        """The request's precomputed speaker embedding (``speaker_emb_dim`` finite numbers), or None."""
        params = request.extra_params if isinstance(request.extra_params, dict) else {}
        vector = params.get(SPEAKER_EMBEDDING_PARAM)
        if vector is None:
            return None
        if not self.speaker_emb_dim:
            raise SpeechRequestError("'speaker_embedding' is not supported: this checkpoint has no speaker embedding.")
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
        options = parse_options(request, self.settings)
        language = self.language_tag(request)
        vector = self.speaker_embedding(request)
        prompt_ids = await self._prompt_ids(request.input.strip(), options.speaker, language)
        prompt: dict[str, Any] = {"prompt_token_ids": prompt_ids}
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
        stage0 = sampling_params_list[0].clone()
        stage0.temperature = options.temperature
        stage0.top_p = options.top_p
        stage0.top_k = options.top_k
        stage0.repetition_penalty = options.repetition_penalty
        stage0.max_tokens = max_tokens
        stage0.stop_token_ids = [tl.END_OF_SPEECH]
        sampling_params_list[0] = stage0
        tts_params = {"speaker": [options.speaker], "text": [request.input]}
        return PreparedRequest(prompt=prompt, tts_params=tts_params, model_type=MODEL_TYPE)

    async def _prompt_ids(self, text: str, speaker: str | None, language: str | None = None) -> list[int]:
        """Tokenize off the event loop (the tokenizer itself is loaded once, on first use)."""
        loop = asyncio.get_running_loop()
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = await loop.run_in_executor(None, AutoTokenizer.from_pretrained, self.model_path)
        build = functools.partial(tl.text_prompt_ids, self._tokenizer, text, speaker, language)
        return await loop.run_in_executor(None, build)
