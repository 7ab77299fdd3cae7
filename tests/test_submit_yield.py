"""``KANI_SUBMIT_YIELD_US``: the thread that queued an engine request lets another thread take the GIL before it
goes on (served checks in ``test_serving.py``: on by default in the shipped server, off with 0 in the flattened
one)."""

from __future__ import annotations

import threading

import pytest

from vllm_omni_kani.engine.submit_yield import yielding_after_submit
from vllm_omni_kani.envs import DEFAULT_SUBMIT_YIELD_US, KANI_SUBMIT_YIELD_US, submit_yield_s

# Long enough for a woken thread to be scheduled even on a loaded 2-core CI machine; no time is asserted.
YIELD_S = 0.5


def test_the_woken_thread_runs_before_the_submitting_call_returns():
    """The wrapped call's put wakes a thread; that thread has run (it needs the GIL to set its event) by the time the
    call returns, because the call slept with the GIL released."""
    queued, forwarded = threading.Event(), threading.Event()

    def orchestrator() -> None:
        queued.wait()
        forwarded.set()

    def add_request(request_id: str, *, priority: int = 0) -> tuple[str, int]:
        queued.set()  # as vLLM-Omni's put on the orchestrator's queue
        return request_id, priority

    thread = threading.Thread(target=orchestrator)
    thread.start()
    try:
        wrapped = yielding_after_submit(add_request, YIELD_S)
        assert wrapped("speech-1", priority=3) == ("speech-1", 3)  # arguments and result pass through
        assert forwarded.is_set()
        assert wrapped.__name__ == "add_request"
    finally:
        queued.set()
        thread.join()


@pytest.mark.parametrize(("raw", "seconds"), [("0", 0.0), ("-5", 0.0), ("100", 1e-4), (" 250 ", 2.5e-4)])
def test_the_variable_is_read_in_microseconds(monkeypatch, raw, seconds):
    monkeypatch.setenv(KANI_SUBMIT_YIELD_US, raw)
    assert submit_yield_s() == pytest.approx(seconds)


@pytest.mark.parametrize("raw", [None, "", "  "])
def test_unset_or_empty_takes_the_default(monkeypatch, raw):
    """On unless turned off with 0 (the shipped server's setting; ``test_serving.py`` checks it served)."""
    if raw is None:
        monkeypatch.delenv(KANI_SUBMIT_YIELD_US, raising=False)
    else:
        monkeypatch.setenv(KANI_SUBMIT_YIELD_US, raw)
    assert submit_yield_s() == pytest.approx(DEFAULT_SUBMIT_YIELD_US / 1e6)


def test_a_bad_value_names_the_variable(monkeypatch):
    monkeypatch.setenv(KANI_SUBMIT_YIELD_US, "soon")
    with pytest.raises(ValueError, match=KANI_SUBMIT_YIELD_US):
        submit_yield_s()
