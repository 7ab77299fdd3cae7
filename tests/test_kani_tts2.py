"""Kani-TTS-2 under vLLM agrees with the official model code.

The official ``kani-tts-2`` 0.0.5 package runs in an environment of its own (transformers 4.56; made by
``scripts/kani_reference_env.sh`` on first use, skipped with the reason when it cannot be made). Its class
writes a random-weight Kani-TTS-2 checkpoint (learnable RoPE with a random α per attention layer, half a
position per audio frame); vLLM-Omni's engine serves that checkpoint as it is, and greedy tokens equal the
official model's, with the Kani grammar enforced the same way on both sides (``speech_mask.py``), without
and with a speaker embedding, in one batch. Served, the factory's checkpoint speaks with its language tags and
in a voice cloned from reference audio, uploaded or inline (``test_voice_clone.py`` covers the rest of cloning).
"""

from __future__ import annotations

import base64
import io
import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoConfig, AutoTokenizer

from tests.conftest import REPO_ROOT
from vllm_omni_kani.model_executor.models.kani_tts import token_layout as tl
from vllm_omni_kani.model_executor.models.kani_tts.configuration import FrameLevelSettings, KaniTTSSettings
from vllm_omni_kani.model_executor.models.kani_tts.kani_tts2_lm import SPEAKER_EMBEDDING_KEY
from vllm_omni_kani.tools.make_checkpoint import PRESETS, V2_LANGUAGES
from vllm_omni_kani.tools.tokenizer_factory import write_tokenizer

LM_ONLY_YAML = REPO_ROOT / "stage_configs" / "kani_tts_lm_cpu.yaml"
REFERENCE = REPO_ROOT / "scripts" / "kani_reference.py"
STEPS = 48  # tokens: 12 frames after START_OF_AI, START_OF_SPEECH
V2 = FrameLevelSettings(audio_step=0.5, use_learnable_rope=True, alpha_min=0.1, alpha_max=2.0, speaker_emb_dim=128)

pytestmark = pytest.mark.engine


def _run_reference(python: str, *args: object, timeout: float = 600) -> None:
    run = subprocess.run(
        [python, str(REFERENCE), *map(str, args)], capture_output=True, text=True, timeout=timeout, cwd=REPO_ROOT
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]


@pytest.fixture(scope="session")
def kani_reference_python() -> str:
    """The official packages' environment (created on first use, ~1 minute from uv's cache)."""
    try:
        run = subprocess.run(
            ["bash", str(REPO_ROOT / "scripts" / "kani_reference_env.sh")],
            capture_output=True,
            text=True,
            timeout=1800,
            cwd=REPO_ROOT,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"the official Kani-TTS environment could not be made: {exc}")
    if run.returncode != 0:
        pytest.skip(f"the official Kani-TTS environment could not be made: {run.stderr.strip()[-600:]}")
    return run.stdout.strip().splitlines()[-1]


def _tiny_spec(seed: int) -> dict:
    """The factory's tiny LFM2 shape as transformers 4.56 spells it, plus the Kani-TTS-2 fields."""
    preset = PRESETS["tiny"]
    return {
        "vocab_size": tl.FLATTENED_VOCAB_SIZE,
        "hidden_size": preset.hidden_size,
        "intermediate_size": preset.intermediate_size,
        "num_hidden_layers": preset.num_hidden_layers,
        "num_attention_heads": preset.num_attention_heads,
        "num_key_value_heads": preset.num_key_value_heads,
        "layer_types": [
            "full_attention" if i in preset.attention_layers else "conv" for i in range(preset.num_hidden_layers)
        ],
        "full_attn_idxs": list(preset.attention_layers),
        "block_multiple_of": preset.block_multiple_of,
        "block_dim": preset.hidden_size,
        "block_ff_dim": preset.intermediate_size,
        "conv_dim": preset.hidden_size,
        "conv_dim_out": preset.hidden_size,
        "initializer_range": preset.init_std,
        "rope_theta": 1000000.0,
        "max_position_embeddings": 128000,
        "tie_word_embeddings": True,
        "bos_token_id": tl.START_OF_TEXT,
        "eos_token_id": tl.END_OF_SPEECH,
        "pad_token_id": tl.PAD,
        "kani_tts2": {**V2.to_config_fields(), "seed": seed},
    }


