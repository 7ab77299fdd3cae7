"""The API server's reads of the orchestrator's outputs, woken by the orchestrator's put instead of a 1-ms poll.

vLLM-Omni's ``AsyncOmni`` routes the orchestrator's outputs to each request's queue from one task on the API server's
event loop (``_final_output_handler``). That task asks ``AsyncOmniEngine.try_get_output_async()`` for a message,
which reads the janus output queue without waiting; when nothing is there the task sleeps 1 ms and asks again. The
event loop so wakes about a thousand times a second whenever the queue is empty (on this project's CPU machine an
idle server's event-loop thread used ~5% of a core), and each wake takes the GIL from the orchestrator thread, which
shares the process and feeds Stage 0.

With ``KANI_WAKE_ON_FINAL_OUTPUTS=1`` (``patch.wake_on_final_outputs``) a read that finds the queue empty for the
second time in a row waits until the orchestrator puts a message, or at most ``IDLE_WAIT_S``, then reads again (the
first empty read returns None at once and the task sleeps its 1 ms, as before). The put (any put into that queue:
async or sync, from any thread) wakes the waiting loop only when it is waiting, and a put made on another event loop
(the orchestrator's) wakes it once that loop's current step has run: a step puts its messages one by one, and a loop
woken at the first would take them in turns with the orchestrator. An idle loop wakes a few times a second and checks
then that the orchestrator thread is alive.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from typing import Any

# How long a read that finds the queue empty waits for the orchestrator's next put before it returns None (the caller
# then sleeps 1 ms and reads again; an orchestrator that died is noticed at most this late).
IDLE_WAIT_S = 0.05


class PutWaker:
    """Wakes the event loop waiting for a janus queue's next item, from the thread that puts it.

    The queue's ``_put_internal`` (every put path calls it under the queue's mutex) is wrapped on this one queue
    object. The waiter is a future of the reading loop; the put that finds one clears it and has it set in the
    loop's thread (``call_soon_threadsafe``), so a put with nobody waiting costs an attribute read.
    """

    def __init__(self, janus_queue: Any) -> None:
        self.queue = janus_queue
        self.waiter: asyncio.Future[None] | None = None
        # Reads in a row that found the queue empty (``waiting_for_outputs``).
        self.empty_reads = 0
        put_internal = janus_queue._put_internal

        def put_and_wake(item: Any) -> None:
            put_internal(item)
            waiter = self.waiter
            if waiter is None:
                return
            self.waiter = None
            try:
                putter = asyncio.get_running_loop()
            except RuntimeError:
                putter = None
            if putter is not None and putter is not waiter.get_loop():
                # Put from another event loop (the orchestrator's): wake the reader once that loop's current step,
                # which may put more, has run, not in the middle of it.
                putter.call_soon(_wake, waiter)
            else:
                _wake(waiter)

        janus_queue._put_internal = put_and_wake

    async def wait(self, timeout_s: float) -> bool:
        """Return when the queue holds an item or a put comes: True; or after ``timeout_s`` with no put: False."""
        sync_q = self.queue.sync_q
        if not sync_q.empty():
            return True
        waiter = asyncio.get_running_loop().create_future()
        self.waiter = waiter
        try:
            # A put between the check above and setting the waiter did not see it: check once more.
            if not sync_q.empty():
                return True
            try:
                async with asyncio.timeout(timeout_s):
                    await waiter
            except TimeoutError:
                return False
            return True
        finally:
            if self.waiter is waiter:
                self.waiter = None


def _resolve(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def _wake(waiter: asyncio.Future[None]) -> None:
    loop = waiter.get_loop()
    if not loop.is_closed():
        loop.call_soon_threadsafe(_resolve, waiter)


def output_waker(engine: Any) -> PutWaker:
    """The engine's ``PutWaker`` for its output queue, made on first use."""
    waker = engine.__dict__.get("_kani_output_waker")
    if waker is None or waker.queue is not engine.output_queue:
        waker = engine.__dict__["_kani_output_waker"] = PutWaker(engine.output_queue)
    return waker


def waiting_for_outputs(take: Callable[[Any], Awaitable[Any]]) -> Callable[[Any], Awaitable[Any]]:
    """``AsyncOmniEngine.try_get_output_async`` (``take``) that, finding the queue empty twice in a row, waits for the
    orchestrator's next put (at most ``IDLE_WAIT_S``) and reads again.

    The first empty read returns None as vLLM-Omni's does, and the output task sleeps its 1 ms: the orchestrator puts
    a step's messages one by one, and a loop that waited at once would be woken by each put of the step in turn,
    taking the GIL from the orchestrator between them. ``take`` itself reads and raises when the orchestrator thread
    has died; it may be another patch's wrapper of vLLM-Omni's."""

    @functools.wraps(take)
    async def try_get_output_async(self: Any) -> Any:
        message = await take(self)
        waker = output_waker(self)
        if message is None and waker.empty_reads:
            await waker.wait(IDLE_WAIT_S)
            message = await take(self)
        waker.empty_reads = 0 if message is not None else waker.empty_reads + 1
        return message

    return try_get_output_async
