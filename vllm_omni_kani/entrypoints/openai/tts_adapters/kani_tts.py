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
from typing import Any

from vllm_omni.entrypoints.openai.tts_adapters.base import ARTTSAdapter, PreparedRequest, SpeechServingContext

from vllm_omni_kani.entrypoints.openai.speech_request import (
    MAX_SEGMENT_CHARS,
    SpeechRequestError,
    check_max_new_tokens,
    check_text,
    parse_options,
)
from vllm_omni_kani.model_executor.models.kani_tts import token_layout as tl
from vllm_omni_kani.model_executor.models.kani_tts.configuration import KaniTTSSettings, read_generation_config

MODEL_TYPE = "kani_tts"
# Longest prompt a segment can produce: ~1 token per character plus the layout's control tokens.
_PROMPT_TOKEN_BUDGET = MAX_SEGMENT_CHARS + 64
# Where a checked language tag travels with the request: vLLM-Omni's generic per-request channel, which the
# Kani option parser leaves alone (the top-level `language` field is refused there for checkpoints without tags).
LANGUAGE_PARAM = "language"
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
        self._tokenizer: Any = None

    def normalize(self, request: Any) -> None:
        """Move a checked language tag from ``language`` to ``extra_params`` (idempotent)."""
        language = getattr(request, "language", None)
        if language is None or not self.settings.languages:
            return  # no tags: the option parser answers a `language` with a 400
        params = dict(request.extra_params) if isinstance(request.extra_params, dict) else {}
        params[LANGUAGE_PARAM] = language
        request.extra_params = params
        request.language = None

    def validate(self, request: Any) -> str | None:
        # Kani's own serving path calls validate without normalize first.
        self.normalize(request)
        try:
            check_text(request.input)
            check_max_new_tokens(request.max_new_tokens, self.max_new_tokens_max)
            parse_options(request, self.settings)
            self.language_tag(request)
        except SpeechRequestError as exc:
            return str(exc)
        return None

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
        prompt_ids = await self._prompt_ids(request.input.strip(), options.speaker, language)
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
        return PreparedRequest(prompt={"prompt_token_ids": prompt_ids}, tts_params=tts_params, model_type=MODEL_TYPE)

    async def _prompt_ids(self, text: str, speaker: str | None, language: str | None = None) -> list[int]:
        """Tokenize off the event loop (the tokenizer itself is loaded once, on first use)."""
        loop = asyncio.get_running_loop()
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = await loop.run_in_executor(None, AutoTokenizer.from_pretrained, self.model_path)
        build = functools.partial(tl.text_prompt_ids, self._tokenizer, text, speaker, language)
        return await loop.run_in_executor(None, build)
