"""A release workaround for torch 2.11's Inductor, under ``patch.py``'s rules (guarded by the release it targets,
idempotent, a no-op elsewhere); ``vllm_omni_kani.register()`` applies it next to ``patch.apply_all()`` in every
process.

What it is for: on a fresh machine, a server's two Stage-0 engines could generate different codes for one
greedy request (docs/BENCHMARKS.md, forty-seventh set). vLLM compiles through ``standalone_compile``, which times
each Inductor kernel's launch configs while it compiles. The pick goes beside the kernel as a ``.best_config`` file
and into the compiled artifact. The compiling process's own kernels time their configs again at their first launch
(its log shows it; likely they were made before that file existed) and run that second pick. An engine that loads
the artifact runs the first. For a reduction, two launch configs sum a row in different orders, so the two engines
can differ in the last bits. With this patch the compiling process launches the saved pick too. On by default
(``KANI_INDUCTOR_SAVED_PICKS=0`` turns it off): on an H200 a fresh compile and a load of it then gave identical greedy
codes, and a fresh server's compiling engine logged its saved picks (docs/BENCHMARKS.md, forty-eighth set).
"""

from __future__ import annotations

import logging
from typing import Any

from vllm_omni_kani.envs import inductor_saved_picks
from vllm_omni_kani.patch import _patch

logger = logging.getLogger(__name__)


def _torch_2_11_switch_on() -> bool:
    import torch

    return torch.__version__.startswith("2.11.") and inductor_saved_picks()


def take_saved_pick(autotuner: Any) -> bool:
    """Narrow ``autotuner``'s launchers to the config its ``.best_config`` names, where one is saved for the configs it
    was made with (as the compile saved it); returns whether it did. Where none is saved, or it names none of them, the
    caller times them as before."""
    from torch._inductor.runtime.autotune_cache import AutotuneCache
    from torch._inductor.runtime.triton_heuristics import triton_config_to_hashable

    launchers = list(autotuner.launchers)
    # The kernel's own cache, keyed by the configs it was made with (a half-block config added since does not count).
    cache = getattr(autotuner.save_cache_hook, "__self__", None)
    if len(launchers) < 2 or not isinstance(cache, AutotuneCache):
        return False
    best = cache.read_best(autotuner.inductor_meta, [launcher.config for launcher in launchers])
    if best is None:
        return False
    wanted = triton_config_to_hashable(best)
    for launcher in launchers:
        if triton_config_to_hashable(launcher.config) == wanted:
            autotuner.launchers = [launcher]
            logger.info(
                "%s: launches its saved pick %s instead of timing %d configs",
                autotuner.fn.__name__,
                launcher.config,
                len(launchers),
            )
            return True
    return False


@_patch(_torch_2_11_switch_on)
def launch_saved_inductor_picks() -> bool | None:
    """torch 2.11.x, unless ``KANI_INDUCTOR_SAVED_PICKS=0``: an Inductor kernel that still holds several launch configs
    at its first launch runs the pick saved for it, if one is, instead of timing them again (module docstring)."""
    from torch._inductor.runtime.triton_heuristics import CachingAutotuner

    time_them = CachingAutotuner.autotune_to_one_config
    if getattr(time_them, "__kani_original__", None) is not None:
        return None

    def autotune_to_one_config(self: Any, *args: Any, **kwargs: Any) -> Any:
        if take_saved_pick(self):
            return None
        return time_them(self, *args, **kwargs)

    autotune_to_one_config.__kani_original__ = time_them  # type: ignore[attr-defined]
    CachingAutotuner.autotune_to_one_config = autotune_to_one_config
    return None


def apply_all() -> list[str]:
    """Apply every patch here whose guard matches this process; returns the active ones."""
    return [fn.__name__ for fn in (launch_saved_inductor_picks,) if fn()]
