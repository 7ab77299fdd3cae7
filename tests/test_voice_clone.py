"""Voices from reference audio: the speaker model, the clip checks, and uploads and inline clips in the API server.

The speaker model the factory writes into a Kani-TTS-2 checkpoint gives the official ``kani-tts-2`` 0.0.5
``SpeakerEmbedder``'s embedding (run in its own environment, as in ``test_kani_tts2.py``). The server side runs
vLLM-Omni's own speech server object here, without an engine: its voice upload, uploaded-voice store and
``ref_audio`` resolution are the ones a served request goes through (``test_kani_tts2.py`` serves a clip end to end).
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import math
import re
import shutil
import types
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
from transformers import AutoConfig

from tests.test_kani_tts2 import _run_reference, kani_reference_python  # noqa: F401 (a fixture)
from vllm_omni_kani.model_executor.models.kani_tts import token_layout as tl
from vllm_omni_kani.model_executor.models.kani_tts.speaker_embedder import (
    MAX_SECONDS,
    MIN_SECONDS,
    SAMPLE_RATE,
    SPEAKER_MODEL_SUBDIR,
    ReferenceAudioError,
    SpeakerEmbedder,
    prepare_reference,
)

TEXT = "Hello in my own voice."


def tone(seconds: float, rate: int, f0: float = 180.0, channels: int = 1, seed: int = 0) -> np.ndarray:
    """A voiced-sounding clip (a vibrato tone plus a little noise), float32 ``[T]`` or ``[T, channels]``."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * rate)) / rate
    mono = 0.3 * np.sin(2 * np.pi * f0 * t + 3 * np.sin(2 * np.pi * 3 * t)) + 0.01 * rng.standard_normal(t.size)
    if channels == 1:
        return mono.astype(np.float32)
    return np.stack([mono * (1 - 0.3 * c) for c in range(channels)], axis=1).astype(np.float32)


def wav_bytes(audio: np.ndarray, rate: int, fmt: str = "WAV") -> bytes:
    buf = io.BytesIO()
    sf.write(buf, audio, rate, format=fmt, subtype="PCM_16")
    return buf.getvalue()


def data_url(data: bytes, mime: str = "audio/wav") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


# -- the speaker model equals the official SpeakerEmbedder -------------------------------------------------------

# Float32 forward passes that differ only in summation order agree to about sqrt(K)·eps on an L2-normalised
# output, K the longest reduction (the 2,048 pooled statistics into the first top layer); 8x that for the
# longer chains before it (WavLM's convolutions, attention and the resampler).
EMBEDDING_TOLERANCE = 8 * math.sqrt(2048) * float(np.finfo(np.float32).eps)


def test_speaker_model_equals_the_official_speaker_embedder(make_ckpt, kani_reference_python, tmp_path):  # noqa: F811
    model_dir = make_ckpt("v2") / SPEAKER_MODEL_SUBDIR
    clips = [  # (ours: [T] or [T, channels], rate)
        (tone(2.0, SAMPLE_RATE), SAMPLE_RATE),
        (tone(3.0, 44100, f0=120, channels=2, seed=1), 44100),  # resampled and mixed down on both sides
        (tone(1.5, 22050, f0=240, seed=2), 22050),
        ((0.1 * np.random.default_rng(3).standard_normal(2 * SAMPLE_RATE)).astype(np.float32), SAMPLE_RATE),
    ]
    jobs = []
    for i, (audio, rate) in enumerate(clips):
        np.save(tmp_path / f"{i}.npy", audio.T)  # the official embedder takes [channels, T]
        jobs.append({"audio": str(tmp_path / f"{i}.npy"), "sample_rate": rate})
    (tmp_path / "jobs.json").write_text(json.dumps(jobs))
    _run_reference(kani_reference_python, "embed", model_dir, tmp_path / "jobs.json", tmp_path / "out.json")
    official = np.array(json.loads((tmp_path / "out.json").read_text()), dtype=np.float32)

    embedder = SpeakerEmbedder.from_dir(model_dir)
    ours = np.stack([embedder.embed(prepare_reference(audio, rate)).numpy() for audio, rate in clips])
    assert ours.shape == (len(clips), 128)
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-6)
    np.testing.assert_allclose(ours, official, rtol=0, atol=EMBEDDING_TOLERANCE)
    # Clips of different voices get different embeddings, so agreement is not a constant output agreeing.
    cosines = ours @ ours.T
    assert cosines[np.triu_indices(len(clips), 1)].max() < 0.9


