"""What Kani adds around vLLM-Omni's speech generation: long input and output rate.

vLLM-Omni turns one speech request into one engine request. For Kani, text longer than one
generation comfortably holds is split at sentence boundaries (``text_segments``); the
segments are generated one after another and their audio is yielded as one stream, so the
client sees a single seamless response. When the client asks for another sample rate (or for
Opus, which cannot carry 22,050 Hz) the audio is resampled on the way out, chunk by chunk.

A streamed request's engine request is queued as soon as its output generator exists, not when the response
starts streaming (``early_start.py``).

Each request's time to first audio, real-time factor and audio seconds go to the speech metrics
(``metrics.py``), timed from its admission.

The consumers downstream (non-streaming encoder, raw and SSE streaming) are vLLM-Omni's and
are unchanged; outputs are shaped for them: streaming outputs carry only new samples, and the
final non-streaming output carries the whole waveform. A codec that hands its audio over as 16-bit
PCM (``codec_pcm16_audio``) has it streamed at its own rate as an int16 array, which vLLM-Omni's
stream passes to the encoder as it is (``encode_pcm_with_numpy`` copies its bytes); everywhere else
(resampling, the whole answer) it becomes float samples again, exactly.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import torch

from vllm_omni_kani.entrypoints import output_handoff
from vllm_omni_kani.entrypoints.openai import warmup
from vllm_omni_kani.entrypoints.openai.early_start import EarlyStart
from vllm_omni_kani.entrypoints.openai.kani_submit import submit_kani_speech
from vllm_omni_kani.entrypoints.openai.metrics import SpeechTiming
from vllm_omni_kani.entrypoints.openai.pcm16 import to_float
from vllm_omni_kani.entrypoints.openai.resample import StreamingResampler
from vllm_omni_kani.entrypoints.openai.speech_guard import current_speech
from vllm_omni_kani.entrypoints.openai.speech_request import MAX_SEGMENT_CHARS
from vllm_omni_kani.entrypoints.openai.text_segments import split_text
from vllm_omni_kani.envs import generic_submit, lazy_submit

logger = logging.getLogger(__name__)

# How one segment's engine request is made: ``(server, request, request_id, has_inline_ref_audio)`` ->
# ``(request_id, output generator, tts_params)``; ``kani_submit.submit_kani_speech`` or vLLM-Omni's generic one.
Submit = Callable[..., Awaitable[tuple[str, AsyncIterator[Any], dict[str, Any]]]]


def _audio_of(server: Any, res: Any) -> tuple[Any, str | None]:
    return server._extract_audio_output(res)


def _as_tensor(value: Any) -> torch.Tensor:
    """An output's audio as one 1-D CPU tensor (a list of chunks is concatenated): int16 where the codec handed over
    16-bit PCM, float32 otherwise."""
    if isinstance(value, list):
        parts = [_samples(v) for v in value if hasattr(v, "numel") and v.numel() > 0]
        if len({p.dtype for p in parts}) > 1:
            parts = [to_float(p) for p in parts]
        return torch.cat(parts) if parts else torch.zeros(0)
    return _samples(value) if hasattr(value, "reshape") else torch.zeros(0)


def _samples(value: torch.Tensor) -> torch.Tensor:
    flat = value.reshape(-1).cpu()
    return flat if flat.dtype == torch.int16 else flat.float()


def _set(mapping: Any, key: str, value: Any) -> None:
    """Replace ``key`` in a vLLM-Omni payload (a dict or a ``MultimodalPayload``)."""
    tensors = getattr(mapping, "tensors", None)
    if isinstance(tensors, dict):
        if key in tensors or isinstance(value, torch.Tensor):
            tensors[key] = value
            getattr(mapping, "metadata", {}).pop(key, None)
        else:
            mapping.metadata[key] = value
    else:
        mapping[key] = value


class _SegmentAudio:
    """Turns one segment's outputs into new samples, whatever form the engine used."""

    def __init__(self) -> None:
        self.seen_chunks = 0
        self.seen_samples = 0

    def new_samples(self, value: Any, streaming: bool) -> torch.Tensor:
        if isinstance(value, list):  # cumulative list of chunks
            fresh = value[self.seen_chunks :]
            self.seen_chunks = len(value)
            return _as_tensor(fresh)
        audio = _as_tensor(value)
        if streaming:
            return audio  # per-step delta
        fresh = audio[self.seen_samples :]  # cumulative waveform
        self.seen_samples = audio.numel()
        return fresh


