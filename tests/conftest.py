"""Shared fixtures: checkpoints made by the factory, once per session."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest
import soundfile as sf

# Engines started from tests run on the CPU; keep their KV reservation and threads small.
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO_ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def one_torch_thread():
    """Codec tests run on one torch thread: small convs gain nothing from a second one, and OpenMP barriers stall
    badly on a busy host."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def make_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """Return a function that writes (or reuses) a factory checkpoint for this test session."""
    from vllm_omni_kani.tools.make_checkpoint import make_checkpoint

    cache: dict[tuple[str, str, int], Path] = {}

    def make(variant: str = "parallel", preset: str = "tiny", seed: int = 0) -> Path:
        key = (variant, preset, seed)
        if key not in cache:
            out = tmp_path_factory.mktemp(f"ckpt-{preset}-{variant}-{seed}")
            cache[key] = make_checkpoint(out, preset=preset, variant=variant, seed=seed, force=True)
        return cache[key]

    return make


@pytest.fixture(scope="session")
def tiny_parallel(make_ckpt) -> Path:
    return make_ckpt("parallel")


@pytest.fixture(scope="session")
def tiny_flattened(make_ckpt) -> Path:
    return make_ckpt("flattened")


# --- `vllm serve --omni` servers (tests/server_utils.py) -------------------------------------------------------


@pytest.fixture(scope="session")
def omni_server(tmp_path_factory: pytest.TempPathFactory):
    """Return ``get(ckpt, deploy_yaml, extra_args=(), env=None) -> ServeProcess``: a started, healthy server.

    One server runs at a time for the whole session: asking again with the same arguments (from any test file)
    reuses it, asking with different ones stops it first. Every server is stopped, process group and all, at the
    end of the session. Use ``server.base_url``, ``server.model``, ``server.log_text()``.
    """
    from tests.server_utils import ServerPool

    pool = ServerPool(tmp_path_factory.mktemp("omni-server-logs"))
    try:
        yield pool.get
    finally:
        pool.close()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """Attach the log tail of any running server to a failing test that uses one."""
    outcome = yield
    report = outcome.get_result()
    if report.failed and "omni_server" in getattr(item, "fixturenames", ()):
        from tests.server_utils import ServeProcess

        for server in ServeProcess.live:
            report.sections.append((f"vllm serve log ({server.base_url})", server.log_tail()))


# Modules that share the one `vllm serve` server run last, grouped by the server they ask for, so the session
# starts each server once: test_scaleout first (its head/headless pair runs alone, then its codec-replica server),
# the Stage-0-only CPU-platform server, then the two-stage parallel-head server (every module below up to
# test_serving uses it), test_serving ends on the flattened server, and test_api_key last starts the parallel-head
# server again with --api-key.
SERVER_MODULE_ORDER = (
    "test_scaleout.py",
    "test_cpu_platform.py",
    "test_bench.py",
    "test_clients.py",
    "test_demo.py",
    "test_reliability.py",
    "test_shm_cleanup.py",
    "test_serving.py",
    "test_api_key.py",
)


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {name: i + 1 for i, name in enumerate(SERVER_MODULE_ORDER)}
    items.sort(key=lambda item: rank.get(item.path.name, 0))  # stable: file order is kept within a rank


def benchmark_script(name: str) -> ModuleType:
    """``benchmarks/NAME.py`` as a module: the benchmark scripts sit beside the package, not in it, and import
    their siblings as they do when run (``benchmarks/`` first on the path)."""
    if str(REPO_ROOT / "benchmarks") not in sys.path:
        sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location(name, REPO_ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_benchmark_script(name: str, *args: object) -> str:
    """``benchmarks/NAME.py ARGS...`` in a fresh interpreter, as a user runs it; it must exit 0. Its stdout."""
    command = [sys.executable, str(REPO_ROOT / "benchmarks" / f"{name}.py"), *map(str, args)]
    return subprocess.run(command, capture_output=True, text=True, check=True).stdout


def run_python(code: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter (the plugin's patches apply per process), which must exit 0; ``env`` is added
    to this process's environment."""
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT, env={**os.environ, **(env or {})}
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out


def speak_offline(
    model: Path,
    deploy_yaml: Path,
    texts: list[str],
    out_dir: Path,
    max_new_tokens: int,
    env: dict[str, str] | None = None,
) -> tuple[str, list]:
    """The offline example, greedy, on ``texts`` in a fresh interpreter (``env`` added to this one's): its log and
    each utterance's int16 samples."""
    args = ["--model", str(model), "--deploy-config", str(deploy_yaml), "--max-new-tokens", str(max_new_tokens)]
    args += ["--temperature", "0", "--out-dir", str(out_dir)]
    for text in texts:
        args += ["--text", text]
    out = subprocess.run(
        [sys.executable, "examples/offline_inference/text_to_speech/kani_tts/end2end.py", *args],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=900,
        env={**os.environ, **(env or {})},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout + out.stderr, [
        sf.read(out_dir / f"utterance_{i}.wav", dtype="int16")[0] for i in range(len(texts))
    ]


def speaks_the_same_with_switch(model: Path, tmp_path: Path, switch: str, said: str) -> None:
    """The offline CPU pipeline, greedy, with the environment switch ``switch`` at 0 and at 1: the same audio (within
    one PCM16 step, more than 8 frames each), and only the run with it on logs ``said`` (it took the switched path)."""
    import re

    import numpy as np

    from vllm_omni_kani.model_executor.models.kani_tts.configuration import SAMPLES_PER_FRAME

    texts = ["Hello there.", "A second one, a little longer."]
    yaml = REPO_ROOT / "stage_configs/kani_tts_cpu.yaml"
    logs, audio = {}, {}
    for value in ("0", "1"):
        logs[value], audio[value] = speak_offline(
            model, yaml, texts, tmp_path / f"{switch}-{value}", max_new_tokens=60, env={switch: value}
        )
    pattern = re.compile(said)
    assert pattern.search(logs["1"]), logs["1"][-3000:]
    assert not pattern.search(logs["0"])
    for off, on in zip(audio["0"], audio["1"], strict=True):
        assert off.shape == on.shape and off.shape[0] > 8 * SAMPLES_PER_FRAME
        assert np.abs(off.astype(np.int32) - on).max() <= 1


def chunk_transfer_manager() -> SimpleNamespace:
    """The attributes of vLLM-Omni's chunk transfer adapter that Stage 0's chunk producer reads (its per-request
    payload dict and its connector's config, stateful codec), for driving the real producer without a connector."""
    return SimpleNamespace(
        request_payload={}, connector=SimpleNamespace(config={"extra": {"codec_stateful_decode": True}})
    )
