"""The orchestrator-to-API-loop handoff of traced requests' outputs (``output_handoff``), through a real janus queue
as vLLM-Omni uses it (the orchestrator puts on its async side, the API loop takes from its sync side)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import janus
from vllm_omni.engine.messages import OutputMessage, StageMetricsMessage
from vllm_omni.outputs import OmniRequestOutput

from vllm_omni_kani.entrypoints import output_handoff


def _output(internal_id: str, stage: int) -> OutputMessage:
    engine_output = OmniRequestOutput(request_id=internal_id, finished=False, stage_id=stage, final_output_type="audio")
    return OutputMessage(request_id=internal_id, stage_id=stage, engine_outputs=engine_output, finished=False)


def test_a_watched_requests_messages_are_paired_in_queue_order_and_others_are_ignored():
    async def cross() -> list:
        queue: janus.Queue = janus.Queue()
        noting = output_handoff.NotingQueue(queue.async_q)
        output_handoff.watch("speech-a")
        sent = [_output("speech-a-0123abcd", 0), _output("speech-b-89abcdef", 1), _output("speech-a-0123abcd", 1)]
        metrics = StageMetricsMessage(request_id="speech-a-0123abcd", stage_id=1, metrics=None)
        await noting.put(sent[0])
        noting.put_nowait(metrics)  # a message without an engine output still takes its turn
        await noting.put(sent[1])
        await noting.put(sent[2])
        assert noting.qsize() == 4  # everything else is the queue's own
        while not queue.sync_q.empty():
            output_handoff.note_taken(queue.sync_q.get_nowait())
        queue.close()
        await queue.wait_closed()
        return sent

    sent = asyncio.run(cross())
    first, later = (output_handoff.crossing("speech-a", m.engine_outputs) for m in (sent[0], sent[2]))
    assert first is not None and later is not None
    assert first[0] <= first[1] and later[0] <= later[1] and first[0] <= later[0]
    assert output_handoff.crossing("speech-b", sent[1].engine_outputs) is None  # never watched
    output_handoff.release("speech-a")
    assert output_handoff.crossing("speech-a", sent[0].engine_outputs) is None
    output_handoff.release("speech-a")  # releasing twice is harmless


def test_requests_whose_streams_never_started_are_dropped_past_the_bound(monkeypatch):
    monkeypatch.setattr(output_handoff, "MAX_WATCHED", 3)
    for i in range(5):
        output_handoff.watch(f"speech-{i}")
    assert list(output_handoff._watched) == ["speech-2", "speech-3", "speech-4"]
    for i in range(5):
        output_handoff.release(f"speech-{i}")
    assert not output_handoff._watched


def test_the_engine_requests_queueing_is_kept_once_for_watched_requests_only():
    output_handoff.watch("speech-q")
    assert output_handoff.queued_at("speech-q") is None
    output_handoff.note_queued("speech-q-0123abcd")
    first = output_handoff.queued_at("speech-q")
    output_handoff.note_queued("speech-q-0123abcd")  # a later segment's or a retry's add_request keeps the first
    assert first is not None and output_handoff.queued_at("speech-q") == first
    output_handoff.note_queued("speech-z-0123abcd")  # never watched
    assert output_handoff.queued_at("speech-z") is None
    output_handoff.release("speech-q")
    assert output_handoff.queued_at("speech-q") is None


def test_the_orchestrators_first_read_of_each_stage_is_kept_for_watched_requests_only():
    assert not output_handoff.watching()
    output_handoff.watch("speech-r")
    assert output_handoff.watching() and output_handoff.read_at("speech-r") is None
    stage0 = [SimpleNamespace(request_id="speech-r-0123abcd"), SimpleNamespace(request_id="speech-x-0123abcd")]
    output_handoff.note_read(0, stage0, 1.0)
    output_handoff.note_read(0, stage0, 2.0)  # a later Stage-0 message keeps the first read
    assert output_handoff.read_at("speech-r") == 1.0
    output_handoff.note_read(1, [SimpleNamespace(request_id="speech-r-0123abcd")], 3.0)
    output_handoff.note_read(1, [SimpleNamespace(request_id="speech-r-0123abcd")], 4.0)
    assert output_handoff.read_at("speech-r") == 3.0  # the latest stage's first: the codec's, at the first audio
    assert output_handoff.read_at("speech-x") is None  # never watched
    output_handoff.release("speech-r")
    assert output_handoff.read_at("speech-r") is None and not output_handoff.watching()
