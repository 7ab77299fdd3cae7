"""Finished requests' stats are built and logged off the API server's event loop: on one thread, in finishing order,
a failing one does not stop the rest, and everything queued is logged at exit."""

from __future__ import annotations

import threading

import pytest

from tests.conftest import run_python
from vllm_omni_kani.entrypoints.summary_logging import SummaryThread
from vllm_omni_kani.envs import KANI_REQUEST_TABLES


def test_summaries_run_on_one_thread_in_order_and_survive_a_failure():
    summaries, ran = SummaryThread(), []
    release = threading.Event()
    summaries.submit(release.wait)  # holds the thread until everything below is queued
    for i in range(50):
        summaries.submit(lambda i=i: ran.append((i, threading.current_thread().name)))
        if i == 10:
            summaries.submit(lambda: 1 / 0)
    assert ran == []  # queued, not run by the submitting thread
    release.set()
    summaries.drain()  # what exit does: everything queued is run first
    assert [i for i, _ in ran] == list(range(50))
    assert {name for _, name in ran} == {"kani-request-summaries"}
    summaries.submit(lambda: ran.append(("late", threading.current_thread().name)))
    assert ran[-1] == ("late", threading.current_thread().name)  # after the drain: inline


@pytest.mark.parametrize(
    ("env", "expected"),
    [({}, "[KaniRequestStats] request_id=speech-1 "), ({KANI_REQUEST_TABLES: "1"}, "Overall Summary")],
    ids=["one-line", "tables"],
)
def test_the_api_server_logs_request_stats_from_the_summary_thread(env, expected):
    """One ``[KaniRequestStats]`` line per request by default, vLLM-Omni's tables with ``KANI_REQUEST_TABLES=1``;
    either way from the summary thread, and nothing when the aggregator does not log stats."""
    code = (
        "import logging, time\n"
        "import vllm_omni.entrypoints.openai.api_server\n"
        "from vllm_omni.metrics.stats import OrchestratorAggregator\n"
        "from vllm_omni_kani import patch\n"
        "from vllm_omni_kani.entrypoints.summary_logging import SUMMARIES\n"
        "assert patch.log_request_summaries_off_the_event_loop()\n"
        "records = []\n"
        "class Keep(logging.Handler):\n"
        "    def emit(self, record):\n"
        "        records.append((record.threadName, record.getMessage()))\n"
        "for name in ('vllm_omni.metrics.stats', 'vllm_omni_kani.entrypoints.request_stats'):\n"
        "    logging.getLogger(name).addHandler(Keep())\n"
        "    logging.getLogger(name).setLevel(logging.INFO)\n"
        "aggregator = OrchestratorAggregator(2, True, time.time() - 1.0, 1)\n"
        "aggregator.on_finalize_request(1, 'speech-1', time.time() - 0.5)  # a request that took 0.5 s\n"
        "assert aggregator.build_and_log_summary() == {}\n"
        "assert OrchestratorAggregator(2, False, time.time(), 1).build_and_log_summary() == {}\n"
        "SUMMARIES.drain()\n"
        "assert records and all(name == 'kani-request-summaries' for name, _ in records), records\n"
        f"assert any({expected!r} in message for _, message in records), records\n"
        "print('summaries', len(records))\n"
    )
    assert "summaries" in run_python(code, env).stdout