def test_reference_audio_is_checked_then_mixed_down_and_resampled():
    assert prepare_reference(tone(2.0, SAMPLE_RATE), SAMPLE_RATE).shape == (2 * SAMPLE_RATE,)
    assert prepare_reference(tone(2.0, 48000), 48000).shape == (2 * SAMPLE_RATE,)
    stereo = tone(1.5, SAMPLE_RATE, channels=2)
    np.testing.assert_allclose(prepare_reference(stereo, SAMPLE_RATE).numpy(), stereo.mean(axis=1), atol=1e-7)
    bad = [
        (tone(0.5, SAMPLE_RATE), SAMPLE_RATE, f"0.50 s long; it must be {MIN_SECONDS:g} to {MAX_SECONDS:g} s"),
        (tone(31.0, 8000), 8000, "31.00 s long; it must be 1 to 30 s"),
        (tone(2.0, 4000), 4000, "4000 Hz is too low: at least 8000 Hz"),
        (np.zeros(2 * SAMPLE_RATE, np.float32), SAMPLE_RATE, "silent"),
        (np.full(2 * SAMPLE_RATE, np.nan, np.float32), SAMPLE_RATE, "NaN"),
        (np.zeros((2, 2, SAMPLE_RATE), np.float32), SAMPLE_RATE, "mono or [samples, channels]"),
    ]
    for audio, rate, message in bad:
        with pytest.raises(ReferenceAudioError, match=re.escape(message)):
            prepare_reference(audio, rate)


# -- uploads and inline clips in vLLM-Omni's speech server --------------------------------------------------------


def speech_server(ckpt: Path, voices: Path, monkeypatch, additional_config: dict | None = None):
    """vLLM-Omni's speech server object with the Kani adapter, as `vllm serve` builds it, minus the engine."""
    from vllm_omni.entrypoints.openai.serving_speech import OmniOpenAIServingSpeech
    from vllm_omni.entrypoints.openai.tts_adapters.base import SpeechServingContext

    from vllm_omni_kani.entrypoints.openai.tts_adapters.kani_tts import KaniTTSAdapter

    monkeypatch.setenv("SPEAKER_SAMPLES_DIR", str(voices))
    server = object.__new__(OmniOpenAIServingSpeech)
    server._init_speaker_storage()
    server._tts_model_type = "kani_tts"
    stage_args = types.SimpleNamespace(model=str(ckpt), max_model_len=2048, additional_config=additional_config or {})
    server._tts_stage = types.SimpleNamespace(engine_args=stage_args)
    server.engine_client = types.SimpleNamespace(
        model_config=types.SimpleNamespace(model=str(ckpt), hf_config=AutoConfig.from_pretrained(ckpt))
    )
    server.model_config = types.SimpleNamespace(allowed_local_media_path="", allowed_media_domains=None)
    server.supported_languages = frozenset()
    adapter = KaniTTSAdapter(SpeechServingContext(server=server, engine_client=server.engine_client))
    return server, adapter


def upload_file(data: bytes, filename: str = "clip.wav", mime: str = "audio/wav"):
    from fastapi import UploadFile
    from starlette.datastructures import Headers

    return UploadFile(file=io.BytesIO(data), filename=filename, headers=Headers({"content-type": mime}))


def request(**fields):
    from vllm_omni.entrypoints.openai.protocol.audio import OpenAICreateSpeechRequest

    return OpenAICreateSpeechRequest(input=TEXT, max_new_tokens=8, **fields)


async def build(adapter, req):
    from vllm import SamplingParams

    error = adapter.validate(req)
    assert error is None, error
    return await adapter.build(req, [SamplingParams()], False)


