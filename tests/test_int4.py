"""INT4 weights (W4A16): ``vllm_omni_kani.tools.quantize_w4a16`` writes compressed-tensors ``pack-quantized``
checkpoints that vLLM 0.26 loads, and they serve speech on the CPU.

The format checks run on every variant of the tiny factory checkpoint: what is quantized (LFM2's attention and MLP
linears), what stays bit for bit (everything else, the code heads included), the other files, and the round trip
(unpacked with compressed-tensors' own helper, every weight within half a quantisation step of its group). The
llm-compressor backend (in the venv of ``scripts/llmcompressor_env.sh``, skipped with the reason when it cannot be
made) writes the same tensors as the tool's own writer.

On CPU vLLM runs the checkpoint through ``CPUWNA16LinearKernel``, which takes bf16/fp16 activations only (float32
fails with ``"cpu_gemm_wna16" not implemented for 'Float'``), so Stage 0 runs in bfloat16 here. The engine checks
serve it with ``vllm serve`` (valid speech of the requested length) and record greedy frames of it and of the dense
checkpoint with ``benchmarks.step_time`` as the GPU run does; tiny random weights make the agreement itself noise, so
only its computation is checked.
"""

from __future__ import annotations

import filecmp
import io
import json
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest
import soundfile as sf
import torch
from safetensors.torch import load_file

from tests.conftest import REPO_ROOT
from tests.server_utils import ServerStartError
from vllm_omni_kani.model_executor.models.kani_tts import token_layout as tl
from vllm_omni_kani.model_executor.models.kani_tts.configuration import SAMPLE_RATE, SAMPLES_PER_FRAME
from vllm_omni_kani.platforms.cpu import kernels
from vllm_omni_kani.tools import quantize_w4a16 as q4

GROUP = 32  # the tiny preset's hidden size is 64 and its MLP width 128: the default 128 does not divide them
FRAMES = 12
INT4_CPU_YAML = REPO_ROOT / "stage_configs" / "kani_tts_cpu_int4.yaml"  # Stage 0 in bfloat16
LM_CPU_YAML = REPO_ROOT / "stage_configs" / "kani_tts_lm_cpu.yaml"


@pytest.fixture(scope="module")
def quantized(make_ckpt, tmp_path_factory):
    """``get(variant) -> (dense checkpoint, its W4A16 copy by the rtn backend)``, made once per variant."""
    made: dict[str, tuple[Path, Path]] = {}

    def get(variant: str) -> tuple[Path, Path]:
        if variant not in made:
            src = make_ckpt(variant)
            out = q4.quantize_checkpoint(src, tmp_path_factory.mktemp(f"int4-{variant}"), GROUP, backend="rtn")
            made[variant] = (src, out)
        return made[variant]

    return get


def _expected_modules(config: dict) -> set[str]:
    modules = set()
    for i, kind in enumerate(config["layer_types"]):
        modules |= {f"model.layers.{i}.feed_forward.w{k}" for k in (1, 2, 3)}
        if kind == "full_attention":
            modules |= {f"model.layers.{i}.self_attn.{p}_proj" for p in ("q", "k", "v", "out")}
    return modules


