"""Stock Kani-TTS checkpoints are served as published: speakers from ``speaker_settings``, language tags from
``language_settings``, sampling defaults from ``generation_config.json`` (else the official packages' values),
and no block of this project's in ``config.json``.

A stock v1 checkpoint here is the factory's flattened one with its ``kani_tts`` block replaced by the
official ``speaker_settings``; its prompts are compared with the official ``kani-tts`` 1.0.1 prompt builder.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import types
from pathlib import Path

import httpx
import numpy as np
import pytest
from transformers import AutoConfig, AutoTokenizer

from tests.test_kani_tts2 import _run_reference, kani_reference_python  # noqa: F401 (a fixture)
from vllm_omni_kani.model_executor.models.kani_tts import token_layout as tl
from vllm_omni_kani.model_executor.models.kani_tts.configuration import (
    KaniTTSSettings,
    SamplingDefaults,
    read_generation_config,
)
from vllm_omni_kani.tools.make_checkpoint import V2_LANGUAGES

SPEAKERS = ["Emma", "leo_2", "Mika"]
TEXT = "Hello from a stock checkpoint."


@pytest.fixture(scope="session")
def stock_v1(make_ckpt, tmp_path_factory) -> Path:
    """The factory's flattened checkpoint rewritten as the official kani-tts package ships one."""
    out = tmp_path_factory.mktemp("stock-v1") / "ckpt"
    shutil.copytree(make_ckpt("flattened"), out)
    config = json.loads((out / "config.json").read_text())
    del config["kani_tts"]
    config["speaker_settings"] = {"status": "multispeaker", "speaker_list": SPEAKERS}
    (out / "config.json").write_text(json.dumps(config, indent=2))
    generation = {"bos_token_id": tl.START_OF_TEXT, "eos_token_id": tl.END_OF_SPEECH, "top_k": 40}
    (out / "generation_config.json").write_text(json.dumps(generation))
    return out


def test_speakers_and_sampling_come_from_the_official_fields(stock_v1):
    config = AutoConfig.from_pretrained(stock_v1)
    settings = KaniTTSSettings.from_hf_config(config, read_generation_config(stock_v1))
    assert settings.variant == "flattened"
    assert settings.speakers == tuple(SPEAKERS) and settings.default_speaker is None
    # generation_config.json's top_k; the rest are the official packages' values.
    assert settings.sampling == SamplingDefaults(temperature=1.0, top_p=0.95, top_k=40, repetition_penalty=1.1)
    # No generation_config.json: transformers' top_k default, as the official generate() gets it.
    assert KaniTTSSettings.from_hf_config(config).sampling == SamplingDefaults()
    assert SamplingDefaults().top_k == 50
    # The official "single speaker" status lists no speakers, whatever its list says.
    config.speaker_settings = {"status": "singlspeaker", "speaker_list": SPEAKERS}
    assert KaniTTSSettings.from_hf_config(config).speakers == ()


class _FakeServer:
    """What the adapter reads of vLLM-Omni's speech server."""

    def __init__(self, ckpt: Path):
        self._tts_stage = types.SimpleNamespace(engine_args=types.SimpleNamespace(model=str(ckpt), max_model_len=2048))
        self.engine_client = types.SimpleNamespace(
            model_config=types.SimpleNamespace(model=str(ckpt), hf_config=AutoConfig.from_pretrained(ckpt))
        )
        self.supported_speakers: set[str] = set()
        self.supported_languages: frozenset[str] = frozenset()


def _adapter(ckpt: Path):
    from vllm_omni.entrypoints.openai.tts_adapters.base import SpeechServingContext

    from vllm_omni_kani.entrypoints.openai.tts_adapters.kani_tts import KaniTTSAdapter

    server = _FakeServer(ckpt)
    return KaniTTSAdapter(SpeechServingContext(server=server, engine_client=server.engine_client)), server


def _request(**fields):
    from vllm_omni.entrypoints.openai.protocol.audio import OpenAICreateSpeechRequest

    return OpenAICreateSpeechRequest(input=TEXT, **fields)


def _build(adapter, request):
    from vllm import SamplingParams

    assert adapter.validate(request) is None
    return asyncio.run(adapter.build(request, [SamplingParams()], False))


def test_adapter_speaks_a_stock_speaker_with_the_official_prompt(stock_v1, kani_reference_python, tmp_path):  # noqa: F811
    adapter, server = _adapter(stock_v1)
    assert server.supported_speakers == {s.lower() for s in SPEAKERS}
    jobs = [{"text": TEXT, "speaker": "Emma"}, {"text": TEXT, "speaker": None}]
    (tmp_path / "jobs.json").write_text(json.dumps(jobs))
    _run_reference(kani_reference_python, "prompt", "v1", stock_v1, tmp_path / "jobs.json", tmp_path / "out.json")
    official = json.loads((tmp_path / "out.json").read_text())

    emma = _build(adapter, _request(voice="emma"))  # voices match case-insensitively
    openai_voice = _build(adapter, _request(voice="alloy"))  # no default speaker: no prefix
    suffix = list(tl.SPEECH_PREFIX)
    assert emma.prompt["prompt_token_ids"] == official[0] + suffix
    assert openai_voice.prompt["prompt_token_ids"] == official[1] + suffix
    assert "Unknown voice 'nobody'. Available: Emma, Mika, leo_2" in adapter.validate(_request(voice="nobody"))


