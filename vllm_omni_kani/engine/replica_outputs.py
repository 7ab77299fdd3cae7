"""The orchestrator's polls of its LLM replicas' outputs, answered by one pending read per replica.

vLLM-Omni's orchestrator loop (``Orchestrator._orchestration_loop``) asks every replica of every stage in turn for
its next outputs with ``StagePool.poll_llm_raw_output(replica_id, timeout_s=0.001)``: each poll wraps a fresh read
in ``asyncio.wait_for``, a task and a 1-ms timer, and cancels it when nothing came; an idle pass then sleeps 1 ms.
The orchestrator thread so wakes a few thousand times a second, each time taking the GIL from the API server's event
loop, which shares its process (an idle server's orchestrator thread used ~11% of a core on this project's CPU
machine). Here each replica keeps one read pending across polls (``ReplicaReads``), the next one started as soon as a
result is taken; a poll whose read is done returns its result, and a poll that finds no read of the loop done waits
until one is, or at most ``IDLE_WAIT_S``. Outputs reach the orchestrator as soon as any replica has one (the waiting
poll returns, and the pass goes on to the replica whose read finished); an idle orchestrator wakes a few times a
second.

Each read also keeps when it finished (the replica's message read off its socket and decoded): for a request traced
with ``X-Kani-Trace`` ``output_handoff.note_read`` keeps it, so its first audio's way from the codec to the
orchestrator's queue splits into the crossing to this thread and the orchestrator's pass
(``benchmarks/first_outputs.py``).
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

from vllm_omni_kani.entrypoints import output_handoff

# How long a poll that finds nothing ready waits for any replica's read to finish (an idle pass of the orchestrator
# loop polls every replica, so it wakes every few multiples of this; any output ends the wait at once).
IDLE_WAIT_S = 0.05


class ReplicaReads:
    """The pending reads of one event loop's replicas, keyed by (pool, replica id), and an event set when one ends."""

    def __init__(self) -> None:
        self.reads: dict[tuple[int, int], asyncio.Task] = {}
        self.finished = asyncio.Event()
        # perf_counter seconds at which each replica's pending read finished (until its result is taken), and that
        # of the read whose result take() returned last.
        self.done_at: dict[tuple[int, int], float] = {}
        self.taken_done_at = 0.0

    def read(self, key: tuple[int, int], start: Callable[[], Awaitable[Any]]) -> asyncio.Task:
        """The replica's pending read, started with ``start()`` when it has none."""
        task = self.reads.get(key)
        if task is None:
            task = asyncio.ensure_future(start())
            task.add_done_callback(lambda done: self._finished(key, done))
            self.reads[key] = task
        return task

    def _finished(self, key: tuple[int, int], task: asyncio.Task) -> None:
        if self.reads.get(key) is task:  # not a dropped replica's cancelled read
            self.done_at[key] = time.perf_counter()
        self.finished.set()

    def drop(self, key: tuple[int, int]) -> None:
        """Forget (and cancel) a replica's read: the replica left."""
        self.done_at.pop(key, None)
        task = self.reads.pop(key, None)
        if task is not None and not task.done():
            task.cancel()

    async def wait_any(self, timeout_s: float) -> None:
        """Return when some read is done, or after ``timeout_s``. (A done read of a replica that left before its
        next poll would end every wait at once: the loop then polls at vLLM-Omni's own 1-ms cadence, as before.)"""
        if any(task.done() for task in self.reads.values()):
            return
        self.finished.clear()
        try:
            async with asyncio.timeout(timeout_s):
                await self.finished.wait()
        except TimeoutError:
            pass

    async def take(self, key: tuple[int, int], start: Callable[[], Awaitable[Any]], timeout_s: float) -> Any:
        """The replica's next result (None when its read is not done after waiting), its exception raised.

        A result taken starts the replica's next read at once: the pass goes on to wait on other replicas, and this
        one's next output must end those waits too (a replica with no read pending would sit unwatched until the
        pass came back to it)."""
        task = self.read(key, start)
        if not task.done():
            await self.wait_any(timeout_s)
            if not task.done():
                return None
        del self.reads[key]
        # Its done callback may not have run yet (it is scheduled when the read ends): then the read ended by now.
        self.taken_done_at = self.done_at.pop(key, None) or time.perf_counter()
        result = task.result()  # a failed read raises here and leaves no read behind: the next poll starts one
        self.read(key, start)
        return result


_BY_LOOP: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, ReplicaReads] = weakref.WeakKeyDictionary()


def loop_reads() -> ReplicaReads:
    """The running loop's ``ReplicaReads`` (the orchestrator's loop: one per orchestrator thread)."""
    loop = asyncio.get_running_loop()
    reads = _BY_LOOP.get(loop)
    if reads is None:
        reads = _BY_LOOP[loop] = ReplicaReads()
    return reads


async def poll_llm_raw_output(pool: Any, replica_id: int, *, timeout_s: float = 0.001) -> Any:
    """``StagePool.poll_llm_raw_output`` with one read pending per replica (module docstring). ``timeout_s`` is the
    caller's and is ignored: a poll with nothing ready waits up to ``IDLE_WAIT_S``, ended by any replica's output."""
    key = (id(pool), replica_id)
    reads = loop_reads()
    client = pool.clients[replica_id] if pool.is_replica_available(replica_id) else None
    if client is None:
        reads.drop(key)
        return None
    # A failed read is forgotten by take() before it raises here: the replica's next poll reads again.
    result = await reads.take(key, lambda: pool._poll_stage_raw(client), IDLE_WAIT_S)
    if result is not None and output_handoff.watching():
        output_handoff.note_read(pool.stage_id, getattr(result, "outputs", ()), reads.taken_done_at)
    return result