def test_an_uploaded_and_an_inline_clip_give_the_same_prompt(make_ckpt, tmp_path, monkeypatch):
    ckpt = make_ckpt("v2")
    server, adapter = speech_server(ckpt, tmp_path / "voices", monkeypatch)
    clip = wav_bytes(tone(2.0, 24000, channels=2), 24000)
    other = wav_bytes(tone(2.5, 16000, f0=110, seed=5), 16000)
    expected = SpeakerEmbedder.from_dir(ckpt / SPEAKER_MODEL_SUBDIR).embed(
        prepare_reference(sf.read(io.BytesIO(clip), dtype="float32")[0], 24000)
    )

    async def story():
        uploaded = await server.upload_voice(upload_file(clip), "consent-1", "Alice")
        assert uploaded["name"] == "Alice" and uploaded["embedding_dim"] == 128
        assert "alice" in server.supported_speakers
        by_name = await build(adapter, request(voice="alice"))  # voice names are case-insensitive
        inline = await build(adapter, request(ref_audio=data_url(clip)))
        again = await build(adapter, request(ref_audio=[data_url(clip)]))  # vLLM-Omni's list form
        different = await build(adapter, request(ref_audio=data_url(other)))
        deleted = await server.delete_voice("ALICE")
        return by_name, inline, again, different, deleted

    by_name, inline, again, different, deleted = asyncio.run(story())
    vectors = [p.prompt["additional_information"][tl.SPEAKER_EMBEDDING_KEY] for p in (by_name, inline, again)]
    for vector in vectors:
        torch.testing.assert_close(vector, expected, rtol=0, atol=0)
    assert by_name.prompt["prompt_token_ids"] == inline.prompt["prompt_token_ids"] == again.prompt["prompt_token_ids"]
    assert by_name.prompt["prompt_token_ids"][1] == tl.SPEAKER_EMBEDDING_SLOT
    other_vector = different.prompt["additional_information"][tl.SPEAKER_EMBEDDING_KEY]
    assert torch.dot(other_vector, expected) < 0.9
    assert deleted and "alice" not in server.uploaded_speakers and not adapter.cloning._voices
    assert "Unknown voice 'alice'" in adapter.validate(request(voice="alice"))


def test_a_precomputed_embedding_uploaded_as_a_voice_is_used_by_name(make_ckpt, tmp_path, monkeypatch):
    server, adapter = speech_server(make_ckpt("v2"), tmp_path / "voices", monkeypatch)
    vector = [0.01 * i for i in range(128)]

    async def story():
        await server.upload_voice_embedding(json.dumps(vector), "consent-2", "bob")
        with pytest.raises(ValueError, match="must have 128 numbers for this model"):
            await server.upload_voice_embedding(json.dumps(vector[:5]), "consent-2", "short")
        return await build(adapter, request(voice="bob"))

    prepared = asyncio.run(story())
    np.testing.assert_allclose(prepared.prompt["additional_information"][tl.SPEAKER_EMBEDDING_KEY].numpy(), vector)


def test_bad_reference_audio_is_refused_and_not_kept(make_ckpt, tmp_path, monkeypatch):
    server, adapter = speech_server(make_ckpt("v2"), tmp_path / "voices", monkeypatch)
    bad = {  # what: (clip, the upload's message, the inline clip's message)
        "not audio": (b"this is not a sound file" * 40, "Could not decode audio file", "Invalid or unsupported audio"),
        "too short": (wav_bytes(tone(0.4, 16000), 16000), "too short (0.4s). At least 1s", None),
        "too long": (wav_bytes(tone(31.0, 8000), 8000), "too long (31.0s). Maximum 30s", None),
        "too coarse": (wav_bytes(tone(2.0, 4000), 4000), "4000 Hz is too low: at least 8000 Hz", None),
        "silent": (wav_bytes(np.zeros(32000, np.float32), 16000), "silent", None),
    }

    async def story():
        for what, (data, upload_message, inline_message) in bad.items():
            with pytest.raises(ValueError, match=re.escape(upload_message)):
                await server.upload_voice(upload_file(data), "consent-3", what.replace(" ", "_"))
            with pytest.raises(ValueError, match=re.escape(inline_message or upload_message)):
                await build(adapter, request(ref_audio=data_url(data)))
        with pytest.raises(ValueError, match="'ref_text' is not used by Kani-TTS-2"):
            await server.upload_voice(upload_file(wav_bytes(tone(2, 16000), 16000)), "c", "x", ref_text="hi")

    asyncio.run(story())
    assert server.uploaded_speakers == {} and not list((tmp_path / "voices").iterdir())
    asyncio.run(server.upload_voice_embedding(json.dumps([0.1] * 128), "consent-3", "gina"))
    messages = {
        "'ref_audio' must be one clip": request(ref_audio="clip.wav"),
        "'ref_text' is not supported by Kani TTS: Kani-TTS-2 clones a voice from the audio alone": request(
            ref_audio=data_url(b"x"), ref_text="hello"
        ),
        "Give one voice source ('speaker_embedding', 'ref_audio', an uploaded 'voice'), not 'ref_audio' and an "
        "uploaded 'voice'": request(ref_audio=data_url(b"x"), voice="gina"),
    }
    for expected, req in messages.items():
        assert expected in (adapter.validate(req) or ""), adapter.validate(req)


