"""``EarlyStart``: a generator's first step runs before anyone reads it, and every way out unwinds it.

The generators here stand in for ``AsyncOmni.generate``, whose contract ``EarlyStart`` relies on: its first step
queues the engine request, and a cancellation or close while it waits aborts it. The served tests
(``test_reliability.py``, ``test_serving.py``) run the real one.
"""

from __future__ import annotations

import asyncio
import gc

import pytest

from vllm_omni_kani.entrypoints.openai.early_start import EarlyStart


class Engine:
    """What the generator did: queued its request, was aborted, gave outputs."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self.release = asyncio.Event()

    async def generate(self, outputs: int):
        self.events.append("queued")
        try:
            await self.release.wait()
            for i in range(outputs):
                yield i
                await asyncio.sleep(0)
        except (asyncio.CancelledError, GeneratorExit):
            self.events.append("aborted")
            raise


async def _until(predicate, steps: int = 50) -> None:
    for _ in range(steps):
        if predicate():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition never became true")


def test_the_first_step_runs_before_the_outputs_are_read_and_they_come_whole_and_in_order():
    async def main():
        engine = Engine()
        early = EarlyStart(engine.generate(5))
        await asyncio.sleep(0)  # Python 3.11 runs the task at the loop's next turn; 3.12+ already ran it
        assert engine.events == ["queued"]
        assert not early.first_step_done
        engine.release.set()
        got = [res async for res in early.outputs()]
        await early.aclose()
        return got, engine.events

    got, events = asyncio.run(main())
    assert got == [0, 1, 2, 3, 4]
    assert events == ["queued"]  # ran to its end: nothing aborted


def test_a_generator_without_outputs_yields_nothing():
    async def main():
        engine = Engine()
        engine.release.set()
        early = EarlyStart(engine.generate(0))
        got = [res async for res in early.outputs()]
        await early.aclose()
        return got

    assert asyncio.run(main()) == []


def test_closing_before_anything_was_read_aborts_the_waiting_first_step():
    """The response never started (the client left first): release closes it and the engine request is aborted."""

    async def main():
        engine = Engine()
        gen = engine.generate(5)
        early = EarlyStart(gen)
        await _until(lambda: engine.events == ["queued"])
        await early.aclose()
        assert early.first_step_done
        with pytest.raises(StopAsyncIteration):
            await anext(gen)  # closed
        return engine.events

    assert asyncio.run(main()) == ["queued", "aborted"]


def test_closing_before_the_task_ran_never_queues_the_request():
    async def main():
        engine = Engine()
        early = EarlyStart(engine.generate(5))
        await early.aclose()  # on 3.11 the task has not run yet; on 3.12+ it is waiting
        return engine.events

    assert asyncio.run(main()) in (["queued", "aborted"], [])


def test_a_reader_cancelled_while_it_waits_for_the_first_output_cancels_the_first_step():
    """A client that disconnects while its stream waits for the first audio: the response's task is cancelled."""

    async def main():
        engine = Engine()
        early = EarlyStart(engine.generate(5))
        reading = asyncio.Event()

        async def read():
            stream = early.outputs()
            reading.set()  # then it suspends waiting for the first output
            try:
                async for _ in stream:
                    pass
            finally:
                await stream.aclose()
                await early.aclose()

        reader = asyncio.create_task(read())
        await _until(lambda: engine.events == ["queued"] and reading.is_set())
        reader.cancel()
        with pytest.raises(asyncio.CancelledError):
            await reader
        return engine.events, early.first_step_done

    events, done = asyncio.run(main())
    assert events == ["queued", "aborted"]
    assert done


def test_a_reader_that_stops_after_the_first_output_closes_the_generator():
    async def main():
        engine = Engine()
        engine.release.set()
        early = EarlyStart(engine.generate(5))
        stream = early.outputs()
        first = await anext(stream)
        await stream.aclose()
        await early.aclose()
        return first, engine.events

    first, events = asyncio.run(main())
    assert first == 0
    assert events == ["queued", "aborted"]


def test_a_failing_first_step_raises_for_its_reader_and_is_retrieved_when_nobody_reads_it():
    async def failing():
        raise ValueError("bad prompt")
        yield  # an async generator

    async def main():
        reported: list[dict] = []
        asyncio.get_running_loop().set_exception_handler(lambda _loop, ctx: reported.append(ctx))
        early = EarlyStart(failing())
        with pytest.raises(ValueError, match="bad prompt"):
            async for _ in early.outputs():
                pass
        unread = EarlyStart(failing())
        await _until(lambda: unread.first_step_done)
        await unread.aclose()  # the guard's release: it must neither raise nor leave the error unretrieved
        early = unread = None  # unreferenced: a task error never retrieved would be reported now
        gc.collect()
        await asyncio.sleep(0)
        return reported

    assert asyncio.run(main()) == []
