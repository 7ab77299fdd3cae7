"""Kani-TTS-2 voices from reference audio, in vLLM-Omni's voice-cloning conventions.

Two ways in, both vLLM-Omni's own:

* **upload once, use by name**: ``POST /v1/audio/voices`` (multipart ``audio_sample``, ``consent``, ``name``; or a
  precomputed ``speaker_embedding`` JSON list instead of the clip), then ``"voice": NAME`` in speech requests.
  vLLM-Omni stores the upload (``SPEAKER_SAMPLES_DIR``), lists it under ``uploaded_voices`` and deletes it with
  ``DELETE /v1/audio/voices/{name}``;
* **inline**: ``"ref_audio"`` in the speech request: an http(s) URL, a ``data:`` URL with base64 audio, or a
  ``file://`` path under ``--allowed-local-media-path``, read by vLLM-Omni's ``_resolve_ref_audio``.

Either clip becomes the LM's speaker embedding through the checkpoint's speaker model
(``speaker_embedder.py``), here in the API server process, on the CPU, once per clip: an upload is embedded
when it arrives (so a clip the model cannot use is refused by the upload itself) and cached by voice name and
upload time; inline clips are cached by their text (a long input's segments, or a client repeating a clip,
embed it once).

vLLM-Omni 0.26's upload is model-independent: it stores any decodable 1–30 s clip and leaves each model to read
it at request time, and it asks the adapter nothing. So :meth:`VoiceCloning.install` wraps the three voice
methods of the speech server *instance* (``upload_voice``, ``upload_voice_embedding``, ``delete_voice``): Kani's
checks run first (a model without a speaker embedding, or without a speaker model, refuses the upload with a
400 that says why), then vLLM-Omni's method, then the embedding.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import logging
from collections import OrderedDict
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from vllm_omni_kani.entrypoints.openai.load_once import LoadOnce
from vllm_omni_kani.entrypoints.openai.speech_request import SpeechRequestError
from vllm_omni_kani.model_executor.models.kani_tts.speaker_embedder import (
    MAX_SECONDS,
    MIN_SECONDS,
    SPEAKER_MODEL_SUBDIR,
    ReferenceAudioError,
    SpeakerEmbedder,
    prepare_reference,
    speaker_model_dim,
)

logger = logging.getLogger(__name__)

# Stage 0 ``additional_config`` key naming a speaker model directory (else ``<checkpoint>/speaker_model/``).
SPEAKER_MODEL_KEY = "kani_speaker_model"
# Inline clips whose embeddings are kept (128 floats each).
_INLINE_CACHE_ENTRIES = 256
_CLIP_LIMITS = f"{MIN_SECONDS:g}–{MAX_SECONDS:g} s of speech, WAV/FLAC/OGG or anything FFmpeg decodes"


class VoiceCloningConfigError(ValueError):
    """A speaker model that was asked for but cannot serve this checkpoint; raised at server start."""


def locate_speaker_model(checkpoint: str, stage_config: Mapping[str, Any] | None) -> Path | None:
    """The speaker model directory: Stage 0's ``additional_config.kani_speaker_model`` if set (it must exist),
    else ``<checkpoint>/speaker_model/`` if present, else None."""
    configured = (stage_config or {}).get(SPEAKER_MODEL_KEY)
    if configured:
        path = Path(str(configured)).expanduser()
        if not (path / "config.json").is_file():
            raise VoiceCloningConfigError(f"{SPEAKER_MODEL_KEY}: {path} is not a speaker model (no config.json)")
        return path
    candidate = Path(checkpoint) / SPEAKER_MODEL_SUBDIR
    return candidate if (candidate / "config.json").is_file() else None


class VoiceCloning:
    """Speaker embeddings for one server: from uploaded voices and inline reference clips."""

    def __init__(self, server: Any, speaker_emb_dim: int | None, checkpoint: str, stage_config: Any = None):
        self.server = server
        self.speaker_emb_dim = speaker_emb_dim
        self.model_dir = None
        if speaker_emb_dim:
            self.model_dir = locate_speaker_model(checkpoint, stage_config if isinstance(stage_config, Mapping) else {})
        if self.model_dir is not None:
            dim = speaker_model_dim(self.model_dir)
            if dim != speaker_emb_dim:
                raise VoiceCloningConfigError(
                    f"the speaker model {self.model_dir} gives {dim} floats, but the checkpoint's speaker_emb_dim is "
                    f"{speaker_emb_dim}"
                )
        self._embedder: LoadOnce[SpeakerEmbedder] = LoadOnce(self._load_embedder)
        # One thread: embeddings are CPU work in the API server process, one clip at a time.
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kani-speaker-model")
        self._voices: dict[str, tuple[int, list[float]]] = {}  # voice (lower case) -> (created_at, embedding)
        self._clips: OrderedDict[str, list[float]] = OrderedDict()  # sha1 of an inline ref_audio -> embedding

    # -- what a request may use -------------------------------------------------------------------------------

    def unavailable(self) -> str | None:
        """Why this server cannot clone a voice from audio, or None when it can."""
        if not self.speaker_emb_dim:
            return (
                "this checkpoint has no speaker embedding (voice cloning needs a Kani-TTS-2 checkpoint, whose "
                "config.json has speaker_emb_dim)"
            )
        if self.model_dir is None:
            return (
                f"no speaker model: put one in the checkpoint's {SPEAKER_MODEL_SUBDIR}/ folder or name it in Stage 0's "
                f"additional_config as {SPEAKER_MODEL_KEY} (a precomputed 'speaker_embedding' works without one)"
            )
        return None

    def uploaded(self, voice: str | None) -> dict[str, Any] | None:
        """vLLM-Omni's record of an uploaded voice of this name (case-insensitive), or None."""
        if not voice:
            return None
        return (getattr(self.server, "uploaded_speakers", None) or {}).get(voice.lower())

    def check_uploaded_voice(self, voice: str) -> None:
        """Raise :class:`SpeechRequestError` unless this uploaded voice can be spoken by this model."""
        info = self.uploaded(voice) or {}
        if info.get("embedding_source") == "direct":
            if not self.speaker_emb_dim:
                raise SpeechRequestError(f"Voice '{voice}' is an uploaded speaker embedding, but {self.unavailable()}.")
            dim = info.get("embedding_dim")
            if dim is not None and int(dim) != self.speaker_emb_dim:
                raise SpeechRequestError(
                    f"Voice '{voice}' is an uploaded {dim}-float speaker embedding; this model takes "
                    f"{self.speaker_emb_dim} (speaker_emb_dim)."
                )
            return
        reason = self.unavailable()
        if reason:
            raise SpeechRequestError(f"Voice '{voice}' is an uploaded reference clip, but {reason}.")

    # -- embeddings -------------------------------------------------------------------------------------------

    async def voice_embedding(self, voice: str) -> list[float]:
        """The speaker embedding of an uploaded voice (computed once per upload)."""
        self.check_uploaded_voice(voice)
        info = self.uploaded(voice)
        if info is None:
            raise SpeechRequestError(f"Unknown voice '{voice}'.")
        key, created = voice.lower(), int(info.get("created_at", 0))
        cached = self._voices.get(key)
        if cached is not None and cached[0] == created:
            return cached[1]
        if info.get("embedding_source") == "direct":
            vector = self.server._get_uploaded_speaker_embedding(voice)
            if vector is None or len(vector) != self.speaker_emb_dim:
                raise SpeechRequestError(f"The stored speaker embedding of voice '{voice}' cannot be read.")
        else:
            audio = self.server._load_uploaded_audio(voice)
            if audio is None:
                raise SpeechRequestError(f"The audio file of uploaded voice '{voice}' is missing.")
            vector = await self._embed(*audio)
        self._voices[key] = (created, [float(x) for x in vector])
        return self._voices[key][1]

    async def clip_embedding(self, ref_audio: str) -> list[float]:
        """The speaker embedding of an inline ``ref_audio`` (URL, data URL or file URI)."""
        reason = self.unavailable()
        if reason:
            raise SpeechRequestError(f"'ref_audio' cannot be used: {reason}.")
        key = hashlib.sha1(ref_audio.encode()).hexdigest()
        if key in self._clips:
            self._clips.move_to_end(key)
            return self._clips[key]
        try:
            samples, rate = await self.server._resolve_ref_audio(ref_audio)
        except Exception as exc:  # every way a clip can fail to load is the client's to fix
            raise SpeechRequestError(f"Could not use 'ref_audio' ({_CLIP_LIMITS}): {exc}") from exc
        vector = await self._embed(samples, rate)
        self._clips[key] = vector
        while len(self._clips) > _INLINE_CACHE_ENTRIES:
            self._clips.popitem(last=False)
        return vector

    async def _embed(self, samples: Any, sample_rate: int) -> list[float]:
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._executor, self._embed_blocking, samples, int(sample_rate))
        except ReferenceAudioError as exc:
            raise SpeechRequestError(str(exc)) from exc

    def _embed_blocking(self, samples: Any, sample_rate: int) -> list[float]:
        reference = prepare_reference(samples, sample_rate)
        return self._embedder.get().embed(reference).tolist()

    def _load_embedder(self) -> SpeakerEmbedder:
        logger.info("Loading the Kani-TTS-2 speaker model from %s", self.model_dir)
        return SpeakerEmbedder.from_dir(self.model_dir)

    # -- /v1/audio/voices --------------------------------------------------------------------------------------

    def install(self) -> None:
        """Put Kani's checks around this server's voice upload and delete (see the module docstring)."""
        server_cls = type(self.server)
        if not all(hasattr(server_cls, m) for m in ("upload_voice", "upload_voice_embedding", "delete_voice")):
            return
        # The class's methods, bound here: installing again (a new adapter) replaces the wrappers, never stacks them.
        upload = functools.partial(server_cls.upload_voice, self.server)
        upload_embedding = functools.partial(server_cls.upload_voice_embedding, self.server)
        delete = functools.partial(server_cls.delete_voice, self.server)

        async def upload_voice(audio_file: Any, consent: str, name: str, *, ref_text: str | None = None, **kw: Any):
            reason = self.unavailable()
            if reason:
                raise ValueError(f"Cannot upload voice '{name}': {reason}.")
            if ref_text and ref_text.strip():
                raise ValueError(
                    "'ref_text' is not used by Kani-TTS-2: it clones a voice from the audio alone; upload the clip "
                    "without it."
                )
            result = await upload(audio_file, consent, name, ref_text=None, **kw)
            try:
                vector = await self.voice_embedding(name)
            except SpeechRequestError as exc:
                await delete(name)
                raise ValueError(f"Voice '{name}' was not kept: {exc}") from exc
            return {**result, "embedding_dim": len(vector)}

        async def upload_voice_embedding(embedding_json: str, consent: str, name: str):
            if not self.speaker_emb_dim:
                raise ValueError(f"Cannot upload voice '{name}': {self.unavailable()}.")
            try:
                size = len(json.loads(embedding_json))
            except (TypeError, ValueError):
                size = None  # vLLM-Omni's own check explains a malformed list
            if size is not None and size != self.speaker_emb_dim:
                raise ValueError(
                    f"'speaker_embedding' must have {self.speaker_emb_dim} numbers for this model (speaker_emb_dim), "
                    f"got {size}."
                )
            return await upload_embedding(embedding_json, consent, name)

        async def delete_voice(name: str) -> bool:
            deleted = await delete(name)
            self._voices.pop(name.lower(), None)
            return deleted

        self.server.upload_voice = upload_voice
        self.server.upload_voice_embedding = upload_voice_embedding
        self.server.delete_voice = delete_voice
