"""The Stage-0 chunk producer's sweep of aborted requests' state: it frees them, and its cost stays O(1) per call.

The producer keeps a ``FrameStream`` per request in the connector's ``request_payload``; a request that ends without
a terminal producer call (aborted, errored) is only freed by the sweep. Driven here the way the connector's save
thread drives it: one call per request per step, through the real module functions.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from vllm.v1.request import RequestStatus

from tests.conftest import chunk_transfer_manager
from vllm_omni_kani.model_executor.stage_input_processors import kani_tts as producer


def request(i: int) -> SimpleNamespace:
    return SimpleNamespace(external_req_id=f"req-{i}", output_token_ids=[], status=RequestStatus.RUNNING)


@pytest.fixture
def counted_sweeps(monkeypatch):
    """Count the sweeps and the states each one walks."""
    walked: list[int] = []
    sweep = producer._sweep_aborted

    def counting(payloads, keep):
        walked.append(len(payloads))
        return sweep(payloads, keep)

    monkeypatch.setattr(producer, "_sweep_aborted", counting)
    monkeypatch.setattr(producer, "_since_sweep", 0)
    return walked


def test_aborted_states_are_swept_and_running_ones_kept(counted_sweeps):
    manager, requests = chunk_transfer_manager(), [request(i) for i in range(300)]
    for r in requests:
        producer.parallel_async_chunk(manager, None, r)
    assert len(manager.request_payload) == 300
    for r in requests[::3]:
        r.status = RequestStatus.FINISHED_ABORTED
    requests[1].status = RequestStatus.FINISHED_STOPPED  # its terminal call is still queued: must survive the sweep
    for _ in range(2):  # two steps of the live requests
        for r in requests:
            if r.status == RequestStatus.RUNNING:
                producer.parallel_async_chunk(manager, None, r)
    assert counted_sweeps, "no sweep in 2 steps"
    assert set(manager.request_payload) == {r.external_req_id for r in requests if r not in requests[::3]}


def test_sweep_cost_is_constant_per_call(counted_sweeps):
    """At 256 streams a sweep every 64 calls walked 256 states: 4 per call. Now at most ~1 per call, and at least one
    sweep every 64 calls when few states are held."""
    manager = chunk_transfer_manager()
    streams = [request(i) for i in range(256)]
    calls = 0
    for _ in range(20):  # steps
        for r in streams:
            producer.parallel_async_chunk(manager, None, r)
            calls += 1
    assert sum(counted_sweeps) <= calls * 1.05
    assert len(counted_sweeps) >= 10
    few = chunk_transfer_manager()
    counted_sweeps.clear()
    for _ in range(640):
        producer.parallel_async_chunk(few, None, request(0))
    assert len(counted_sweeps) == 10