def test_a_model_without_a_speaker_embedding_refuses_cloning(make_ckpt, tmp_path, monkeypatch):
    server, adapter = speech_server(make_ckpt("parallel"), tmp_path / "voices", monkeypatch)
    clip = wav_bytes(tone(2.0, 16000), 16000)
    why = "this checkpoint has no speaker embedding (voice cloning needs a Kani-TTS-2 checkpoint"
    assert f"'ref_audio' is not supported by Kani TTS: {why}" in adapter.validate(request(ref_audio=data_url(clip)))
    assert f"'speaker_embedding' is not supported by Kani TTS: {why}" in adapter.validate(
        request(speaker_embedding=[0.0] * 128)
    )

    async def story():
        with pytest.raises(ValueError, match=r"Cannot upload voice 'carol': this checkpoint has no speaker embedding"):
            await server.upload_voice(upload_file(clip), "consent-4", "carol")
        with pytest.raises(ValueError, match=r"Cannot upload voice 'dave': this checkpoint has no speaker embedding"):
            await server.upload_voice_embedding(json.dumps([0.0] * 128), "consent-4", "dave")

    asyncio.run(story())
    assert server.uploaded_speakers == {}
    # A clip uploaded while another model was served (the store is a shared folder) is named as such.
    shared = speech_server(make_ckpt("v2"), tmp_path / "shared", monkeypatch)[0]
    asyncio.run(shared.upload_voice(upload_file(clip), "consent-4", "erin"))
    _, adapter = speech_server(make_ckpt("parallel"), tmp_path / "shared", monkeypatch)
    assert "Voice 'erin' is an uploaded reference clip, but this checkpoint has no speaker embedding" in (
        adapter.validate(request(voice="erin"))
    )
    assert adapter.validate(request(voice="katie")) is None  # built-in speakers are unaffected


def test_the_speaker_model_comes_from_the_checkpoint_or_the_deploy_yaml(make_ckpt, tmp_path, monkeypatch):
    from vllm_omni_kani.entrypoints.openai.voice_clone import SPEAKER_MODEL_KEY, VoiceCloningConfigError

    bare = tmp_path / "bare-v2"
    shutil.copytree(make_ckpt("v2"), bare, ignore=shutil.ignore_patterns(SPEAKER_MODEL_SUBDIR))
    elsewhere = shutil.copytree(make_ckpt("v2") / SPEAKER_MODEL_SUBDIR, tmp_path / "speaker-model")
    clip = data_url(wav_bytes(tone(2.0, 16000), 16000))

    server, adapter = speech_server(bare, tmp_path / "voices", monkeypatch)
    assert "no speaker model: put one in the checkpoint's speaker_model/ folder" in adapter.validate(
        request(ref_audio=clip)
    )
    with pytest.raises(ValueError, match="Cannot upload voice 'f': no speaker model"):
        asyncio.run(server.upload_voice(upload_file(wav_bytes(tone(2.0, 16000), 16000)), "c", "f"))
    assert adapter.validate(request(speaker_embedding=[0.0] * 128)) is None  # precomputed still works

    _, adapter = speech_server(bare, tmp_path / "voices", monkeypatch, {SPEAKER_MODEL_KEY: str(elsewhere)})
    prepared = asyncio.run(build(adapter, request(ref_audio=clip)))
    assert prepared.prompt["additional_information"][tl.SPEAKER_EMBEDDING_KEY].shape == (128,)

    with pytest.raises(VoiceCloningConfigError, match="is not a speaker model"):
        speech_server(bare, tmp_path / "voices", monkeypatch, {SPEAKER_MODEL_KEY: str(tmp_path / "nowhere")})
    config = json.loads((elsewhere / "config.json").read_text())
    (elsewhere / "config.json").write_text(json.dumps({**config, "embd_size": 64}))
    with pytest.raises(VoiceCloningConfigError, match="gives 64 floats, but the checkpoint's speaker_emb_dim is 128"):
        speech_server(bare, tmp_path / "voices", monkeypatch, {SPEAKER_MODEL_KEY: str(elsewhere)})
