"""A value built on first use, once, however many requests ask for it at the same time.

The API server builds its tokenizer (and the Kani-TTS-2 speaker model) lazily, off the event loop. A plain
``if self._x is None: self._x = load()`` there lets a burst of first requests each start its own load: a fresh
server hit by 256 streams loaded the tokenizer ~256 times in its executor threads, holding the GIL for over a
minute (docs/BENCHMARKS.md, seventh set). Callers here wait for the one load instead.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class LoadOnce(Generic[T]):
    """``get()`` returns ``factory()``, called by the first caller only; a failed load is retried by the next one."""

    def __init__(self, factory: Callable[[], T]) -> None:
        self._factory = factory
        self._lock = threading.Lock()
        self._value: T | None = None
        self._loaded = False

    @property
    def loaded(self) -> bool:
        return self._loaded

    def get(self) -> T:
        """The value; blocks while another thread is loading it (call it from a worker thread, not the loop)."""
        if self._loaded:
            return self._value  # type: ignore[return-value]
        with self._lock:
            if not self._loaded:
                self._value = self._factory()
                self._loaded = True
        return self._value  # type: ignore[return-value]