@pytest.fixture(scope="module")
def official_ckpt(kani_reference_python, tmp_path_factory) -> Path:
    """A random-weight Kani-TTS-2 checkpoint written by the official class, plus the factory tokenizer."""
    out = tmp_path_factory.mktemp("official-kani-tts2")
    spec = out.parent / f"{out.name}-spec.json"
    spec.write_text(json.dumps(_tiny_spec(seed=3)))
    _run_reference(kani_reference_python, "write", spec, out)
    config = json.loads((out / "config.json").read_text())
    config["language_settings"] = {"status": "available_language_tags", "language_tags_list": list(V2_LANGUAGES)}
    (out / "config.json").write_text(json.dumps(config, indent=2))
    write_tokenizer(out)
    return out


def test_official_checkpoint_reads_as_kani_tts2(official_ckpt):
    config = AutoConfig.from_pretrained(official_ckpt)
    assert config.architectures == ["KaniTTS2ForCausalLM"]
    assert FrameLevelSettings.from_hf_config(config) == V2
    settings = KaniTTSSettings.from_hf_config(config)
    assert settings.variant == "flattened" and settings.tokens_per_frame == 4
    assert settings.languages == V2_LANGUAGES and settings.speakers == ()
    # Stock: no project block; the official sampling defaults.
    assert not hasattr(config, "kani_tts")
    assert (settings.sampling.temperature, settings.sampling.top_p, settings.sampling.repetition_penalty) == (
        1.0,
        0.95,
        1.1,
    )


def _prompt(tokenizer, text: str) -> list[int]:
    """The official prompt: [SOH] text [EOT] [EOH]; the model itself produces START_OF_AI, START_OF_SPEECH."""
    return tl.text_prompt_ids(tokenizer, text, None)[: -len(tl.SPEECH_PREFIX)]