def test_adapter_sampling_defaults_are_the_checkpoints(stock_v1):
    from vllm import SamplingParams

    adapter, _ = _adapter(stock_v1)
    params = [SamplingParams()]
    asyncio.run(adapter.build(_request(voice="Mika"), params, False))
    assert (params[0].temperature, params[0].top_p, params[0].top_k, params[0].repetition_penalty) == (
        1.0,
        0.95,
        40,
        1.1,
    )


def test_language_tags_are_listed_and_checked(make_ckpt):
    ckpt = make_ckpt("v2")
    adapter, server = _adapter(ckpt)
    assert server.supported_languages == frozenset(V2_LANGUAGES)
    tokenizer = AutoTokenizer.from_pretrained(ckpt)
    german = _build(adapter, _request(language="DE"))
    assert german.prompt["prompt_token_ids"] == tl.text_prompt_ids(tokenizer, TEXT, None, "de")
    auto = _build(adapter, _request(language="auto"))
    assert auto.prompt["prompt_token_ids"] == tl.text_prompt_ids(tokenizer, TEXT, None)
    assert "Unknown language 'xx'. Available: en, de, es" in adapter.validate(_request(language="xx"))
    # A checkpoint without tags keeps refusing the field.
    flat, _ = _adapter(make_ckpt("flattened"))
    assert "'language' is not supported" in flat.validate(_request(language="de"))


# -- served: `vllm serve` lists the stock speakers and speaks with them ------------------------------------------


@pytest.mark.server
@pytest.mark.engine
def test_served_stock_checkpoint_lists_and_uses_its_speakers(omni_server, stock_v1):
    server = omni_server(stock_v1, "kani_tts_cpu.yaml")
    voices = httpx.get(f"{server.base_url}/v1/audio/voices", timeout=60).json()["voices"]
    assert sorted(voices) == sorted(s.lower() for s in SPEAKERS)

    def pcm(voice: str) -> np.ndarray:
        body = {"input": TEXT, "voice": voice, "max_new_tokens": 24, "temperature": 0.0}
        body |= {"response_format": "pcm", "stream_format": "audio"}
        r = httpx.post(f"{server.base_url}/v1/audio/speech", json=body, timeout=300)
        assert r.status_code == 200, r.text
        return np.frombuffer(r.content, dtype=np.int16)

    emma, mika, plain = pcm("Emma"), pcm("mika"), pcm("alloy")
    assert len(emma) == 6 * 1764  # 24 tokens = 6 frames
    np.testing.assert_array_equal(emma, pcm("emma"))
    # Each speaker is its own prompt prefix, so greedy speech differs between speakers and from no speaker.
    assert not np.array_equal(emma, mika) and not np.array_equal(emma, plain)
    r = httpx.post(f"{server.base_url}/v1/audio/speech", json={"input": TEXT, "voice": "nobody"}, timeout=60)
    assert r.status_code == 400 and "Available: Emma, Mika, leo_2" in r.json()["error"]["message"]


def test_speaker_embedding_goes_into_the_prompts_slot_row(make_ckpt):
    """A precomputed Kani-TTS-2 speaker embedding: checked, then carried as the request's additional information
    with the slot row after START_OF_HUMAN; a model without a speaker embedding answers it with a 400."""
    ckpt = make_ckpt("v2")
    adapter, _ = _adapter(ckpt)
    tokenizer = AutoTokenizer.from_pretrained(ckpt)
    vector = [0.01 * i for i in range(128)]
    for form in (vector, [vector]):  # one vector, or vLLM-Omni's list-of-vectors form with one entry
        prepared = _build(adapter, _request(speaker_embedding=form))
        assert prepared.prompt["prompt_token_ids"] == tl.with_speaker_slot(tl.text_prompt_ids(tokenizer, TEXT, None))
        np.testing.assert_allclose(prepared.prompt["additional_information"]["speaker_embedding"].numpy(), vector)
    assert "must be one vector of 128 finite numbers" in adapter.validate(_request(speaker_embedding=[0.5] * 12))
    flat, _ = _adapter(make_ckpt("flattened"))
    assert "'speaker_embedding' is not supported" in flat.validate(_request(speaker_embedding=vector))


def test_the_adapter_loads_its_tokenizer_once_off_the_loop_then_tokenizes_on_it(make_ckpt):
    """A burst of first requests waits for one load in a worker thread; later requests tokenize on the event loop
    (no executor hop: each costs a busy loop two GIL hand-offs), with the same prompt ids."""
    from concurrent.futures import ThreadPoolExecutor

    from vllm import SamplingParams

    ckpt = make_ckpt("flattened")
    adapter, _ = _adapter(ckpt)
    submitted = []

    class CountingPool(ThreadPoolExecutor):
        def submit(self, fn, *args, **kwargs):
            submitted.append(fn)
            return super().submit(fn, *args, **kwargs)

    async def burst(n: int) -> list:
        asyncio.get_running_loop().set_default_executor(CountingPool(4))
        return await asyncio.gather(*(adapter.build(_request(), [SamplingParams()], False) for _ in range(n)))

    first = asyncio.run(burst(8))
    assert adapter.tokenizer.loaded and 1 <= len(submitted) <= 8
    submitted.clear()
    later = asyncio.run(burst(8))
    assert submitted == []
    speaker = adapter.options(_request()).speaker
    expected = tl.text_prompt_ids(AutoTokenizer.from_pretrained(ckpt), TEXT.strip(), speaker)
    assert all(p.prompt["prompt_token_ids"] == expected for p in first + later)
