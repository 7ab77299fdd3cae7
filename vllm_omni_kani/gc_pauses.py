"""How long the garbage collector stopped this process, per generation, for the meters' windows.

A collection runs on whichever thread happened to allocate and holds the GIL throughout, so it stalls the API
server's event loop or an engine's step wherever it falls: a profile shows the allocation that triggered it, not the
collection. ``gc.callbacks`` times each one; a meter (``loop_lag``, ``step_meter``) takes the window's counts and
logs them beside its own line.
"""

from __future__ import annotations

import contextlib
import gc
import os
import time
import weakref
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from types import AsyncGeneratorType, CoroutineType, GeneratorType
from typing import NamedTuple

GENERATIONS = 3


@dataclass
class GenerationPauses:
    """One generation's collections in a window."""

    count: int = 0
    total_s: float = 0.0
    max_s: float = 0.0

    def add(self, seconds: float) -> None:
        self.count += 1
        self.total_s += seconds
        self.max_s = max(self.max_s, seconds)


class GcPauses:
    """Times every collection of this process once ``install``ed; ``take`` returns the window's and starts anew."""

    def __init__(self) -> None:
        self.window = [GenerationPauses() for _ in range(GENERATIONS)]
        self._started: float | None = None
        self._hook: Callable[[str, dict[str, int]], None] | None = None

    def install(self) -> None:
        """Hook ``gc.callbacks`` (once per instance). The hook holds the meter weakly and unhooks itself once the
        meter is gone, so a meter that is dropped without ``uninstall`` leaves nothing behind."""
        if self._hook is not None:
            return
        ref = weakref.ref(self)

        def hook(phase: str, info: dict[str, int]) -> None:
            pauses = ref()
            if pauses is None:
                with contextlib.suppress(ValueError):
                    gc.callbacks.remove(hook)
            else:
                pauses._callback(phase, info)

        self._hook = hook
        gc.callbacks.append(hook)

    def uninstall(self) -> None:
        if self._hook is not None:
            with contextlib.suppress(ValueError):
                gc.callbacks.remove(self._hook)
            self._hook = None

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        elif self._started is not None:
            generation = min(int(info.get("generation", GENERATIONS - 1)), GENERATIONS - 1)
            self.window[generation].add(time.perf_counter() - self._started)
            self._started = None

    def take(self) -> list[GenerationPauses]:
        """The window's pauses per generation (0, 1, 2); the next window starts empty."""
        window, self.window = self.window, [GenerationPauses() for _ in range(GENERATIONS)]
        return window


def freeze_heap() -> None:
    """Collect once, then move every surviving object to the permanent generation (``gc.freeze``), as vLLM's API
    server and benchmark do after start-up: a later full collection then walks only what was allocated since. A
    process that imported torch holds ~190k tracked objects, and one full collection over them took 110-130 ms on
    this project's CPU machine, stopping whatever ran when it fell (docs/BENCHMARKS.md, forty-third set)."""
    gc.collect()
    gc.freeze()


class Census(NamedTuple):
    """What a collection of one generation would walk: how many objects, the commonest types, and the commonest
    suspended frames among them (coroutines, async generators, generators, by their code), which name the code that
    keeps a request's state alive where the types alone say only "coroutine"."""

    count: int
    commonest: list[tuple[str, int]]
    suspended: list[tuple[str, int]]


def _type_name(t: type) -> str:
    return t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def _frame_name(obj: object) -> str | None:
    """``qualname (file)`` of a coroutine's, async generator's or generator's code; None for anything else (no
    attribute of an arbitrary object is read, not even ``__class__``: a proxy could run anything). These three types
    cannot be subclassed, so the exact type says it."""
    kind = type(obj)
    if kind is CoroutineType:
        code = obj.cr_code
    elif kind is AsyncGeneratorType:
        code = obj.ag_code
    elif kind is GeneratorType:
        code = obj.gi_code
    else:
        return None
    return f"{code.co_qualname} ({os.path.basename(code.co_filename)})"


def census(generation: int = GENERATIONS - 1, top: int = 8) -> Census:
    """The objects a collection of ``generation`` would walk now (a frozen heap is left out), their ``top``
    commonest types and suspended frames: under load, what the load keeps alive, and so what a full collection's
    pause is made of."""
    objects = gc.get_objects(generation)
    types = Counter(map(_type_name, map(type, objects)))
    frames = Counter(name for name in map(_frame_name, objects) if name is not None)
    return Census(len(objects), types.most_common(top), frames.most_common(top))


def as_row(window: list[GenerationPauses]) -> list[dict[str, float]]:
    """A window's pauses per generation as JSON: count, total and longest pause in ms."""
    return [{"count": p.count, "total_ms": 1e3 * p.total_s, "max_ms": 1e3 * p.max_s} for p in window]


def describe(window: list[GenerationPauses], elapsed_s: float) -> str:
    """One log fragment: each generation's collections, their total and longest pause, and the share of the window."""
    parts = [
        f"gen{g} {p.count}x total {1e3 * p.total_s:.1f} ms max {1e3 * p.max_s:.1f} ms" for g, p in enumerate(window)
    ]
    paused = sum(p.total_s for p in window)
    share = 100 * paused / elapsed_s if elapsed_s > 0 else 0.0
    return f"{', '.join(parts)}; paused {share:.1f}% of {elapsed_s:.1f} s"