def test_greedy_tokens_equal_the_official_model_with_and_without_a_speaker_embedding(
    official_ckpt, kani_reference_python, tmp_path
):
    tokenizer = AutoTokenizer.from_pretrained(official_ckpt)
    short, long = _prompt(tokenizer, "Hello there."), _prompt(tokenizer, "A longer sentence, spoken by someone else.")
    voice_a = torch.randn(128, generator=torch.Generator().manual_seed(1))
    voice_b = torch.randn(128, generator=torch.Generator().manual_seed(2))
    jobs = [
        {"prompt": short, "speaker": None, "steps": STEPS},
        {"prompt": long, "speaker": voice_a.tolist(), "steps": STEPS},
        {"prompt": short, "speaker": voice_b.tolist(), "steps": STEPS},
    ]
    (tmp_path / "jobs.json").write_text(json.dumps(jobs))
    _run_reference(kani_reference_python, "greedy", official_ckpt, tmp_path / "jobs.json", tmp_path / "ref.json")
    reference = json.loads((tmp_path / "ref.json").read_text())
    # The reference loop (official forward over the whole sequence) is the official generate() where that has
    # no known defect (without a speaker embedding; see kani_tts2_lm.py).
    assert reference[0]["forward"] == reference[0]["generate"]

    import vllm_omni_kani

    vllm_omni_kani.register()
    from vllm import SamplingParams
    from vllm_omni.entrypoints.omni import Omni

    prompts = [
        {"prompt_token_ids": short},
        {"prompt_token_ids": tl.with_speaker_slot(long), "additional_information": {SPEAKER_EMBEDDING_KEY: voice_a}},
        {"prompt_token_ids": tl.with_speaker_slot(short), "additional_information": {SPEAKER_EMBEDDING_KEY: voice_b}},
    ]
    # END_OF_SPEECH is held off for the whole run on both sides (min_tokens here, the reference's grammar there).
    params = SamplingParams(
        temperature=0.0, max_tokens=STEPS, min_tokens=STEPS, detokenize=False, stop_token_ids=[tl.END_OF_SPEECH]
    )
    # Two sequences at a time: the third request starts in a state slot another request has finished with.
    omni = Omni(model=str(official_ckpt), deploy_config=str(LM_ONLY_YAML), dtype="float32", max_num_seqs=2)
    try:
        outputs = omni.generate(prompts, [params])
    finally:
        omni.close()
    outputs = sorted(outputs, key=lambda o: int(str(o.request_id).split("_")[0]))
    got = [list(o.request_output.outputs[0].token_ids) for o in outputs]
    for job, ref, tokens in zip(jobs, reference, got, strict=True):
        speaker = "with" if job["speaker"] is not None else "without"
        assert tokens == ref["forward"], f"{speaker} a speaker embedding: differs from token {_first_diff(tokens, ref)}"
    frames = [tl.frames_from_flat_tokens(tokens) for tokens in got]
    assert all(f.frames.shape == ((STEPS - 2) // 4, 4) and f.invalid == 0 for f in frames)
    assert len(np.unique(frames[0].frames)) > 12  # really varied codes, not one repeated frame
    assert not np.array_equal(frames[0].frames, frames[2].frames)  # the speaker embedding changes the speech


def _first_diff(tokens: list[int], ref: dict) -> int:
    return next((i for i, (a, b) in enumerate(zip(tokens, ref["forward"], strict=False)) if a != b), -1)


def test_language_tags_prefix_the_text_as_the_official_package_does(official_ckpt, kani_reference_python, tmp_path):
    jobs = [{"text": "Guten Tag.", "language": "de"}, {"text": "Hello.", "language": None}]
    (tmp_path / "jobs.json").write_text(json.dumps(jobs))
    _run_reference(kani_reference_python, "prompt", "v2", official_ckpt, tmp_path / "jobs.json", tmp_path / "out.json")
    official = json.loads((tmp_path / "out.json").read_text())
    tokenizer = AutoTokenizer.from_pretrained(official_ckpt)
    ours = [tl.text_prompt_ids(tokenizer, job["text"], None, job["language"]) for job in jobs]
    assert [ids[: -len(tl.SPEECH_PREFIX)] for ids in ours] == official
    assert all(ids[-len(tl.SPEECH_PREFIX) :] == list(tl.SPEECH_PREFIX) for ids in ours)


def _serve_v2(omni_server, make_ckpt, tmp_path_factory):
    """The factory's stock Kani-TTS-2 checkpoint through `vllm serve --omni` (both stages, as the README serves it),
    one server for this module's tests, uploaded voices kept in a folder of the session."""
    voices = tmp_path_factory.getbasetemp() / "kani-tts2-uploaded-voices"
    voices.mkdir(exist_ok=True)
    return omni_server(make_ckpt("v2"), "kani_tts_cpu.yaml", env={"SPEAKER_SAMPLES_DIR": str(voices)})


@pytest.mark.server
def test_served_kani_tts2_checkpoint_speaks_with_its_language_tags(omni_server, make_ckpt, tmp_path_factory):
    import httpx

    server = _serve_v2(omni_server, make_ckpt, tmp_path_factory)
    # Listed in the checkpoint's spelling, next to the voices.
    assert httpx.get(f"{server.base_url}/v1/audio/voices", timeout=60).json()["languages"] == list(V2_LANGUAGES)
    body = {"input": "Hallo zusammen.", "max_new_tokens": 24, "temperature": 0.0}
    body |= {"response_format": "pcm", "stream_format": "audio"}
    audio = {}
    for language in ("de", "EN", "auto"):
        r = httpx.post(f"{server.base_url}/v1/audio/speech", json={**body, "language": language}, timeout=300)
        assert r.status_code == 200, r.text
        audio[language] = np.frombuffer(r.content, dtype=np.int16)
        # Whole frames (random weights may end speech early, never mid-frame in the audio).
        assert len(audio[language]) % 1764 == 0 and len(audio[language]) <= 6 * 1764
    r = httpx.post(f"{server.base_url}/v1/audio/speech", json={**body, "language": "xx"}, timeout=60)
    assert r.status_code == 400
    assert "Unknown language 'xx'. Available: en, de, es" in r.json()["error"]["message"]
    # A precomputed speaker embedding rides along with the request into the prompt's slot row.
    voice = torch.randn(128, generator=torch.Generator().manual_seed(5)).tolist()
    r = httpx.post(f"{server.base_url}/v1/audio/speech", json={**body, "speaker_embedding": voice}, timeout=300)
    assert r.status_code == 200, r.text
    assert len(r.content) % (2 * 1764) == 0
    r = httpx.post(f"{server.base_url}/v1/audio/speech", json={**body, "speaker_embedding": voice[:7]}, timeout=60)
    assert r.status_code == 400 and "128 finite numbers" in r.json()["error"]["message"]


def _clip(seconds: float, rate: int, f0: float = 150.0) -> bytes:
    """A 16-bit WAV of a vibrato tone: something voice-like for the speaker model."""
    import soundfile as sf

    t = np.arange(int(seconds * rate)) / rate
    buf = io.BytesIO()
    sf.write(buf, 0.3 * np.sin(2 * np.pi * f0 * t + 3 * np.sin(2 * np.pi * 3 * t)), rate, format="WAV")
    return buf.getvalue()


@pytest.mark.server
def test_served_voice_cloned_from_an_uploaded_or_an_inline_clip(omni_server, make_ckpt, tmp_path_factory):
    """Upload a reference clip once and speak with it by name, or send it with the request: the same audio."""
    import httpx

    base = _serve_v2(omni_server, make_ckpt, tmp_path_factory).base_url
    clip = _clip(2.0, 24000)
    inline = "data:audio/wav;base64," + base64.b64encode(clip).decode()
    body = {"input": "Hello in my own voice.", "max_new_tokens": 24, "temperature": 0.0, "seed": 7}
    body |= {"response_format": "pcm", "stream_format": "audio"}

    def speak(**fields) -> httpx.Response:
        return httpx.post(f"{base}/v1/audio/speech", json={**body, **fields}, timeout=300)

    def upload(name: str, data: bytes) -> httpx.Response:
        files = {"audio_sample": ("clip.wav", data, "audio/wav")}
        return httpx.post(f"{base}/v1/audio/voices", files=files, data={"consent": "ok", "name": name}, timeout=120)

    r = upload("Clone", clip)
    assert r.status_code == 200, r.text
    assert r.json()["voice"]["embedding_dim"] == 128
    listed = httpx.get(f"{base}/v1/audio/voices", timeout=30).json()
    assert "clone" in listed["voices"] and [v["name"] for v in listed["uploaded_voices"]] == ["Clone"]

    audio = {}
    for name, fields in {"by name": {"voice": "clone"}, "inline": {"ref_audio": inline}, "plain": {}}.items():
        r = speak(**fields)
        assert r.status_code == 200, r.text
        audio[name] = np.frombuffer(r.content, dtype=np.int16)
    assert len(audio["by name"]) and len(audio["by name"]) % 1764 == 0
    np.testing.assert_array_equal(audio["by name"], audio["inline"])
    assert not np.array_equal(audio["by name"], audio["plain"])  # the cloned voice reaches the model

    # Bad clips are 400s that say why, uploaded or inline, and the server keeps serving.
    bad = [
        (upload("junk", b"not a sound file" * 64), "Could not decode audio file"),
        (upload("short", _clip(0.5, 16000)), "too short (0.5s). At least 1s"),
        (upload("long", _clip(31.0, 8000)), "too long (31.0s). Maximum 30s"),
        (speak(ref_audio="data:audio/wav;base64," + base64.b64encode(b"nope" * 64).decode()), "Invalid or unsupported"),
        (speak(ref_audio="data:audio/wav;base64," + base64.b64encode(_clip(0.5, 16000)).decode()), "too short"),
    ]
    for response, message in bad:
        assert response.status_code == 400 and message in response.json()["error"]["message"], response.text
    again = speak(voice="Clone")
    assert again.status_code == 200
    np.testing.assert_array_equal(np.frombuffer(again.content, dtype=np.int16), audio["by name"])

    assert httpx.delete(f"{base}/v1/audio/voices/Clone", timeout=30).status_code == 200
    r = speak(voice="clone")
    assert r.status_code == 400 and "Unknown voice 'clone'" in r.json()["error"]["message"]
