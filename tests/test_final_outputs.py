"""``PutWaker`` / ``waiting_for_outputs``: the API server's reads of the orchestrator's output queue, woken by the put.

The queue is a real ``janus.Queue`` fed from another thread, as vLLM-Omni's orchestrator thread feeds its output
queue (an awaited ``async_q.put`` on that thread's own event loop, or a ``sync_q.put_nowait``), and the read that is
wrapped is vLLM-Omni's own ``AsyncOmniEngine.try_get_output_async``; the served path (``AsyncOmni``'s output task
reading through the patched method) runs in every serving test.
"""

from __future__ import annotations

import asyncio
import inspect
import queue
import random
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import janus
import pytest
from vllm_omni.engine.async_omni_engine import AsyncOmniEngine

from tests.conftest import run_python
from vllm_omni_kani.engine import final_outputs
from vllm_omni_kani.engine.final_outputs import PutWaker, output_waker, waiting_for_outputs

# vLLM-Omni's read (unwrapped, should this process have the plugin's patches): get_nowait, None when empty.
read = waiting_for_outputs(inspect.unwrap(AsyncOmniEngine.try_get_output_async))


# A read's bound here: long enough that a read which waits and one which does not are told apart on a busy machine.
BOUND_S = 1.0


@pytest.fixture(autouse=True)
def long_bound(monkeypatch):
    monkeypatch.setattr(final_outputs, "IDLE_WAIT_S", BOUND_S)


def _engine(alive: bool = True) -> SimpleNamespace:
    """The two attributes of an ``AsyncOmniEngine`` that its read uses."""
    return SimpleNamespace(output_queue=janus.Queue(), is_alive=lambda: alive)


def _producer(output_queue: janus.Queue, items: list, *, gaps: bool) -> threading.Thread:
    """A thread with its own event loop that puts ``items`` the way the orchestrator does."""

    async def put_all() -> None:
        rng = random.Random(0)
        for item in items:
            await output_queue.async_q.put(item)
            if gaps and rng.random() < 0.05:
                await asyncio.sleep(rng.choice([0.0, 0.0005, 0.002]))

    thread = threading.Thread(target=lambda: asyncio.run(put_all()), daemon=True)
    thread.start()
    return thread


def test_every_item_put_from_another_thread_comes_once_and_in_order_and_every_wait_is_woken():
    async def run() -> tuple[list[int], list[int]]:
        engine = _engine()
        waker = output_waker(engine)
        producer = _producer(engine.output_queue, list(range(10_000)), gaps=True)
        got: list[int] = []
        not_woken: list[int] = []  # waits that ran into their bound although the producer's longest gap is 2 ms
        while len(got) < 10_000:
            try:
                got.append(engine.output_queue.sync_q.get_nowait())
            except queue.Empty:
                if not await waker.wait(2.0):
                    not_woken.append(len(got))
        producer.join(10)
        assert waker.waiter is None
        return got, not_woken

    got, not_woken = asyncio.run(run())
    assert got == list(range(10_000))
    assert not_woken == []


@pytest.mark.parametrize("side", ["async", "sync"])
def test_a_put_ends_the_wait_at_once(side):
    async def run() -> tuple[object, float]:
        output_queue: janus.Queue[str] = janus.Queue()
        waker = PutWaker(output_queue)
        if side == "async":
            _producer(output_queue, ["late"], gaps=False)  # it puts whenever its thread runs
        else:
            threading.Timer(0.05, output_queue.sync_q.put_nowait, ("late",)).start()
        start = time.perf_counter()
        await waker.wait(30.0)
        return output_queue.sync_q.get_nowait(), time.perf_counter() - start

    item, waited = asyncio.run(run())
    assert item == "late" and waited < 5.0  # not the 30-s bound


def test_a_first_empty_read_returns_at_once_a_second_waits_its_bound_and_a_cancelled_wait_loses_nothing():
    async def run() -> tuple[object, float, object, float, object]:
        engine = _engine()
        start = time.perf_counter()
        first = await read(engine)  # as vLLM-Omni's: the output task then sleeps its 1 ms
        first_s = time.perf_counter() - start
        start = time.perf_counter()
        second = await read(engine)
        second_s = time.perf_counter() - start

        waiting = asyncio.ensure_future(read(engine))
        await asyncio.sleep(0.01)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert output_waker(engine).waiter is None
        engine.output_queue.sync_q.put_nowait("after")  # nobody waits: the put only queues it
        return first, first_s, second, second_s, await read(engine)

    first, first_s, second, second_s, after = asyncio.run(run())
    assert first is None and first_s < BOUND_S / 2
    assert second is None and BOUND_S * 0.9 <= second_s < BOUND_S * 10
    assert after == "after"


def test_a_read_after_a_message_returns_at_once_when_empty():
    async def run() -> list[float]:
        engine = _engine()
        for _ in range(2):  # two empty reads: the next empty read would wait
            assert await read(engine) is None
        engine.output_queue.sync_q.put_nowait("m")
        assert await read(engine) == "m"
        start = time.perf_counter()
        assert await read(engine) is None  # the first empty read after a message
        return [time.perf_counter() - start]

    assert asyncio.run(run())[0] < BOUND_S / 2


def test_a_dead_orchestrator_is_raised_at_an_empty_read():
    async def run() -> None:
        await read(_engine(alive=False))

    with pytest.raises(RuntimeError, match="Orchestrator died"):
        asyncio.run(run())


def test_the_engine_keeps_one_waker_for_its_queue():
    async def run() -> list[str]:
        engine = _engine()
        assert await read(engine) is None
        threading.Timer(0.05, engine.output_queue.sync_q.put_nowait, ("a",)).start()
        first = await read(engine)  # the second empty read waits: the put ends it
        engine.output_queue.sync_q.put_nowait("b")
        second = await read(engine)
        assert output_waker(engine) is output_waker(engine)  # the queue is wrapped once, not once per read
        return [first, second]

    assert asyncio.run(run()) == ["a", "b"]


def test_the_patch_is_off_by_default_and_wraps_the_engines_read_with_the_handoff_trace_when_asked():
    code = (
        "import inspect, sys, vllm_omni_kani\n"
        "import vllm_omni.entrypoints.openai.api_server\n"
        "from vllm_omni_kani import patch\n"
        "from vllm_omni.engine.async_omni_engine import AsyncOmniEngine\n"
        "active = patch.apply_all()\n"
        "assert 'trace_output_handoff' in active, active\n"
        "print('wake_on_final_outputs' in active)\n"
        "chain, fn = [], AsyncOmniEngine.try_get_output_async\n"
        "while fn is not None:\n"
        "    chain.append(fn.__code__.co_filename); fn = getattr(fn, '__wrapped__', None)\n"
        "print(' '.join(chain))\n"
    )
    active, chain = run_python(code, env={"KANI_WAKE_ON_FINAL_OUTPUTS": ""}).stdout.strip().splitlines()[-2:]
    assert active == "False" and len(chain.split()) == 2  # the handoff trace around vLLM-Omni's read

    active, chain = run_python(code, env={"KANI_WAKE_ON_FINAL_OUTPUTS": "1"}).stdout.strip().splitlines()[-2:]
    files = chain.split()
    # Both wrappers are there (in either order), around vLLM-Omni's read.
    assert active == "True" and len(files) == 3, files
    assert sorted(Path(f).name for f in files[:2]) == ["final_outputs.py", "patch.py"], files
    assert files[-1].endswith("vllm_omni/engine/async_omni_engine.py"), files
