"""vLLM-Omni runs on a CPU-only machine through this plugin's platform: unit checks, then one real server."""

from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace

import httpx
import pytest
import torch
from vllm.platforms import current_platform

from tests.server_utils import REPO_ROOT
from vllm_omni_kani.model_executor.models.kani_tts import token_layout as tl
from vllm_omni_kani.platforms import cpu as cpu_plugin

OUR_PLATFORM = cpu_plugin.PLATFORM_QUALNAME
LM_CPU_YAML = REPO_ROOT / "stage_configs" / "kani_tts_lm_cpu.yaml"

on_cpu = pytest.mark.skipif(not current_platform.is_cpu(), reason="vLLM is not on its CPU platform here")


# --- activation ---------------------------------------------------------------------------------------------------


@on_cpu
def test_vllm_omni_resolves_our_platform_on_cpu():
    from vllm_omni.platforms import current_omni_platform, resolve_current_omni_platform_cls_qualname

    assert cpu_plugin.cpu_platform_plugin() == OUR_PLATFORM
    assert resolve_current_omni_platform_cls_qualname() == OUR_PLATFORM
    assert type(current_omni_platform).__name__ == "CPUOmniPlatform"


def test_plugin_steps_aside_when_vllm_is_not_on_cpu(monkeypatch):
    """On a GPU machine vLLM's platform is CUDA: the plugin must say None so vLLM-Omni's CUDA platform wins."""
    import vllm.platforms
    from vllm_omni.platforms import builtin_omni_platform_plugins, resolve_current_omni_platform_cls_qualname

    cuda_like = SimpleNamespace(is_cpu=lambda: False, is_cuda=lambda: True)
    monkeypatch.setattr(vllm.platforms, "current_platform", cuda_like, raising=False)
    assert cpu_plugin.cpu_platform_plugin() is None
    # Whatever the builtin checks find on this machine is what vLLM-Omni picks; ours takes no part.
    builtin = [name for name, check in builtin_omni_platform_plugins.items() if check()]
    resolved = resolve_current_omni_platform_cls_qualname()
    assert resolved != OUR_PLATFORM
    if not builtin:
        assert resolved == "vllm_omni.platforms.interface.UnspecifiedOmniPlatform"


def test_plugin_can_be_switched_off(monkeypatch):
    monkeypatch.setenv(cpu_plugin.DISABLE_ENV, "0")
    assert cpu_plugin.cpu_platform_plugin() is None


def test_plugin_never_raises(monkeypatch):
    """vLLM-Omni swallows plugin exceptions (treating them as 'inactive'); make that explicit."""
    import vllm.platforms

    def boom() -> bool:
        raise RuntimeError("no platform")

    monkeypatch.setattr(vllm.platforms, "current_platform", SimpleNamespace(is_cpu=boom), raising=False)
    assert cpu_plugin.cpu_platform_plugin() is None


