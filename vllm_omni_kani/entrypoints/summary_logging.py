"""vLLM-Omni's per-request summary tables, built and logged on one background thread instead of the event loop.

When a request ends, vLLM-Omni's ``AsyncOmni`` builds its stats tables (prettytable) and logs them inside the
request's generator, on the API server's event loop: about 0.6 ms per request, 11% of that loop's samples at 256
streams (docs/BENCHMARKS.md, eighth set), during which no other stream is admitted or sent a chunk. The same lines
are logged here, in finishing order, a moment later; whatever is queued at exit is still logged.
"""

from __future__ import annotations

import atexit
import logging
import queue
import threading
from collections.abc import Callable

logger = logging.getLogger(__name__)

DRAIN_TIMEOUT_S = 10.0  # at exit: long enough for thousands of queued summaries, short enough not to hang a stop


class SummaryThread:
    """One daemon thread that runs queued summary builds in order; started by the first submission."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[Callable[[], object] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._lock = threading.Lock()

    def submit(self, job: Callable[[], object]) -> None:
        """Run ``job`` on the thread, after every job submitted before it (inline once drained, at exit)."""
        with self._lock:
            if not self._closed:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._run, name="kani-request-summaries", daemon=True)
                    self._thread.start()
                    atexit.register(self.drain)
                self._jobs.put(job)
                return
        self._call(job)

    def drain(self, timeout: float = DRAIN_TIMEOUT_S) -> None:
        """Run everything queued so far and stop the thread; later jobs run inline."""
        with self._lock:
            self._closed = True
            thread = self._thread
            self._jobs.put(None)
        if thread is not None:
            thread.join(timeout)

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            self._call(job)

    @staticmethod
    def _call(job: Callable[[], object]) -> None:
        try:
            job()
        except Exception:  # one bad summary must not stop the others
            logger.exception("request summary failed")


SUMMARIES = SummaryThread()
