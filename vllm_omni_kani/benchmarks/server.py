"""Start and stop a ``vllm serve CKPT --omni --deploy-config YAML`` process for a benchmark run.

The server gets its own process group, so stopping it reaches the API server, every stage's engine core and
its workers; startup time (command → ``/health`` 200) is recorded because it is part of what a deploy costs.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def vllm_command() -> list[str]:
    """``vllm`` of this interpreter's environment, else ``python -m vllm.entrypoints.cli.main`` (bundled installs)."""
    script = Path(sys.executable).parent / "vllm"
    return [str(script)] if script.exists() else [sys.executable, "-m", "vllm.entrypoints.cli.main"]


def serve_argv(
    vllm: Sequence[str], ckpt: str, deploy_config: str, port: int, timeout_s: float, extra_args: Sequence[str] = ()
) -> list[str]:
    """``vllm serve CKPT --omni --deploy-config YAML`` on 127.0.0.1:PORT (shared with the test suite's server)."""
    return [
        *vllm,
        "serve",
        str(ckpt),
        "--omni",
        "--deploy-config",
        str(deploy_config),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--stage-init-timeout",
        str(int(timeout_s)),
        *extra_args,
    ]


class Server:
    """One serve process; ``url`` once healthy, ``startup_s`` how long that took."""

    def __init__(
        self,
        ckpt: str,
        deploy_config: str,
        log_path: Path,
        extra_args: Sequence[str] = (),
        env: dict[str, str] | None = None,
    ) -> None:
        self.ckpt, self.deploy_config, self.log_path = str(ckpt), str(deploy_config), Path(log_path)
        self.extra_args = list(extra_args)
        self.env = dict(env or {})
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""
        self.startup_s = 0.0

    def start(self, timeout_s: float = 900.0) -> str:
        port = free_port()
        argv = serve_argv(vllm_command(), self.ckpt, self.deploy_config, port, timeout_s, self.extra_args)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
        env.update(self.env)
        started = time.monotonic()
        with self.log_path.open("wb") as log:
            # Own process group (stop() signals it), not own session: with scheduler autogroups a new session is a
            # CPU group of its own, which stalled a 2-vCPU box for seconds under load (docs/RELIABILITY.md).
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, process_group=0)
        self.url = f"http://127.0.0.1:{port}"
        with httpx.Client(timeout=5.0) as client:
            while time.monotonic() < started + timeout_s:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"server exited with {self.proc.returncode}; log: {self.log_path}")
                with contextlib.suppress(httpx.HTTPError):
                    if client.get(self.url + "/health").status_code == 200:
                        self.startup_s = time.monotonic() - started
                        return self.url
                time.sleep(1.0)
        self.stop()
        raise RuntimeError(f"server not healthy after {timeout_s:.0f} s; log: {self.log_path}")

    def stop(self, grace_s: float = 30.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10.0)
        # Stage processes can outlive the API server by a moment; none may keep GPU memory for the next run.
        time.sleep(2.0)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)


@contextlib.contextmanager
def serving(
    ckpt: str,
    deploy_config: str,
    log_path: Path,
    extra_args: Sequence[str] = (),
    env: dict[str, str] | None = None,
) -> Iterator[Server]:
    server = Server(ckpt, deploy_config, log_path, extra_args, env)
    try:
        server.start()
        yield server
    finally:
        server.stop()
