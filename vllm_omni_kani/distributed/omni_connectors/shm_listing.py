"""Which shared-memory chunks exist, from one listing of /dev/shm shared by a whole polling pass.

A receiving stage's connector thread (vLLM-Omni's ``OmniTransferAdapterBase.recv_loop``) polls every pending request
for its next chunk by opening the segment ``/dev/shm/<key>`` (``SharedMemoryConnector._get_by_key``); a chunk not
written yet costs a failed ``shm_open`` and a Python exception, ~5 µs. Under load almost every poll misses: at 512
streams on two GPUs a codec engine's receive thread spent 0.59 cores and 28% of its process's GIL there, three
quarters of it on misses (docs/BENCHMARKS.md, thirty-ninth set). One ``os.listdir`` of /dev/shm answers a pass's
misses for the price of a few of them, so a poll asks the listing first and reads only chunks it names
(``patch.poll_shm_chunks_from_one_listing``; only polls take it, since a poll that misses is simply retried).

A listing is reused while it is younger than ``MAX_AGE_S``: a chunk written after it is found by the first poll after
the next listing, so it waits at most that much longer than with a ``shm_open`` per poll.
"""

from __future__ import annotations

import os
import threading
import time

SHM_DIR = "/dev/shm"  # where Linux keeps POSIX shared-memory segments (and the connector its lock files)
MAX_AGE_S = 0.0005  # shorter than the receive loop's 1-ms back-off, so every pass after one lists afresh


class ShmListing:
    """The names in ``directory``, listed at most once per ``max_age_s`` (thread-safe: a listing is replaced whole)."""

    def __init__(self, directory: str = SHM_DIR, max_age_s: float = MAX_AGE_S) -> None:
        self.directory, self.max_age_s = directory, max_age_s
        self._listed_at, self._names = float("-inf"), frozenset[str]()
        self._lock = threading.Lock()
        self.listings = 0

    def names(self) -> frozenset[str]:
        """The directory's names, listed now unless the last listing is younger than ``max_age_s``."""
        if time.monotonic() - self._listed_at >= self.max_age_s:
            with self._lock:
                now = time.monotonic()
                if now - self._listed_at >= self.max_age_s:
                    self._names, self._listed_at = frozenset(os.listdir(self.directory)), now
                    self.listings += 1
        return self._names

    def __contains__(self, name: str) -> bool:
        return name in self.names()
