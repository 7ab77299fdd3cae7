"""``KANI_JIT_EVENTS``: Triton's compile hooks chained so each compile is logged with its start and duration.

No CPU Triton backend compiles a kernel here, so the hooks are called as ``JITFunction._do_compile`` calls them (the
keyword arguments of Triton 3.6's ``_call_hook``); the served GPU runs record real ones (docs/BENCHMARKS.md).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

import pytest

pytest.importorskip("triton")
from triton import knobs

from vllm_omni_kani import jit_events
from vllm_omni_kani.envs import KANI_JIT_EVENTS


@dataclass
class _Fn:
    name: str


def _hook_kwargs(name: str, key: str) -> dict:
    return {
        "key": f"[('*bf16', 'D'), ('i32', ''), ('constexpr', 4)]{{'num_warps': 4}}{key}",
        "repr": f"{name}[num_warps=4, num_ctas=1, num_stages=3](x: *bf16, n: i32)",
        "fn": _Fn(name),
        "compile": {"key": key},
        "is_manual_warmup": False,
        "already_compiled": False,
    }


@pytest.fixture
def fresh_hooks(monkeypatch):
    monkeypatch.setattr(jit_events, "_installed", False)
    monkeypatch.setattr(knobs.runtime, "jit_cache_hook", None)
    monkeypatch.setattr(knobs.runtime, "jit_post_compile_hook", None)


def test_unset_leaves_tritons_hooks_alone(monkeypatch, fresh_hooks):
    monkeypatch.delenv(KANI_JIT_EVENTS, raising=False)
    assert jit_events.install() is False
    assert knobs.runtime.jit_cache_hook is None and knobs.runtime.jit_post_compile_hook is None


def test_each_compile_is_logged_and_the_earlier_hooks_still_run(monkeypatch, fresh_hooks, caplog):
    monkeypatch.setenv(KANI_JIT_EVENTS, "1")
    seen = []
    # Hooks installed before (vLLM's JIT monitor installs a post-compile one): still called, their answers kept.
    knobs.runtime.jit_cache_hook = lambda **kw: seen.append(("cache", kw["fn"].name)) or kw["key"].endswith("skip")
    knobs.runtime.jit_post_compile_hook = lambda **kw: seen.append(("post", kw["fn"].name))
    assert jit_events.install() is True and jit_events.install() is True  # once
    with caplog.at_level(logging.INFO, logger=jit_events.__name__):
        assert knobs.runtime.jit_cache_hook(**_hook_kwargs("_causal_conv1d_fwd_kernel", "k1")) is False
        knobs.runtime.jit_post_compile_hook(**_hook_kwargs("_causal_conv1d_fwd_kernel", "k1"))
        assert knobs.runtime.jit_cache_hook(**_hook_kwargs("other", "skip")) is True  # the earlier hook skips it
    assert seen == [("cache", "_causal_conv1d_fwd_kernel"), ("post", "_causal_conv1d_fwd_kernel"), ("cache", "other")]
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("[KaniJit]")]
    match = re.fullmatch(r"\[KaniJit\] kernel=(\S+) start=([\d.]+) ms=([\d.]+) warmup=False spec=(.*)", line)
    assert match and match[1] == "_causal_conv1d_fwd_kernel" and float(match[3]) >= 0.0, line
    assert match[4].startswith("[('*bf16', 'D'), ('i32', '')") and match[4].endswith("k1")
