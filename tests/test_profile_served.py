"""``benchmarks/gpu/profile_served.py`` splits a py-spy profile by thread: here a real ``py-spy record --threads
--gil -f raw`` of a script whose main thread and a thread named ``orchestrator`` both spin for 2 s
(``tests/data/py-spy/threads-gil.txt``)."""

from __future__ import annotations

import argparse
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


def test_enough_waves_keep_fewer_streams_loaded_past_the_window():
    """At 64 streams a stream got ~85 frames/s on an H200 and a fixed 50 left the window's last ~4 s idle: the
    default rate grows as the streams shrink, so the waves sent outlast delay + window at that rate."""
    module = _profile_served()
    for streams, served_fps_per_stream in ((256, 35.0), (64, 86.0), (16, 150.0)):
        args = argparse.Namespace(frames=250, streams=streams, delay=8.0, seconds=15.0, stream_fps=0.0)
        waves = module.load_waves(args)
        assert (waves - 1) * 250 / served_fps_per_stream >= args.delay + args.seconds, (streams, waves)
    assert module.default_stream_fps(256) == 50.0 and module.default_stream_fps(1) == module.MAX_STREAM_FPS
    given = argparse.Namespace(frames=250, streams=64, delay=20.0, seconds=20.0, stream_fps=50.0)
    assert module.load_waves(given) == 9  # ceil(40 / 5) + 1