def test_platform_module_imports_no_worker():
    """Worker modules import vLLM-Omni's GPU runner, which resolves the platform: importing them from the platform
    module would be circular. Checked in a fresh interpreter."""
    code = (
        "import sys, vllm_omni_kani.platforms.cpu.platform as p; "
        "bad = [m for m in ('vllm_omni_kani.platforms.cpu.worker', 'vllm_omni_kani.platforms.cpu.model_runner', "
        "'vllm_omni.worker.gpu_model_runner') if m in sys.modules]; print('BAD', bad) if bad else print('OK')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=REPO_ROOT)
    assert out.stdout.strip().splitlines()[-1:] == ["OK"], out.stdout + out.stderr


# --- the platform's answers ---------------------------------------------------------------------------------------


@on_cpu
def test_platform_answers_without_cuda(monkeypatch):
    from vllm_omni_kani.platforms.cpu.platform import CPUOmniPlatform

    p = CPUOmniPlatform()
    assert (p.device_type, p.device_name, p.dist_backend) == ("cpu", "cpu", "gloo")
    assert p.is_cpu() and not p.is_cuda() and not p.is_cuda_alike() and p.is_out_of_tree()
    assert p.get_torch_device() == p.get_torch_device(3) == torch.device("cpu")  # never indexed
    assert p.get_device_count() >= 1
    free, total = p.get_device_memory()
    assert 0 < free <= total and p.get_free_memory() > 0
    assert p.get_device_version() is None
    assert p.synchronize() is None and p.empty_cache() is None
    assert p.supports_torch_inductor() is False
    assert p.is_pin_memory_available() is False
    assert p.get_diffusion_attn_backend_cls(None, 64).endswith("SDPABackend")
    assert p.get_default_stage_config_path() == "vllm_omni/deploy"

    monkeypatch.delenv(p.device_control_env_var, raising=False)
    p.set_device_control_env_var(0)
    import os

    assert os.environ[p.device_control_env_var] == "0"
    p.set_device_control_env_var(None)
    assert p.device_control_env_var not in os.environ


# --- workers and runners ------------------------------------------------------------------------------------------


@on_cpu
def test_worker_classes_build_on_vllm_cpu_worker():
    from vllm.utils.import_utils import resolve_obj_by_qualname
    from vllm.v1.worker.cpu_worker import CPUWorker
    from vllm_omni.worker.base import OmniGPUWorkerBase
    from vllm_omni.worker.mixins import OmniWorkerMixin

    from vllm_omni_kani.platforms.cpu.model_runner import CPUARModelRunner, CPUGenerationModelRunner
    from vllm_omni_kani.platforms.cpu.platform import CPUOmniPlatform

    ar = resolve_obj_by_qualname(CPUOmniPlatform.get_omni_ar_worker_cls())
    gen = resolve_obj_by_qualname(CPUOmniPlatform.get_omni_generation_worker_cls())
    for worker, runner in ((ar, CPUARModelRunner), (gen, CPUGenerationModelRunner)):
        assert issubclass(worker, OmniWorkerMixin) and issubclass(worker, CPUWorker)
        assert not issubclass(worker, OmniGPUWorkerBase)  # NVML accounting and the CuMem pool are CUDA-only
        assert worker.runner_cls is runner


@on_cpu
def test_runner_mro_puts_omni_first_and_cpu_below_it():
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner
    from vllm_omni.worker.gpu_ar_model_runner import GPUARModelRunner
    from vllm_omni.worker.gpu_generation_model_runner import GPUGenerationModelRunner
    from vllm_omni.worker.gpu_model_runner import OmniGPUModelRunner

    from vllm_omni_kani.platforms.cpu.model_runner import CPUARModelRunner, CPUGenerationModelRunner

    for runner, omni in ((CPUARModelRunner, GPUARModelRunner), (CPUGenerationModelRunner, GPUGenerationModelRunner)):
        mro = runner.__mro__
        order = [mro.index(c) for c in (omni, OmniGPUModelRunner, CPUModelRunner, GPUModelRunner)]
        assert order == sorted(order), [c.__name__ for c in mro]
        # CPU no-ops and CPU load/warm-up come from vLLM's CPU runner, Omni's step logic from Omni.
        for name in ("_sync_device", "_init_device_properties", "warming_up_model", "_zero_block_ids"):
            assert getattr(runner, name) is getattr(CPUModelRunner, name), name
        assert runner.execute_model is omni.execute_model
        assert runner.capture_model(SimpleNamespace()) == 0
    assert CPUARModelRunner._should_use_async_omni_output(SimpleNamespace()) is False


# --- version workarounds and per-stage environment ------------------------------------------------------------


def test_cudagraph_capture_size_gets_a_number_on_cpu():
    from vllm.config import CompilationConfig

    from vllm_omni_kani import patch

    config = SimpleNamespace(compilation_config=CompilationConfig())
    assert config.compilation_config.max_cudagraph_capture_size is None  # what vLLM-CPU leaves
    assert patch.default_cudagraph_capture_size_on_cpu(config)
    assert max(4, config.compilation_config.max_cudagraph_capture_size) == 4  # the Omni expression that failed
    assert not patch.default_cudagraph_capture_size_on_cpu(config)  # a set value is left alone


def test_omni_request_output_has_ec_transfer_params():
    from vllm_omni.outputs import OmniRequestOutput

    from vllm_omni_kani import patch

    patch.apply_all()
    assert OmniRequestOutput(request_output=None).ec_transfer_params is None
    stage_output = SimpleNamespace(ec_transfer_params={"x": 1})
    assert OmniRequestOutput(request_output=stage_output).ec_transfer_params == {"x": 1}


def test_stage_env_comes_from_additional_config(monkeypatch):
    from vllm_omni_kani.platforms.cpu.executor import STAGE_ENV_KEY, scoped_env, stage_env

    assert stage_env(SimpleNamespace(additional_config={})) == {}
    config = SimpleNamespace(additional_config={STAGE_ENV_KEY: {"VLLM_CPU_OMP_THREADS_BIND": "0", "OMP_X": 2}})
    env = stage_env(config)
    assert env == {"VLLM_CPU_OMP_THREADS_BIND": "0", "OMP_X": "2"}
    with pytest.raises(ValueError, match=STAGE_ENV_KEY):
        stage_env(SimpleNamespace(additional_config={STAGE_ENV_KEY: "0"}))

    import os

    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    monkeypatch.delenv("OMP_X", raising=False)
    with scoped_env(env):
        assert os.environ["VLLM_CPU_OMP_THREADS_BIND"] == "0" and os.environ["OMP_X"] == "2"
    assert os.environ["VLLM_CPU_OMP_THREADS_BIND"] == "nobind" and "OMP_X" not in os.environ


# --- a real server ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def lm_server(omni_server, tiny_flattened):
    """Stage 0 of Kani (LM only) served on CPU; the test suite's global `nobind` is left in place on purpose."""
    if not current_platform.is_cpu():
        pytest.skip("the CPU deploy config is for vLLM's CPU platform")
    return omni_server(tiny_flattened, LM_CPU_YAML, env={"VLLM_CPU_OMP_THREADS_BIND": "nobind"})


PROMPT = tl.build_prompt([1, 300, 400, 500], prefill_speech_start=False)
MAX_TOKENS = 24


def _completion_body(server, **extra) -> dict:
    return {
        "model": server.model,
        "prompt": PROMPT,
        "max_tokens": MAX_TOKENS,
        "temperature": 0.0,
        "return_token_ids": True,
        **extra,
    }


def _assert_tokens(tokens: list[int]) -> None:
    assert 1 <= len(tokens) <= MAX_TOKENS
    assert all(isinstance(t, int) and 0 <= t < tl.FLATTENED_VOCAB_SIZE for t in tokens), tokens


@pytest.mark.server
def test_server_is_healthy_on_cpu(lm_server):
    assert httpx.get(lm_server.base_url + "/health", timeout=30).status_code == 200
    models = httpx.get(lm_server.base_url + "/v1/models", timeout=30).json()
    assert lm_server.model in [m["id"] for m in models["data"]]
    print(f"server healthy {lm_server.startup_s:.0f} s after start")


@pytest.mark.server
def test_completion_returns_tokens(lm_server):
    """Prompt token ids in, sampled token ids out, from the stage worker on the CPU platform."""
    r = httpx.post(lm_server.base_url + "/v1/completions", json=_completion_body(lm_server), timeout=300)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["prompt_token_ids"] == PROMPT
    _assert_tokens(choice["token_ids"])


@pytest.mark.server
def test_streamed_completion_matches(lm_server):
    """Streaming goes through Omni's per-step output path; greedy decoding must give the same tokens."""
    body = _completion_body(lm_server, stream=True)
    tokens: list[int] = []
    with httpx.stream("POST", lm_server.base_url + "/v1/completions", json=body, timeout=300) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                tokens += json.loads(line[6:])["choices"][0]["token_ids"] or []
    _assert_tokens(tokens)
    again = httpx.post(lm_server.base_url + "/v1/completions", json=_completion_body(lm_server), timeout=300)
    assert again.json()["choices"][0]["token_ids"] == tokens


@pytest.mark.server
def test_stage_processes_run_on_the_cpu_platform(lm_server):
    log = lm_server.log_text()
    # Every process (API server, stage engine core, stage worker) resolves the platform on its own.
    assert log.count("OmniPlatform plugin kani_cpu is activated") >= 3
    # The stage's own environment reached its executor, over the global `nobind` the server was started with.
    assert "VLLM_CPU_OMP_THREADS_BIND='auto'" in log
    assert "Traceback" not in log
