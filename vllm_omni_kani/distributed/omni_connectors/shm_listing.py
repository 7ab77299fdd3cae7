"""Which shared-memory chunks exist, from one listing of /dev/shm shared by a whole polling pass.

A receiving stage's connector thread (vLLM-Omni's ``OmniTransferAdapterBase.recv_loop``) polls every pending request
for its next chunk by opening the segment ``/dev/shm/<key>`` (``SharedMemoryConnector._get_by_key``); a chunk not
written yet costs a failed ``shm_open`` and a Python exception, ~5 µs. Under load almost every poll misses: at 512
streams on two GPUs a codec engine's receive thread spent 0.59 cores and 28% of its process's GIL there, three
quarters of it on misses (docs/BENCHMARKS.md, thirty-ninth set). One ``os.listdir`` of /dev/shm answers a pass's
misses for the price of a few of them, so a poll asks the listing first and reads only chunks it names
(``patch.poll_shm_chunks_from_one_listing``; only polls take it, since a poll that misses is simply retried).

A name the listing holds is answered from it (a stale one only costs the read that finds it gone). A name it lacks is
listed again once the listing is older than ``MAX_AGE_S``, or than ``1 / LISTING_TIME_SHARE`` times the last listing's
own duration where /dev/shm is large, so listing takes at most that share of the thread's time; a chunk written
after a listing waits at most that age longer than with a ``shm_open`` per poll.
"""

from __future__ import annotations

import os
import threading
import time

SHM_DIR = "/dev/shm"  # where Linux keeps POSIX shared-memory segments (and the connector its lock files)
MAX_AGE_S = 0.0005  # shorter than the receive loop's 1-ms back-off, so every pass after one lists afresh
LISTING_TIME_SHARE = 0.25  # a listing waits at least 4x its own duration before the next one


class ShmListing:
    """The names in ``directory``, listed again only for a name the listing lacks and once it is old enough
    (thread-safe: a listing is replaced whole)."""

    def __init__(self, directory: str = SHM_DIR, max_age_s: float = MAX_AGE_S) -> None:
        self.directory, self.max_age_s = directory, max_age_s
        self._names, self._fresh_until = frozenset[str](), float("-inf")
        self._lock = threading.Lock()
        self.listings = 0

    def _relist(self) -> None:
        with self._lock:
            started = time.monotonic()
            if started < self._fresh_until:
                return  # another thread listed meanwhile
            names = frozenset(os.listdir(self.directory))
            took = time.monotonic() - started
            self._names = names
            self._fresh_until = started + max(self.max_age_s, took / LISTING_TIME_SHARE)
            self.listings += 1

    def __contains__(self, name: str) -> bool:
        if name in self._names:
            return True
        if time.monotonic() < self._fresh_until:
            return False
        self._relist()
        return name in self._names
