"""The API server's thread hands the GIL to the orchestrator thread right after it queues an engine request.

vLLM-Omni's ``AsyncOmniEngine.add_request`` puts the request on a janus queue that the orchestrator thread reads,
and that thread forwards it to Stage 0. Both threads live in the API server's process under one GIL. While the event
loop is busy (a wave of requests arriving, every stream's audio going out) the orchestrator, woken by the put, waits
for CPython's switch interval (5 ms) before it gets the GIL, and then shares it in 5-ms turns with the loop: served
on one H200, a 64-request wave's requests reached Stage 0 77.7 / 114 ms (p50 / p95) after being queued, and the
last of them 69 ms after the last had reached the speech handler (docs/BENCHMARKS.md, forty-first and forty-fourth
sets). A shorter switch interval for the whole process gave the orchestrator its turns sooner but slowed the loop's
intake of the wave as much (``KANI_MAIN_GIL_SWITCH_INTERVAL_MS``).

With ``KANI_SUBMIT_YIELD_US=N`` the thread that queued a request sleeps N microseconds right after the put
(``time.sleep`` releases the GIL): the woken orchestrator thread takes the GIL in that window, forwards the request
and returns to its wait, and the loop goes on. N is the time the orchestrator thread needs to wake from its wait (a
few tens of microseconds on an idle core); a put it does not wake for in time costs the loop N. On by default at
100 us (``envs.DEFAULT_SUBMIT_YIELD_US``): served on one H200 against 0, a 64-request wave's requests reached Stage 0
23-28 ms p50 after being queued instead of 64-69, and 64-frame requests at 256 streams gave 9-21% more frames/s
(forty-fifth set). ``KANI_SUBMIT_YIELD_US=0`` turns it off.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any


def yielding_after_submit(add_request: Callable[..., Any], seconds: float) -> Callable[..., Any]:
    """``add_request`` followed by a ``seconds`` sleep of the calling thread (the GIL released for it)."""

    @functools.wraps(add_request)
    def add_then_yield(*args: Any, **kwargs: Any) -> Any:
        result = add_request(*args, **kwargs)
        time.sleep(seconds)
        return result

    return add_then_yield
