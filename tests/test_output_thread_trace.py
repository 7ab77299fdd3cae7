"""The output thread's trace: one ``[KaniFirstSent]`` line per traced first output, in order, and nothing left behind.

A real ``queue.Queue`` read by a thread as vLLM's output thread reads its engine's, carrying vLLM's own
``EngineCoreOutputs``. The served path (the engine cores' output threads of a real server, joined with the API
server's points) is checked in ``test_bench.py``'s traced sweep.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from types import SimpleNamespace

from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs

from vllm_omni_kani.core.sched.first_outputs import FirstOutputTrace
from vllm_omni_kani.engine.output_thread_trace import TAG, OutputThreadTrace, trace_output_thread

STOP = b"stop"


def _request(request_id: str) -> SimpleNamespace:
    return SimpleNamespace(request_id=request_id, arrival_time=time.time())


def _message(*request_ids: str) -> tuple[int, EngineCoreOutputs]:
    return 0, EngineCoreOutputs(outputs=[EngineCoreOutput(request_id=r, new_token_ids=[7]) for r in request_ids])


def _engine(trace: FirstOutputTrace) -> SimpleNamespace:
    return SimpleNamespace(scheduler=SimpleNamespace(first_output_trace=trace), output_queue=queue.Queue())


def _output_thread(engine: SimpleNamespace, taken: list) -> threading.Thread:
    """Reads the engine's queue until STOP, as ``EngineCoreProc.process_output_sockets`` does (its get each turn)."""

    def run() -> None:
        while (item := engine.output_queue.get()) != STOP:
            taken.append(item)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def _fields(line: str) -> dict[str, str]:
    return dict(item.split("=", 1) for item in line.split()[1:])


def test_each_first_output_is_logged_once_when_its_message_was_taken_and_sent(caplog):
    trace = FirstOutputTrace(stage=1)
    engine = _engine(trace)
    assert trace_output_thread(engine) and not trace_output_thread(engine)  # wrapped once
    assert isinstance(engine.output_queue.get, OutputThreadTrace)
    taken: list = []
    with caplog.at_level(logging.INFO, logger="vllm_omni_kani.engine.output_thread_trace"):
        thread = _output_thread(engine, taken)
        for rid in ("a", "b", "c"):
            trace.added(_request(rid))
        trace.scheduled(["a", "b"])
        trace.outputs(["a", "b"])  # a step's first outputs, then its message
        engine.output_queue.put(_message("a", "b"))
        trace.scheduled(["c"])
        trace.outputs(["a", "b", "c"])  # a's and b's second outputs are not traced
        engine.output_queue.put(_message("a", "b", "c"))
        engine.output_queue.put(_message("a"))
        engine.output_queue.put(STOP)  # each message's line is logged when the thread asks for the next
        thread.join(5)
    assert not thread.is_alive() and len(taken) == 3
    sent = [_fields(r.getMessage()) for r in caplog.records if TAG in r.getMessage()]
    assert [s["request_id"] for s in sent] == ["a", "b", "c"]
    assert all(s["stage"] == "1" and float(s["taken"]) <= float(s["sent"]) for s in sent)
    # a and b were in one message: one take, one send.
    assert (sent[0]["taken"], sent[0]["sent"]) == (sent[1]["taken"], sent[1]["sent"])
    assert float(sent[1]["sent"]) <= float(sent[2]["taken"])
    assert trace.leaving == set() and trace.pending == {}


def test_a_scheduler_without_the_trace_keeps_vllm_s_queue():
    engine = SimpleNamespace(scheduler=SimpleNamespace(first_output_trace=None), output_queue=queue.Queue())
    get = engine.output_queue.get
    assert not trace_output_thread(engine)
    assert engine.output_queue.get == get


def test_aborted_and_finished_requests_leave_nothing_over_10000_requests():
    trace = FirstOutputTrace(stage=0)
    engine = _engine(trace)
    trace_output_thread(engine)
    taken: list = []
    thread = _output_thread(engine, taken)
    for i in range(10_000):
        rid = f"r{i}"
        trace.added(_request(rid))
        trace.scheduled([rid])
        if i % 3 == 0:
            trace.forget(rid)  # aborted before its first output
        else:
            trace.outputs([rid])
            if i % 3 == 1:
                trace.forget([rid])  # aborted after it, before its message left
            engine.output_queue.put(_message(rid))
    engine.output_queue.put(STOP)
    thread.join(10)
    assert not thread.is_alive() and len(taken) == 6_666
    assert trace.leaving == set() and trace.pending == {}
    assert engine.output_queue.get.carrying == []
    trace.added(_request("x"))
    trace.outputs(["x"])
    trace.forget(None)
    assert trace.leaving == set() and trace.pending == {}
