"""``benchmarks/bench_waves.py`` splits a committed served sweep (thirteenth set, H200, shipped file) into its waves."""

from __future__ import annotations

import json

from tests.conftest import REPO_ROOT, benchmark_script, run_benchmark_script

RUN = REPO_ROOT / "benchmarks" / "results" / "h200-thirteenth" / "instance-1" / "1-served" / "shipped-f250.json"
bench_waves = benchmark_script("bench_waves")


def test_each_level_splits_into_waves_of_its_streams():
    levels = json.loads(RUN.read_text())["levels"]
    for level in levels:
        rows = bench_waves.waves(level)
        assert [r["requests"] for r in rows] == [level["concurrency"]] * (level["requests"] // level["concurrency"])
        assert rows[0]["sent_from_s"] == 0.0 and rows[0]["sent_to_s"] < 0.1  # a level starts all its streams at once
        # A stream's next request leaves when its last one ended: wave 1 starts as wave 0 ends.
        assert rows[1]["sent_from_s"] == rows[0]["ended_from_s"]
        for row in rows:
            assert 0 < row["ttfa_p50_s"] <= row["ttfa_p95_s"] and row["streaming_p50_s"] > 0
    documented = bench_waves.waves(levels[1])[0]  # docs/BENCHMARKS.md, thirteenth set: 256 streams, wave 0
    assert (documented["ttfa_p50_s"], documented["streaming_p50_s"], documented["ended_to_s"]) == (1.514, 8.951, 10.75)


def test_the_script_prints_one_table_row_per_wave():
    out = run_benchmark_script("bench_waves", RUN)
    assert out.count("\n| 64 |") == 2 and out.count("\n| 256 |") == 2, out


def test_a_request_without_audio_keeps_its_wave_and_is_counted_apart():
    """Thirtieth set, run 1: one request of the 256-stream level ended with HTTP 200 and no audio (first_byte null)."""
    run = REPO_ROOT / "benchmarks" / "results" / "h200-thirtieth" / "1-shipped" / "shipped-1-f250.json"
    level = json.loads(run.read_text())["levels"][1]
    silent = [r["id"] for r in level["trace"] if r["first_byte"] is None]
    assert len(silent) == 1
    rows = bench_waves.waves(level)
    assert [r["requests"] for r in rows] == [256] * 8 and sum(r["no_audio"] for r in rows) == 1
    for row in rows:
        assert 0 < row["ttfa_p50_s"] <= row["ttfa_p95_s"] and row["streaming_p50_s"] > 0
