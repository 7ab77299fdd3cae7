"""Where the API server's event loop stands while it is stalled, sampled by a watchdog thread.

The loop-lag meter (``loop_lag``) says how late the loop woke, not what held it: a stall of hundreds of ms at 256
streams (docs/BENCHMARKS.md) delays every new request's admission and handler. While the meter's heartbeat is older
than ``KANI_LOOP_STALL_MS``, this daemon thread samples the loop thread's stack every ``POLL_S`` and charges the
interval to it, so each window can name the stacks that held the loop and for how long (a lower bound: the watchdog
needs the GIL to sample, and waits up to the switch interval for it). The loop thread may also be
waiting for the GIL another thread holds, so the busy frames of the process's other threads are sampled beside it.
A thread counts as busy only where it moved since the stall's previous sample: one parked in a C call (an idle
executor worker in ``SimpleQueue.get``, a socket wait) keeps its frame and instruction, and holds no GIL there.
"""

from __future__ import annotations

import sys
import threading
import time
from collections import Counter
from types import FrameType

POLL_S = 0.01
# Innermost frames kept per stack: enough to see the call that blocked and who made it.
DEPTH = 8
# Innermost functions of a thread that waits rather than works (its sample says nothing about the stall).
WAITING = frozenset(
    {"wait", "select", "poll", "sleep", "_wait_for_tstate_lock", "get", "recv", "recv_multipart", "accept", "epoll"}
)


def stack_of(frame: FrameType | None, depth: int = DEPTH) -> str:
    """``outer < ... < inner`` as ``function (dir/file.py:line)``, the ``depth`` innermost frames. The innermost has
    no line (it moves while the function runs), so the samples of one call add up under one stack."""
    names = []
    while frame is not None and len(names) < depth:
        code = frame.f_code
        path = "/".join(code.co_filename.rsplit("/", 2)[-2:])
        names.append(f"{code.co_name} ({path}:{frame.f_lineno})" if names else f"{code.co_name} ({path})")
        frame = frame.f_back
    return " < ".join(reversed(names))


class LoopStallSampler:
    """Started by the loop-lag meter on the loop's thread; ``beat()`` on every tick, ``take()`` once per window."""

    def __init__(self, threshold_s: float, poll_s: float = POLL_S) -> None:
        self.threshold_s = threshold_s
        self.poll_s = poll_s
        self.loop_thread = threading.get_ident()
        self.last_beat = time.perf_counter()
        self.loop_stacks: Counter[str] = Counter()
        self.other_stacks: Counter[str] = Counter()
        self.stalls = 0
        self._in_stall = False
        self._where: dict[int, tuple[int, int]] = {}  # thread -> (innermost frame, instruction) at the last sample
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="kani-loop-stalls", daemon=True)
        self._thread.start()

    def beat(self) -> None:
        self.last_beat = time.perf_counter()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=1.0)

    def _watch(self) -> None:
        while not self._stop.wait(self.poll_s):
            stalled = time.perf_counter() - self.last_beat >= self.threshold_s
            if stalled:
                self._sample()
            self._in_stall = stalled

    def _sample(self) -> None:
        if not self._in_stall:
            self.stalls += 1
            self._where = {}  # a stall's first sample only places the other threads
        mine = threading.get_ident()
        where = {}
        for ident, frame in sys._current_frames().items():
            if ident == self.loop_thread:
                self.loop_stacks[stack_of(frame)] += 1
            elif ident != mine:
                where[ident] = (id(frame), frame.f_lasti)
                moved = ident in self._where and self._where[ident] != where[ident]
                if moved and frame.f_code.co_name not in WAITING:
                    self.other_stacks[stack_of(frame, 4)] += 1
        self._where = where

    def take(self, top: int = 3) -> tuple[int, float, list[tuple[float, str]], list[tuple[float, str]]]:
        """The window's stalls, their sampled seconds, and the ``top`` loop and other-thread stacks (seconds, stack);
        the next window starts empty."""
        loop, others, stalls = self.loop_stacks, self.other_stacks, self.stalls
        self.loop_stacks, self.other_stacks, self.stalls = Counter(), Counter(), 0
        seconds = self.poll_s * sum(loop.values())
        return (
            stalls,
            seconds,
            [(self.poll_s * n, s) for s, n in loop.most_common(top)],
            [(self.poll_s * n, s) for s, n in others.most_common(top)],
        )