def choose_submit(generic: Submit | None) -> Submit:
    """``kani_submit``'s, unless ``KANI_GENERIC_SUBMIT`` asks for ``generic`` (vLLM-Omni's) for an A/B run."""
    return generic if generic is not None and generic_submit() else submit_kani_speech


async def prepare_kani_speech(
    server: Any,
    request: Any,
    request_id: str | None,
    has_inline_ref_audio: bool | None,
    generic: Submit | None = None,
) -> tuple[str, AsyncIterator[Any], dict[str, Any]]:
    """``_prepare_speech_generation`` for Kani: segments, resampling, one output stream (each segment's engine
    request from ``kani_submit``, or from ``generic`` under ``KANI_GENERIC_SUBMIT``)."""
    submit = choose_submit(generic)
    adapter = server._get_tts_adapter()
    error = adapter.validate(request)
    if error:
        raise ValueError(error)
    options = adapter.options(request)
    segments = split_text(request.input, MAX_SEGMENT_CHARS)
    streaming = request.is_streaming()
    native = adapter.settings.sample_rate
    out_rate = options.sample_rate or native
    guard = current_speech()
    entry = guard.entry if guard else None
    if entry is not None:
        entry.stamp("handler")
    timing = SpeechTiming(
        streaming, native, arrival=entry.admitted_at if entry else time.perf_counter(), recorded=warmup.recording()
    )
    first_id, first_gen, tts_params = await submit(
        server, request.model_copy(update={"input": segments[0]}), request_id, has_inline_ref_audio
    )
    if entry is not None:
        entry.stamp("submitted")
        if entry.trace is not None:
            output_handoff.watch(first_id)  # before the generator's first step submits the engine request
    # Streamed: queue the engine request now rather than when the response starts (early_start.py).
    early = EarlyStart(first_gen) if streaming and not lazy_submit() else None
    if len(segments) > 1:
        logger.info("speech request %s: %d characters in %d segments", first_id, len(request.input), len(segments))

    async def outputs() -> AsyncIterator[Any]:
        resampler = StreamingResampler(native, out_rate)
        sample_rate = torch.tensor(out_rate)  # one for all of this request's chunks (only ever read)
        whole: list[torch.Tensor] = []
        last = None
        for index, text in enumerate(segments):
            if index == 0:
                gen = first_gen
                source = early.outputs() if early is not None else gen
            else:
                _, gen, _ = await submit(
                    server, request.model_copy(update={"input": text}), f"{first_id}-{index}", has_inline_ref_audio
                )
                source = gen
            audio_state = _SegmentAudio()
            try:
                async for res in source:
                    last = res
                    payload, key = _audio_of(server, res)
                    if key is None:
                        continue
                    fresh = audio_state.new_samples(payload[key], streaming)
                    if timing.audio(fresh.numel()) and entry is not None:
                        handoff = output_handoff.crossing(first_id, getattr(res, "request_output", None))
                        queued = output_handoff.queued_at(first_id)
                        if queued is not None:
                            entry.stamp("queued", queued)
                        read = output_handoff.read_at(first_id)
                        if read is not None:
                            entry.stamp("read", read)
                        if handoff is not None:
                            entry.stamp("orchestrated", handoff[0])
                            entry.stamp("dequeued", handoff[1])
                        entry.stamp("first_audio")
                        output_handoff.release(first_id)
                    if streaming:
                        if resampler.passthrough and fresh.dtype == torch.int16:
                            _set(payload, key, fresh.numpy())  # PCM already: no float round trip
                        else:
                            _set(payload, key, resampler.push(to_float(fresh)))
                        _set(payload, "sr", sample_rate)
                        yield res
                    else:
                        whole.append(to_float(fresh))
            finally:
                # A client that goes away closes this generator: close the engine's too, which aborts it.
                if early is not None and index == 0:
                    await source.aclose()
                    await early.aclose()
                else:
                    await gen.aclose()
                if index == 0:
                    output_handoff.release(first_id)
        timing.finish()
        if last is None:
            return
        if streaming:
            tail = resampler.flush()
            if tail.numel():
                payload, key = _audio_of(server, last)
                _set(payload, key, tail)
                yield last
            return
        payload, key = _audio_of(server, last)
        if key is None:
            yield last
            return
        audio = torch.cat(whole) if whole else torch.zeros(0)
        _set(payload, key, torch.cat([resampler.push(audio), resampler.flush()]) if out_rate != native else audio)
        _set(payload, "sr", sample_rate)
        yield last

    stream = outputs()
    if entry is not None:
        entry.outputs.append(stream)
        if early is not None:  # its engine request is queued already: closed at release even if nothing streamed
            entry.outputs.append(early)
    return first_id, stream, tts_params
