"""A streamed speech request's engine request, queued when the handler has its output generator.

vLLM-Omni queues the engine request at its output generator's first step (``AsyncOmni.generate`` calls
``add_request`` there). For a streamed response that step runs only once the response has started, after the
handler has returned and Starlette has sent the headers, on the API server's busy event loop: served on one H200
the request was queued 47-49 ms p50 after its generator was made at 64 streams, 138-190 ms at 256 (0.2 ms with
``EarlyStart``; docs/BENCHMARKS.md, twentieth set).
``EarlyStart`` runs that first step in a task of its own at once (started eagerly where Python has it, 3.12+, so
the request is queued before the handler returns), and the response's start overlaps the engines' work instead of
preceding it. The response then reads the first output from that task and the rest from the generator.

Closing: ``aclose`` cancels a first step still waiting (vLLM-Omni aborts the engine request on that cancellation),
waits for it to unwind, then closes the generator. The speech guard calls it at release, so a response that never
started streaming still frees its engine request; a consumer cancelled while it waits for the first output cancels
the first step with it (asyncio cancels the awaited task).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncGenerator, AsyncIterator, Coroutine
from typing import Any


def _start(coro: Coroutine[Any, Any, Any]) -> asyncio.Task:
    """``coro`` as a task, run up to its first suspension now where the interpreter can (``eager_start``, 3.12+)."""
    loop = asyncio.get_running_loop()
    if sys.version_info >= (3, 12):
        return asyncio.Task(coro, loop=loop, eager_start=True)
    return loop.create_task(coro)


class EarlyStart:
    """``gen``'s first step running now; ``outputs()`` yields everything ``gen`` yields, in order."""

    def __init__(self, gen: AsyncGenerator[Any, None]) -> None:
        self._gen = gen
        self._first = _start(self._first_step())

    async def _first_step(self) -> tuple[Any, ...]:
        """The first output as a 1-tuple, or ``()`` when the generator ends without one."""
        try:
            return (await anext(self._gen),)
        except StopAsyncIteration:
            return ()

    @property
    def first_step_done(self) -> bool:
        """Whether the first step has finished (its output is ready, or it failed or was cancelled)."""
        return self._first.done()

    async def outputs(self) -> AsyncIterator[Any]:
        """The first step's output, then the generator's."""
        first = await self._first
        if not first:
            return
        yield first[0]
        async for res in self._gen:
            yield res

    async def aclose(self) -> None:
        """Cancel a first step still running, wait until it has unwound, then close the generator."""
        if not self._first.done():
            self._first.cancel()
        await asyncio.wait([self._first])
        if not self._first.cancelled():
            self._first.exception()  # retrieved: a failed first step nobody read is not logged as never retrieved
        await self._gen.aclose()
