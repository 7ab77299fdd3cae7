"""``ReplicaReads``: the orchestrator's polls of its replicas, one read pending per replica.

Each replica here is an ``asyncio.Queue`` read the way ``StagePool._poll_stage_raw`` reads a replica's client (an
awaited get); the served path (vLLM-Omni's orchestrator polling real engines through the patched
``StagePool.poll_llm_raw_output``) runs in every serving test.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from vllm_omni_kani.engine.replica_outputs import IDLE_WAIT_S, ReplicaReads


def _replicas(n: int) -> tuple[ReplicaReads, list[asyncio.Queue]]:
    return ReplicaReads(), [asyncio.Queue() for _ in range(n)]


async def _poll(reads: ReplicaReads, queues: list[asyncio.Queue], i: int, timeout_s: float = IDLE_WAIT_S):
    return await reads.take((0, i), queues[i].get, timeout_s)


def test_every_output_comes_once_and_in_order_per_replica():
    async def run() -> list[list[int]]:
        reads, queues = _replicas(3)
        got: list[list[int]] = [[], [], []]
        for k in range(50):
            queues[k % 3].put_nowait(k)
        while sum(map(len, got)) < 50:
            for i in range(3):
                out = await _poll(reads, queues, i, 0.01)
                if out is not None:
                    got[i].append(out)
        return got

    got = asyncio.run(run())
    assert got == [list(range(i, 50, 3)) for i in range(3)]


def test_a_poll_with_nothing_ready_waits_its_bound_and_keeps_the_read():
    async def run() -> tuple[object, float, int, object]:
        reads, queues = _replicas(1)
        start = time.perf_counter()
        out = await _poll(reads, queues, 0, 0.05)
        waited = time.perf_counter() - start
        pending = len(reads.reads)
        queues[0].put_nowait("late")
        return out, waited, pending, await _poll(reads, queues, 0, 1.0)

    out, waited, pending, late = asyncio.run(run())
    assert out is None and 0.04 <= waited < 1.0
    assert pending == 1  # the read stays for the next poll: nothing is lost in between
    assert late == "late"


def test_another_replicas_output_ends_the_wait_at_once():
    async def run() -> tuple[object, float, object]:
        reads, queues = _replicas(2)
        await _poll(reads, queues, 1, 0.0)  # replica 1's read is pending now
        asyncio.get_running_loop().call_later(0.05, queues[1].put_nowait, "from 1")
        start = time.perf_counter()
        out = await _poll(reads, queues, 0, 30.0)
        return out, time.perf_counter() - start, await _poll(reads, queues, 1, 0.0)

    out, waited, other = asyncio.run(run())
    assert out is None and waited < 5.0  # not the 30-s bound
    assert other == "from 1"


def test_a_replica_just_taken_keeps_a_read_pending_so_its_next_output_ends_a_wait():
    # The orchestrator's pass takes a replica's output and goes on to poll the others; that replica's next output
    # must end their waits too (on an H200 the codec's outputs waited behind Stage 0's polls without it: its first
    # audio reached the orchestrator's queue 68-315 ms p50 after the codec made it, forty-second set).
    async def run() -> tuple[object, object, float, object]:
        reads, queues = _replicas(2)
        queues[1].put_nowait("first")
        taken = await _poll(reads, queues, 1, 1.0)
        asyncio.get_running_loop().call_later(0.05, queues[1].put_nowait, "second")
        start = time.perf_counter()
        out = await _poll(reads, queues, 0, 10.0)
        return taken, out, time.perf_counter() - start, await _poll(reads, queues, 1, 0.0)

    taken, out, waited, second = asyncio.run(run())
    assert taken == "first"
    assert out is None and waited < 5.0  # not the 10-s bound
    assert second == "second"


def test_a_fast_replica_behind_slow_ones_is_read_as_its_outputs_come():
    # The orchestrator's passes (every replica polled in turn) over two slow replicas (Stage 0's, an output every
    # 40 ms) and a fast one (the codec, every 5 ms): the fast one's outputs must not queue up behind the passes.
    async def run() -> list[float]:
        reads, queues = _replicas(3)
        loop = asyncio.get_running_loop()
        delays: list[float] = []

        async def produce(i: int, period_s: float, n: int) -> None:
            for _ in range(n):
                await asyncio.sleep(period_s)
                queues[i].put_nowait(loop.time())

        producers = [
            asyncio.ensure_future(produce(0, 0.04, 25)),
            asyncio.ensure_future(produce(1, 0.04, 25)),
            asyncio.ensure_future(produce(2, 0.005, 200)),
        ]
        while len(delays) < 200:
            for i in range(3):
                out = await _poll(reads, queues, i)
                if out is not None and i == 2:
                    delays.append(loop.time() - out)
        for task in producers:
            task.cancel()
        return sorted(delays)

    delays = asyncio.run(run())
    # One taken a pass, but no wait leaves it unwatched (unwatched, they fell 8 s behind at the median here).
    assert delays[len(delays) // 2] < 0.25


def test_a_failed_read_raises_at_its_replicas_poll_and_the_next_poll_reads_again():
    async def run() -> object:
        reads = ReplicaReads()
        calls = iter([RuntimeError("engine dead"), "next"])

        async def read() -> object:
            value = next(calls, None)
            if value is None:  # the read started after "next" was taken: nothing more comes
                await asyncio.Event().wait()
            if isinstance(value, Exception):
                raise value
            return value

        with pytest.raises(RuntimeError, match="engine dead"):
            await reads.take((0, 0), read, 1.0)
        assert reads.reads == {}
        return await reads.take((0, 0), read, 1.0)

    assert asyncio.run(run()) == "next"


def test_a_dropped_replica_cancels_its_read_and_polls_leave_nothing_over_10000_rounds():
    async def run() -> tuple[bool, int]:
        reads, queues = _replicas(2)
        await _poll(reads, queues, 0, 0.0)
        task = reads.reads[(0, 0)]
        reads.drop((0, 0))
        await asyncio.sleep(0)
        cancelled = task.cancelled()
        for k in range(10_000):
            queues[k % 2].put_nowait(k)
            assert await _poll(reads, queues, k % 2, 1.0) == k
        return cancelled, len(reads.reads) + len(reads.done_at)

    cancelled, left = asyncio.run(run())
    # One read pending per replica, none piled up, and no end time kept of a read already taken or dropped.
    assert cancelled and left == 2


def test_a_read_keeps_when_it_ended_and_a_watched_requests_read_is_noted():
    """The patched ``StagePool.poll_llm_raw_output`` over a stand-in pool whose one replica is a queue of raw outputs
    (what ``_poll_stage_raw`` reads); the served path runs in ``test_bench.py``'s traced test."""
    from types import SimpleNamespace

    from vllm_omni_kani.engine.replica_outputs import poll_llm_raw_output
    from vllm_omni_kani.entrypoints import output_handoff

    async def run() -> tuple[float, float, object]:
        queue: asyncio.Queue = asyncio.Queue()
        pool = SimpleNamespace(
            stage_id=1, clients=[queue], is_replica_available=lambda _: True, _poll_stage_raw=lambda q: q.get()
        )
        assert await poll_llm_raw_output(pool, 0) is None  # nothing yet: the replica's read stays pending
        output_handoff.watch("speech-w")
        put = time.perf_counter()
        queue.put_nowait(SimpleNamespace(outputs=[SimpleNamespace(request_id="speech-w-0123abcd")]))
        await asyncio.sleep(0.05)  # the read ends meanwhile; the orchestrator's pass takes it after
        return put, time.perf_counter(), await poll_llm_raw_output(pool, 0)

    try:
        put, before_take, result = asyncio.run(run())
        read = output_handoff.read_at("speech-w")
        assert result is not None and read is not None
        assert put <= read < put + 0.05 <= before_take  # when the read ended, not when the pass took it
    finally:
        output_handoff.release("speech-w")
