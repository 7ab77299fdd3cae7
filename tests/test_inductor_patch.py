"""``inductor_patch``: a kernel that holds several launch configs at its first launch runs the pick saved for it.

torch's own autotune cache writes and reads the ``.best_config`` files here, as in an engine. The autotuner is a
stand-in holding those configs, because a real one needs a GPU to build its launchers. The GPU check is
``h200.sh detcompile``'s ``picks-*`` runs: a compile and a load of it run the same picks.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest
from torch._inductor.runtime.autotune_cache import AutotuneCache
from torch._inductor.runtime.triton_heuristics import CachingAutotuner, Config, hash_configs

from vllm_omni_kani import envs, inductor_patch, patch

# A persistent reduction's three configs, as Inductor gave them to the kernel that two engines ran differently.
CONFIGS = [
    Config({"XBLOCK": 1}, num_warps=2, num_stages=1),
    Config({"XBLOCK": 8}, num_warps=4, num_stages=1),
    Config({"XBLOCK": 32}, num_warps=8, num_stages=1),
]


def _kernel_file(tmp_path: Path) -> str:
    """Where Inductor would write the kernel's source: its picks are kept beside it."""
    path = tmp_path / "rz" / "c3a3a8e96c8ccd199bf2e6db33aac129.py"
    path.parent.mkdir(parents=True)
    path.write_text("# kernel source\n")
    return str(path)


def _cache(filename: str, configs: list[Config] = CONFIGS) -> AutotuneCache:
    """The kernel's autotune cache, keyed by the configs it was made with, as ``cached_autotune`` makes it."""
    cache = AutotuneCache.create({}, filename, hash_configs(configs))
    assert cache is not None
    return cache


@dataclass(eq=False)  # hashed by identity, as torch keys its timings by launcher
class Launcher:
    config: Config
    n_regs: int = 12
    n_spills: int = 0
    shared: int = 32
    cache_hash: str = ""


def _autotuner(filename: str, configs: list[Config] = CONFIGS) -> SimpleNamespace:
    """A kernel made with ``CONFIGS``, launching ``configs``; its save hook is its cache's, as in Inductor."""
    return SimpleNamespace(
        launchers=[Launcher(c) for c in configs],
        filename=filename,
        inductor_meta={},
        fn=SimpleNamespace(__name__="triton_per_fused_3"),
        save_cache_hook=_cache(filename).save,
        precompile_time_taken_ns=0,
    )


def _launched(autotuner: SimpleNamespace) -> list[tuple[int, int]]:
    return [(launcher.config.kwargs["XBLOCK"], launcher.config.num_warps) for launcher in autotuner.launchers]


def test_the_saved_pick_is_taken(tmp_path):
    filename = _kernel_file(tmp_path)
    _cache(filename).save(CONFIGS[1], 1_000_000)  # what the compile keeps after timing them
    autotuner = _autotuner(filename)
    assert inductor_patch.take_saved_pick(autotuner)
    assert _launched(autotuner) == [(8, 4)]


def test_the_saved_pick_is_taken_beside_a_config_added_since(tmp_path):
    """A looped reduction can gain a half-block config when it is made ready; the pick saved for the configs it was
    made with still holds."""
    filename = _kernel_file(tmp_path)
    _cache(filename).save(CONFIGS[2], 1_000_000)
    autotuner = _autotuner(filename, [*CONFIGS, Config({"XBLOCK": 16}, num_warps=8, num_stages=1)])
    assert inductor_patch.take_saved_pick(autotuner)
    assert _launched(autotuner) == [(32, 8)]


def test_without_a_saved_pick_nothing_is_taken(tmp_path):
    autotuner = _autotuner(_kernel_file(tmp_path))
    assert not inductor_patch.take_saved_pick(autotuner)
    assert _launched(autotuner) == [(1, 2), (8, 4), (32, 8)]


def test_a_pick_saved_for_other_configs_is_not_taken(tmp_path):
    """A pick kept for another set of configs of the same source (another configs hash) is not this kernel's."""
    filename = _kernel_file(tmp_path)
    _cache(filename, CONFIGS[1:]).save(CONFIGS[2], 1_000_000)
    autotuner = _autotuner(filename)
    assert not inductor_patch.take_saved_pick(autotuner)
    assert len(autotuner.launchers) == 3


def test_a_kernel_without_a_cache_is_not_narrowed(tmp_path):
    autotuner = _autotuner(_kernel_file(tmp_path))
    autotuner.save_cache_hook = None  # Inductor's local autotune cache off
    assert not inductor_patch.take_saved_pick(autotuner)
    assert len(autotuner.launchers) == 3


@pytest.fixture
def patched(monkeypatch):
    """The patch applied as by default (its switch unset), and undone after the test."""
    monkeypatch.delenv(envs.KANI_INDUCTOR_SAVED_PICKS, raising=False)
    monkeypatch.setattr(CachingAutotuner, "autotune_to_one_config", CachingAutotuner.autotune_to_one_config)
    monkeypatch.setattr(patch, "_applied", set())
    assert inductor_patch.apply_all() == ["launch_saved_inductor_picks"]
    assert inductor_patch.apply_all() == ["launch_saved_inductor_picks"]  # idempotent
    return CachingAutotuner.autotune_to_one_config


def test_off_with_its_switch_at_0(monkeypatch):
    monkeypatch.setenv(envs.KANI_INDUCTOR_SAVED_PICKS, "0")
    monkeypatch.setattr(patch, "_applied", set())
    original = CachingAutotuner.autotune_to_one_config
    assert inductor_patch.apply_all() == []
    assert CachingAutotuner.autotune_to_one_config is original


def test_patched_first_launch_runs_the_saved_pick_without_timing(tmp_path, patched):
    filename = _kernel_file(tmp_path)
    _cache(filename).save(CONFIGS[1], 1_000_000)
    autotuner = _autotuner(filename)
    autotuner.benchmark_all_configs = lambda *args, **kwargs: pytest.fail("timed a kernel whose pick was saved")
    patched(autotuner, "arg")
    assert _launched(autotuner) == [(8, 4)]


def test_patched_first_launch_times_as_before_without_a_saved_pick(tmp_path, patched):
    """torch's own timing path runs: the fastest config is launched and kept in the kernel's cache, where a later
    first launch of the same kernel takes it."""
    filename = _kernel_file(tmp_path)
    autotuner = _autotuner(filename)
    times = dict(zip(autotuner.launchers, (0.12, 0.03, 0.02), strict=True))
    autotuner.benchmark_all_configs = lambda *args, **kwargs: times
    patched(autotuner, "arg")
    assert _launched(autotuner) == [(32, 8)]
    again = _autotuner(filename)
    again.benchmark_all_configs = lambda *args, **kwargs: pytest.fail("timed a kernel whose pick was saved")
    patched(again, "arg")
    assert _launched(again) == [(32, 8)]
