"""The experimental Stage-0 sampler patches taken and left in alternating time windows: an A/B inside one engine.

Two engines differ in more than a patch: the host speed of one GPU machine varies by up to ±30% between runs of the
same step (docs/BENCHMARKS.md, "Eleventh set"). With ``KANI_SAMPLER_AB_PERIOD_S`` set, the patched functions take
their own path in even windows of that many seconds and vLLM's in odd ones, and the step meter closes a window at
each boundary and says which path it measured, so one engine compares both under the same load. The windows come
from the host's monotonic clock, which every process of a machine shares. ``KANI_SAMPLER_AB_PATCHES`` names the
patches that alternate (all, unset): the rest stay on, so one patch is measured on top of the others.
"""

from __future__ import annotations

import time

from vllm_omni_kani.envs import sampler_ab_patches, sampler_ab_period_s

_period: float | None = None
_alternating: frozenset[str] | None = None


def period_s() -> float:
    """The window length in seconds (0: no alternation), read once per process."""
    global _period
    if _period is None:
        _period = sampler_ab_period_s()
    return _period


def window(now: float | None = None, period: float | None = None) -> int:
    """The index of the window holding ``now`` (``time.monotonic()`` seconds) for windows of ``period`` seconds (this
    process's, unless given); 0 without alternation."""
    period = period_s() if period is None else period
    if period <= 0:
        return 0
    return int((time.monotonic() if now is None else now) // period)


def patched_in(window_index: int) -> bool:
    """Whether the patches take window ``window_index`` (the even ones)."""
    return window_index % 2 == 0


def alternates(name: str) -> bool:
    """Whether the patch ``name`` alternates (``KANI_SAMPLER_AB_PATCHES``, read once per process)."""
    global _alternating
    if _alternating is None:
        _alternating = sampler_ab_patches()
    return name in _alternating


def patched_now(name: str, now: float | None = None) -> bool:
    """Whether the patch ``name`` takes its own path now: always without alternation or when it does not
    alternate, else in the even windows."""
    return period_s() <= 0 or not alternates(name) or patched_in(window(now))
