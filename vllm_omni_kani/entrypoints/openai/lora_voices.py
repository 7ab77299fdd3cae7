"""LoRA voices: a request's ``voice`` selects a fine-tuned speaker adapter that Stage 0 runs with.

A LoRA voice is a vLLM LoRA adapter of the LFM2 backbone, named after the voice. Stage 0 serves adapters when its
deploy-YAML entry has ``enable_lora: true`` (with ``max_lora_rank`` and ``max_loras``, vLLM's engine arguments).
The voices come from three places, all vLLM's own registry of adapters (``OpenAIServingModels.lora_requests``,
which ``/v1/models`` lists):

* **the deploy YAML**: Stage 0's ``additional_config: {kani_lora_voices: {NAME: PATH}}`` (or
  ``{NAME: {path: PATH, speaker: SPEAKER}}`` to prompt with one of the checkpoint's speakers). Each adapter is
  checked when the server starts, registered under its voice name and loaded into Stage 0 right away;
* **the command line**: ``vllm serve ... --lora-modules NAME=PATH``, vLLM's static adapters;
* **at run time**: ``POST /v1/load_lora_adapter`` ``{"lora_name": NAME, "lora_path": PATH}`` and
  ``POST /v1/unload_lora_adapter``, vLLM's routes, served when ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=1``.

``GET /v1/audio/voices`` lists every LoRA voice next to the checkpoint's speakers. A request with ``"voice": NAME``
is prompted as the voice's speaker (by default the checkpoint's default speaker) and Stage 0 generates with the
adapter; requests of different voices, and of built-in voices, share Stage 0's batches. Built-in names (the
checkpoint's speakers, OpenAI's voice names) always mean the built-in voice.

vLLM-Omni 0.26 has no per-request LoRA on ``/v1/audio/speech``, and ``AsyncOmni.generate`` accepts a
``lora_request`` but never hands it to the engine (``add_request_async`` is called without it), so the adapter's
request travels in the engine prompt under :data:`LORA_REQUEST_KEY`, and :func:`enable_prompt_lora` wraps the
engine's ``add_request`` (of this server's engine instance) to move it into ``lora_request``, which vLLM's input
processor and scheduler then honour. Loading an adapter into Stage 0 (``AsyncOmni.add_lora``) needs two fixes of
vLLM-Omni 0.26, in ``lora_patch.py``.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from vllm_omni_kani.entrypoints.openai.speech_request import OPENAI_VOICES

logger = logging.getLogger(__name__)

# Stage 0 ``additional_config`` key of the voice → adapter mapping.
LORA_VOICES_KEY = "kani_lora_voices"
# Engine prompt key carrying a request's ``LoRARequest`` to ``add_request`` (removed there).
LORA_REQUEST_KEY = "kani_lora_request"
_ADAPTER_CONFIG = "adapter_config.json"
_ADAPTER_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin", "adapter_model.pt")
# vLLM's default max_lora_rank, when the stage does not set one.
_DEFAULT_MAX_LORA_RANK = 16


class LoRAVoiceConfigError(ValueError):
    """A configured LoRA voice that cannot be served; raised at server start."""


def check_adapter_dir(path: Path, max_lora_rank: int, voice: str) -> None:
    """Raise :class:`LoRAVoiceConfigError` unless ``path`` holds a PEFT LoRA adapter vLLM can load here."""
    config_file = path / _ADAPTER_CONFIG
    if not config_file.is_file():
        raise LoRAVoiceConfigError(f"LoRA voice '{voice}': {path} is not a LoRA adapter (no {_ADAPTER_CONFIG})")
    try:
        config = json.loads(config_file.read_text())
    except ValueError as exc:
        raise LoRAVoiceConfigError(f"LoRA voice '{voice}': {config_file} is not JSON: {exc}") from exc
    if str(config.get("peft_type", "LORA")).upper() != "LORA":
        raise LoRAVoiceConfigError(f"LoRA voice '{voice}': {config_file} is a {config['peft_type']} adapter, not LORA")
    rank = config.get("r")
    if not isinstance(rank, int) or rank < 1:
        raise LoRAVoiceConfigError(f"LoRA voice '{voice}': {config_file} has no LoRA rank 'r'")
    if rank > max_lora_rank:
        raise LoRAVoiceConfigError(
            f"LoRA voice '{voice}': its rank {rank} exceeds Stage 0's max_lora_rank {max_lora_rank}; raise "
            f"max_lora_rank in the deploy YAML"
        )
    if not any((path / name).is_file() for name in _ADAPTER_WEIGHTS):
        raise LoRAVoiceConfigError(
            f"LoRA voice '{voice}': {path} has no adapter weights ({', '.join(_ADAPTER_WEIGHTS)})"
        )


def _prompt_with_lora(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """``add_request``'s arguments with a prompt's :data:`LORA_REQUEST_KEY` moved into ``lora_request``."""
    positional = "prompt" not in kwargs and len(args) > 1
    prompt = args[1] if positional else kwargs.get("prompt")
    if not isinstance(prompt, dict) or LORA_REQUEST_KEY not in prompt:
        return args, kwargs
    prompt = dict(prompt)
    lora_request = prompt.pop(LORA_REQUEST_KEY)
    if positional:
        args = (args[0], prompt, *args[2:])
    else:
        kwargs = {**kwargs, "prompt": prompt}
    if kwargs.get("lora_request") is None and lora_request is not None:
        kwargs["lora_request"] = lora_request
    return args, kwargs


def enable_prompt_lora(engine: Any) -> None:
    """Let this engine (vLLM-Omni's ``AsyncOmniEngine``, the ``engine`` of ``Omni`` and ``AsyncOmni``) take a
    request's ``LoRARequest`` from its prompt (:data:`LORA_REQUEST_KEY`). Idempotent; this instance only."""
    original = engine.add_request
    if getattr(original, "__kani_prompt_lora__", False):
        return

    @functools.wraps(original)
    def add_request(*args: Any, **kwargs: Any) -> Any:
        args, kwargs = _prompt_with_lora(args, kwargs)
        return original(*args, **kwargs)

    add_request.__kani_prompt_lora__ = True  # type: ignore[attr-defined]
    engine.add_request = add_request


def lora_prompt(prompt: Mapping[str, Any], lora_request: Any) -> dict[str, Any]:
    """``prompt`` for an engine set up by :func:`enable_prompt_lora`, generated with ``lora_request``."""
    return {**prompt, LORA_REQUEST_KEY: lora_request}


class LoRAVoices:
    """The LoRA voices of one speech server (see the module docstring)."""

    def __init__(
        self,
        server: Any,
        stage_args: Any,
        speakers: Collection[str],
        default_speaker: str | None,
    ):
        """``speakers``: the checkpoint's built-in speakers (with OpenAI's names, never a LoRA voice's name)."""
        self.server = server
        self.enabled = bool(getattr(stage_args, "enable_lora", False))
        self.max_lora_rank = int(getattr(stage_args, "max_lora_rank", None) or _DEFAULT_MAX_LORA_RANK)
        self.default_speaker = default_speaker
        self._builtin = {v.lower() for v in speakers} | {v.lower() for v in OPENAI_VOICES} | {"default"}
        self._speaker_by_voice: dict[str, str | None] = {}  # voice (lower case) -> speaker prefix, if configured
        self._configured: list[Any] = []  # LoRARequests of the deploy YAML, loaded into Stage 0 at start
        additional = getattr(stage_args, "additional_config", None)
        configured = (additional if isinstance(additional, Mapping) else {}).get(LORA_VOICES_KEY) or {}
        if not isinstance(configured, Mapping):
            raise LoRAVoiceConfigError(f"{LORA_VOICES_KEY} must map voice names to adapter directories")
        if configured and not self.enabled:
            raise LoRAVoiceConfigError(
                f"{LORA_VOICES_KEY} is set, but Stage 0 does not serve LoRA adapters: add enable_lora: true (and "
                f"max_lora_rank, max_loras) to Stage 0 in the deploy YAML"
            )
        by_speaker = {s.lower(): s for s in speakers}
        for voice, entry in configured.items():
            path, speaker = self._parse_entry(str(voice), entry, by_speaker)
            self._register(str(voice), path, speaker)

    # -- configuration ----------------------------------------------------------------------------------------

    def _parse_entry(self, voice: str, entry: Any, by_speaker: Mapping[str, str]) -> tuple[Path, str | None]:
        speaker = self.default_speaker
        if isinstance(entry, Mapping):
            unknown = sorted(set(entry) - {"path", "speaker"})
            if unknown or "path" not in entry:
                raise LoRAVoiceConfigError(
                    f"{LORA_VOICES_KEY}.{voice}: give an adapter directory, or {{path: DIR, speaker: NAME}}"
                )
            if entry.get("speaker") is not None:
                name = str(entry["speaker"]).lower()
                if name not in by_speaker:
                    raise LoRAVoiceConfigError(
                        f"{LORA_VOICES_KEY}.{voice}: unknown speaker '{entry['speaker']}'; the checkpoint has "
                        f"{', '.join(sorted(by_speaker.values())) or 'no named speakers'}"
                    )
                speaker = by_speaker[name]
            entry = entry["path"]
        if not voice.strip() or voice.lower() in self._builtin:
            raise LoRAVoiceConfigError(
                f"LoRA voice name '{voice}' is taken by a built-in voice (a speaker of the checkpoint or an OpenAI "
                f"voice name); choose another"
            )
        path = Path(str(entry)).expanduser()
        check_adapter_dir(path, self.max_lora_rank, voice)
        return path, speaker

    def _register(self, voice: str, path: Path, speaker: str | None) -> None:
        from vllm.lora.request import LoRARequest

        models = self._models()
        if models is None:
            raise LoRAVoiceConfigError("this server has no model registry to hold LoRA adapters")
        existing = models.lora_requests.get(voice)
        if existing is not None and Path(existing.lora_path) != path:
            raise LoRAVoiceConfigError(
                f"LoRA voice '{voice}': --lora-modules already names an adapter '{voice}' at {existing.lora_path}"
            )
        request = existing or LoRARequest(
            lora_name=voice, lora_int_id=models.lora_id_counter.inc(1), lora_path=str(path)
        )
        models.lora_requests[voice] = request
        self._speaker_by_voice[voice.lower()] = speaker
        self._configured.append(request)

    def _models(self) -> Any:
        return getattr(self.server, "models", None)

    # -- what a request may use -------------------------------------------------------------------------------

    def _adapters(self) -> dict[str, Any]:
        """LoRA voice (lower case) → its ``LoRARequest``; built-in names excluded."""
        models = self._models()
        if not self.enabled or models is None:
            return {}
        return {name.lower(): req for name, req in models.lora_requests.items() if name.lower() not in self._builtin}

    def names(self) -> list[str]:
        models = self._models()
        if not self.enabled or models is None:
            return []
        return sorted(name for name in models.lora_requests if name.lower() not in self._builtin)

    def request_for(self, voice: str | None) -> Any:
        """The ``LoRARequest`` of a LoRA voice (case-insensitive), or None."""
        if not voice:
            return None
        return self._adapters().get(voice.lower())

    def speaker_for(self, voice: str) -> str | None:
        """The speaker prefix a LoRA voice is prompted with."""
        return self._speaker_by_voice.get(voice.lower(), self.default_speaker)

    # -- the server around it ---------------------------------------------------------------------------------

    def install(self) -> None:
        """Hook this server's engine and adapter registry; list the voices; load the YAML's adapters."""
        if not self.enabled:
            return
        engine_client = self.server.engine_client
        engine = getattr(engine_client, "engine", None)
        if engine is not None:
            enable_prompt_lora(engine)
        self._track_registry()
        self.server.supported_speakers |= {name.lower() for name in self.names()}
        if self._configured:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                return  # no event loop (a test without a server): adapters load with their first request
            self._preload = loop.create_task(self._load_configured())

    async def _load_configured(self) -> None:
        for request in self._configured:
            try:
                await self.server.engine_client.add_lora(request)
                logger.info("LoRA voice '%s' loaded from %s", request.lora_name, request.lora_path)
            except Exception:
                logger.exception("LoRA voice '%s' could not be loaded from %s", request.lora_name, request.lora_path)

    def _track_registry(self) -> None:
        """Keep ``/v1/audio/voices`` in step with adapters loaded and unloaded at run time."""
        models = self._models()
        if models is None or getattr(models, "__kani_lora_voices__", False):
            return
        load, unload = models.load_lora_adapter, models.unload_lora_adapter
        speakers = self.server.supported_speakers

        @functools.wraps(load)
        async def load_lora_adapter(request: Any, *args: Any, **kwargs: Any) -> Any:
            result = await load(request, *args, **kwargs)
            name = getattr(request, "lora_name", None)
            if isinstance(result, str) and name:
                if name.lower() in self._builtin:
                    logger.warning("LoRA adapter '%s' has a built-in voice's name: it is not a voice", name)
                else:
                    speakers.add(name.lower())
                    logger.info("LoRA voice '%s' added", name)
            return result

        @functools.wraps(unload)
        async def unload_lora_adapter(request: Any, *args: Any, **kwargs: Any) -> Any:
            result = await unload(request, *args, **kwargs)
            name = getattr(request, "lora_name", None)
            if isinstance(result, str) and name and name.lower() not in self._builtin:
                if name.lower() not in self._adapters():
                    speakers.discard(name.lower())
                self._speaker_by_voice.pop(name.lower(), None)
            return result

        models.load_lora_adapter = load_lora_adapter
        models.unload_lora_adapter = unload_lora_adapter
        models.__kani_lora_voices__ = True
