"""``FirstOutputTrace``: one line per request at its first output, and nothing left behind by aborted requests.

The served path (both stages' schedulers on a real server, joined with the API server's points) is checked in
``test_bench.py``'s traced sweep.
"""

from __future__ import annotations

import logging
import time
from types import SimpleNamespace

from vllm_omni_kani.core.sched.first_outputs import TAG, FirstOutputTrace


def _request(request_id: str) -> SimpleNamespace:
    """What the trace reads of a vLLM ``Request``: its id and its arrival (wall clock)."""
    return SimpleNamespace(request_id=request_id, arrival_time=time.time() - 0.01)


def test_each_request_is_logged_once_at_its_first_output_with_ordered_points(caplog):
    trace = FirstOutputTrace(stage=0)
    with caplog.at_level(logging.INFO, logger="vllm_omni_kani.core.sched.first_outputs"):
        trace.added(_request("a"))
        trace.added(_request("b"))
        trace.scheduled(["a", "b"])
        trace.scheduled(["a"])  # a later step: the first one is kept
        trace.outputs(["a"])
        trace.outputs(["a", "b"])  # a's second output is not logged
    lines = [r.getMessage() for r in caplog.records if TAG in r.getMessage()]
    assert [line.split("request_id=")[1].split()[0] for line in lines] == ["a", "b"]
    for line in lines:
        fields = dict(item.split("=") for item in line.split()[2:])
        assert float(fields["added"]) <= float(fields["scheduled"]) <= float(fields["output"])
        assert float(fields["arrival_lag_ms"]) >= 10.0
    assert trace.pending == {}


def test_aborted_and_finished_requests_leave_nothing_over_10000_requests():
    trace = FirstOutputTrace(stage=1)
    for i in range(10_000):
        trace.added(_request(f"r{i}"))
        if i % 3 == 0:
            trace.forget(f"r{i}")  # aborted before its first output
        elif i % 3 == 1:
            trace.scheduled([f"r{i}"])
            trace.forget([f"r{i}"])
        else:
            trace.outputs([f"r{i}"])
        assert len(trace.pending) <= 1
    assert trace.pending == {}
    # Without an output thread's trace (engine/output_thread_trace.py) nothing is kept for one.
    assert trace.leaving is None
    trace.added(_request("x"))
    trace.forget(None)
    assert trace.pending == {}
