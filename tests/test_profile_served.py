"""``benchmarks/gpu/profile_served.py`` splits a py-spy profile by thread: here a real ``py-spy record --threads
--gil -f raw`` of a script whose main thread and a thread named ``orchestrator`` both spin for 2 s
(``tests/data/py-spy/threads-gil.txt``)."""

from __future__ import annotations

import importlib.util

from tests.conftest import REPO_ROOT

DATA = REPO_ROOT / "tests" / "data" / "py-spy" / "threads-gil.txt"


def _profile_served():
    spec = importlib.util.spec_from_file_location("profile_served", REPO_ROOT / "benchmarks/gpu/profile_served.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_samples_are_counted_per_thread_under_its_name():
    shares = dict(_profile_served().thread_shares(DATA))
    raw_total = sum(int(line.rpartition(" ")[2]) for line in DATA.read_text().splitlines())
    assert set(shares) == {"MainThread (23879)", "orchestrator (23922)"}
    # The main thread's samples from before it had a name count as its own.
    assert sum(shares.values()) == raw_total
    assert shares["MainThread (23879)"] > 0 and shares["orchestrator (23922)"] > 0