@pytest.mark.parametrize("variant", ["parallel", "flattened", "v2"])
def test_only_attention_and_mlp_linears_are_quantized_and_everything_else_is_copied(quantized, variant):
    src, out = quantized(variant)
    dense, written = load_file(src / "model.safetensors"), load_file(out / "model.safetensors")
    src_config = json.loads((src / "config.json").read_text())
    modules = _expected_modules(src_config)
    assert q4.quantized_modules(dense) == modules
    for module in modules:
        rows, cols = dense[f"{module}.weight"].shape
        assert f"{module}.weight" not in written
        assert written[f"{module}.weight_packed"].dtype == torch.int32
        assert tuple(written[f"{module}.weight_packed"].shape) == (rows, cols // 8)
        assert written[f"{module}.weight_scale"].dtype == dense[f"{module}.weight"].dtype
        assert tuple(written[f"{module}.weight_scale"].shape) == (rows, cols // GROUP)
        assert written[f"{module}.weight_shape"].tolist() == [rows, cols]
    kept = {name for name in dense if name.removesuffix(".weight") not in modules}
    assert kept | {f"{m}.{s}" for m in modules for s in q4.QUANT_SUFFIXES} == set(written)
    for name in kept:  # embeddings, norms, short-conv blocks, code heads, Kani-TTS-2's speaker projection
        assert written[name].dtype == dense[name].dtype and torch.equal(written[name], dense[name]), name
    if variant == "parallel":
        assert {"cb2_head.weight", "cb3_head.weight", "cb4_head.weight"} <= kept

    config = json.loads((out / "config.json").read_text())
    block = config.pop("quantization_config")
    assert config == src_config  # architectures, kani_tts block, frame-level fields: unchanged
    assert block["quant_method"] == "compressed-tensors" and block["format"] == "pack-quantized"
    assert block["ignore"][0] == "lm_head" and not set(block["ignore"]) & modules
    assert all(
        f"model.layers.{i}.conv.in_proj" in block["ignore"] for i, k in enumerate(config["layer_types"]) if k == "conv"
    )

    copied = sorted(
        p.relative_to(src) for p in src.rglob("*") if p.is_file() and p.name not in ("config.json", "model.safetensors")
    )
    assert Path("generation_config.json") in copied and Path("tokenizer.json") in copied
    assert any(p.parts[0] == "codec" for p in copied)
    for rel in copied:
        assert filecmp.cmp(src / rel, out / rel, shallow=False), rel


def test_dequantised_weights_are_within_half_a_step_of_the_originals(quantized):
    from compressed_tensors.compressors.pack_quantized.helpers import unpack_from_int32

    src, out = quantized("parallel")
    dense, written = load_file(src / "model.safetensors"), load_file(out / "model.safetensors")
    seen = set()
    for module in q4.quantized_modules(dense):
        weight = dense[f"{module}.weight"].float()
        packed, scale = written[f"{module}.weight_packed"], written[f"{module}.weight_scale"].float()
        # compressed-tensors' own unpacking (the reader's side), and this module's, agree
        values = unpack_from_int32(packed, 4, torch.Size(weight.shape))
        assert torch.equal(values, q4.unpack_int4(packed, tuple(weight.shape)))
        assert values.min() >= -8 and values.max() <= 7
        seen |= set(values.unique().tolist())
        steps = (weight - q4.dequantize(written, module)).abs().view(weight.shape[0], -1, GROUP) / scale.unsqueeze(-1)
        assert steps.max() <= 0.5 + 1e-4, module
        # and the scale is the group's max |w| / 7.5
        expected = weight.view(weight.shape[0], -1, GROUP).abs().amax(-1) / 7.5
        torch.testing.assert_close(scale, expected)
    assert seen == set(range(-8, 8))  # every 4-bit code is used: the nibbles are not shifted or truncated


def test_pack_round_trips_any_width():
    gen = torch.Generator().manual_seed(0)
    for cols in (8, 13, 64):
        values = torch.randint(-8, 8, (5, cols), generator=gen, dtype=torch.int8)
        packed = q4.pack_int4(values)
        assert packed.dtype == torch.int32 and packed.shape == (5, -(-cols // 8))
        assert torch.equal(q4.unpack_int4(packed, (5, cols)), values)
    # value j of a word in bits 4j..4j+3, stored as q + 8
    assert q4.pack_int4(torch.tensor([[-8, -7, 0, 0, 0, 0, 0, 7]], dtype=torch.int8)).item() == (
        0x0 | 0x1 << 4 | 0x8 << 8 | 0x8 << 12 | 0x8 << 16 | 0x8 << 20 | 0x8 << 24 | 0xF << 28
    ) - (1 << 32)


def test_config_block_is_compressed_tensors_and_vllm_reads_it_as_int4_weight_only(quantized):
    from compressed_tensors.quantization import QuantizationConfig
    from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors import CompressedTensorsConfig
    from vllm.model_executor.layers.quantization.compressed_tensors.schemes import CompressedTensorsWNA16
    from vllm.scalar_type import scalar_types

    _, out = quantized("parallel")
    block = json.loads((out / "config.json").read_text())["quantization_config"]
    parsed = QuantizationConfig.model_validate(block)
    weights = parsed.config_groups["group_0"].weights
    assert (weights.num_bits, weights.type, weights.symmetric, weights.strategy, weights.group_size) == (
        4,
        "int",
        True,
        "group",
        GROUP,
    )
    config = CompressedTensorsConfig.from_config(block)
    scheme_parts = config.target_scheme_map["Linear"]
    scheme = config._get_scheme_from_parts(scheme_parts["weights"], scheme_parts["input_activations"])
    assert isinstance(scheme, CompressedTensorsWNA16)
    assert scheme.quant_type == scalar_types.uint4b8 and scheme.group_size == GROUP


def test_bad_input_is_an_error_without_a_traceback(make_ckpt, quantized, tmp_path, capsys):
    src = make_ckpt("parallel")
    with pytest.raises(q4.QuantizeError, match="does not divide"):
        q4.quantize_checkpoint(src, tmp_path / "a", 128, backend="rtn")  # the tiny hidden size is 64
    _, out = quantized("parallel")
    with pytest.raises(q4.QuantizeError, match="already quantized"):
        q4.quantize_checkpoint(out, tmp_path / "b", GROUP, backend="rtn")
    assert q4.main([str(src), str(tmp_path / "c"), "--group-size", "48", "--backend", "rtn"]) == 2
    assert "does not divide" in capsys.readouterr().err


@pytest.fixture(scope="session")
def llmcompressor_python() -> str:
    """llm-compressor's environment (created on first use, ~1 minute from uv's cache)."""
    try:
        run = subprocess.run(
            ["bash", str(q4.LLMC_ENV_SCRIPT)], capture_output=True, text=True, timeout=1800, cwd=REPO_ROOT
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"the llm-compressor environment could not be made: {exc}")
    if run.returncode != 0:
        pytest.skip(f"the llm-compressor environment could not be made: {run.stderr.strip()[-600:]}")
    return run.stdout.strip().splitlines()[-1]


def test_llmcompressor_writes_the_same_checkpoint(quantized, llmcompressor_python, tmp_path, monkeypatch):
    src, rtn = quantized("parallel")
    monkeypatch.setenv(q4.LLMC_PYTHON_ENV, llmcompressor_python)
    out = q4.quantize_checkpoint(src, tmp_path / "llmc", GROUP, backend="llmcompressor")
    ours, theirs = load_file(rtn / "model.safetensors"), load_file(out / "model.safetensors")
    assert set(ours) == set(theirs)
    for name in ours:  # float32 weights: the same scales and the same codes
        assert ours[name].dtype == theirs[name].dtype and torch.equal(ours[name], theirs[name]), name
    block, ref = (json.loads((d / "config.json").read_text())["quantization_config"] for d in (out, rtn))
    assert block["ignore"] == ref["ignore"]
    assert block["config_groups"]["group_0"]["weights"]["group_size"] == GROUP
    assert (out / "recipe.yaml").exists()


# --- the engine -----------------------------------------------------------------------------------------------


@pytest.mark.server
@pytest.mark.engine
def test_int4_checkpoint_serves_speech_of_the_requested_length(omni_server, quantized):
    """On a CPU whose vLLM build has the INT4 kernel (AVX-512); elsewhere the server refuses the checkpoint at load
    with a message that says why and what to do, not the kernel's missing attribute in the first forward pass."""
    _, out = quantized("parallel")
    if not kernels.has_kernel(kernels.INT4_KERNEL):
        with pytest.raises(ServerStartError) as refused:
            omni_server(out, INT4_CPU_YAML)
        assert f"INT4 ({kernels.PACKED_FORMAT})" in refused.value.log
        assert "Serve the dense checkpoint here" in refused.value.log
        assert "has no attribute" not in refused.value.log
        return
    server = omni_server(out, INT4_CPU_YAML)
    body = {"input": "Hello world, this is Kani speaking.", "voice": "katie", "seed": 1, "max_new_tokens": FRAMES}
    response = httpx.post(f"{server.base_url}/v1/audio/speech", json=body, timeout=300)
    assert response.status_code == 200, response.text
    data, rate = sf.read(io.BytesIO(response.content), dtype="int16")
    # One frame per step and every step a speech frame (the grammar held): FRAMES frames of audio.
    assert rate == SAMPLE_RATE and data.ndim == 1
    assert len(data) == FRAMES * SAMPLES_PER_FRAME
    assert np.abs(data).max() > 0
    assert "Using CPUWNA16LinearKernel for CompressedTensorsWNA16" in server.log_text()


def _step_time(*args: object) -> None:
    argv = [sys.executable, "-m", "vllm_omni_kani.benchmarks.step_time", *map(str, args)]
    run = subprocess.run(argv, capture_output=True, text=True, timeout=900, cwd=REPO_ROOT)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]


@pytest.mark.engine
@pytest.mark.skipif(
    not kernels.has_kernel(kernels.INT4_KERNEL),
    reason=f"this CPU's vLLM build has no {kernels.INT4_KERNEL} (AVX-512 only): INT4 cannot run here",
)
def test_step_time_records_greedy_frames_of_int4_and_dense_and_compares_them(quantized, tmp_path):
    """What the GPU run does (``--codes`` of each, then ``--compare``), with Stage 0 in bfloat16 on the CPU."""
    src, out = quantized("parallel")
    results = tmp_path / "results"
    for ckpt, label in ((src, "dense"), (out, "int4")):
        _step_time(
            ckpt,
            "--engine",
            "omni",
            "--deploy-config",
            LM_CPU_YAML,
            "--dtype",
            "bfloat16",
            "--batches",
            1,
            "--kv-bytes",
            256 << 20,
            "--codes",
            "--out",
            results,
            "--label",
            label,
        )
        result = json.loads((results / f"{label}.json").read_text())
        assert result["step_ms"]["1"] > 0
        assert len(result["codes"]) == 32
        for frames in result["codes"]:
            codes = np.asarray(frames).reshape(-1, tl.NUM_CODEBOOKS)
            assert 1 <= len(codes) <= 64
            assert codes.min() >= 0 and codes.max() < tl.CODEBOOK_SIZE
    _step_time("--compare", results / "dense.json", results / "int4.json", "--out", results, "--label", "agreement")
    row = json.loads((results / "agreement.json").read_text())["rows"][0]
    assert (row["a"], row["b"], row["prompts"]) == ("dense", "int4", 32)
    assert 0.0 <= row["all_code_agreement"] <= 1.0 and 0.0 <= row["first_frame_code_agreement"] <= 1.0
