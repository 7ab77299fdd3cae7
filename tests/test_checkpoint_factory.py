"""The checkpoint factory writes directories the real loaders read like trained checkpoints."""

import json
import subprocess
import sys

import pytest
from transformers import AutoConfig, AutoTokenizer

from vllm_omni_kani.model_executor.models.kani_tts import token_layout as tl
from vllm_omni_kani.model_executor.models.kani_tts.configuration import KaniTTSSettings
from vllm_omni_kani.tools.make_checkpoint import PRESETS, lfm2_config

CLI = [sys.executable, "-m", "vllm_omni_kani.cli", "make-checkpoint"]


@pytest.mark.parametrize("variant", ["parallel", "flattened"])
def test_config_and_tokenizer_load_with_transformers(make_ckpt, variant):
    path = make_ckpt(variant)
    cfg = AutoConfig.from_pretrained(path)
    assert cfg.model_type == "lfm2"
    settings = KaniTTSSettings.from_hf_config(cfg)
    assert settings.variant == variant
    assert settings.samples_per_frame == 1764 and settings.sample_rate == 22050
    assert settings.default_speaker in settings.speakers
    assert cfg.vocab_size == (tl.PARALLEL_VOCAB_SIZE if variant == "parallel" else tl.FLATTENED_VOCAB_SIZE)
    for field in (
        "conv_dim",
        "conv_L_cache",
        "block_dim",
        "block_multiple_of",
        "layer_types",
        "rope_parameters",
    ):
        assert getattr(cfg, field) is not None, field
    assert cfg.layer_types.count("full_attention") == 2

    tok = AutoTokenizer.from_pretrained(path)
    text = "andrew: Hello world, this is Kani speaking. Ünïcödé ✓"
    ids = tok(text)["input_ids"]
    assert ids[0] == tl.START_OF_TEXT
    assert tok.decode(ids, skip_special_tokens=True) == text
    assert tok.convert_tokens_to_ids("<|start_of_speech|>") == tl.START_OF_SPEECH
    assert tok.convert_tokens_to_ids("<|end_of_human|>") == tl.END_OF_HUMAN
    assert max(ids) < tl.TOKENISER_LENGTH


def test_350m_preset_is_the_real_lfm2_shape():
    cfg = lfm2_config(PRESETS["350m"], "parallel")
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads) == (
        1024,
        16,
        16,
        8,
    )
    attn = [i for i, t in enumerate(cfg.layer_types) if t == "full_attention"]
    assert attn == [2, 5, 8, 10, 12, 14]
    assert cfg.vocab_size == 68442
    assert lfm2_config(PRESETS["350m"], "flattened").vocab_size == 80539


def test_weights_use_hf_names(make_ckpt):
    from safetensors import safe_open

    with safe_open(make_ckpt("parallel") / "model.safetensors", "pt") as f:
        names = set(f.keys())
        assert f.get_tensor("cb2_head.weight").shape == (tl.CODEBOOK_SIZE, 64)
    assert {"cb3_head.weight", "cb4_head.weight", "model.embed_tokens.weight"} <= names
    assert "model.layers.0.conv.conv.weight" in names
    assert "model.layers.2.self_attn.q_proj.weight" in names


def test_same_seed_same_weights(tmp_path):
    from safetensors.torch import load_file

    for name in ("a", "b"):
        subprocess.run([*CLI, str(tmp_path / name), "--variant", "flattened", "--seed", "3"], check=True)
    a, b = load_file(tmp_path / "a/model.safetensors"), load_file(tmp_path / "b/model.safetensors")
    assert a.keys() == b.keys()
    assert all((a[k] == b[k]).all() for k in a)
    cfg = json.loads((tmp_path / "a/config.json").read_text())
    assert cfg["architectures"] == ["Lfm2ForCausalLM"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--preset", "huge"], "unknown preset 'huge'"),
        (["--variant", "sideways"], "unknown variant 'sideways'"),
    ],
)
def test_bad_input_is_a_clear_error(tmp_path, args, message):
    out = subprocess.run([*CLI, str(tmp_path / "x"), *args], capture_output=True, text=True)
    assert out.returncode != 0
    assert message in out.stderr
    assert "Traceback" not in out.stderr


def test_refuses_non_empty_directory_without_force(tmp_path):
    (tmp_path / "keep.txt").write_text("user data")
    out = subprocess.run([*CLI, str(tmp_path)], capture_output=True, text=True)
    assert out.returncode != 0
    assert "not empty" in out.stderr and "--force" in out.stderr
    assert (tmp_path / "keep.txt").read_text() == "user data"
