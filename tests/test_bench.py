"""`vllm-omni-kani bench` against the real CPU server: one tiny level, and a report a reader can use.

Numbers on a 2-core box say nothing about speed (targets live in docs/BENCHMARKS.md); this checks that the same
code that measures the GPU runs end to end and writes every field, table and plot it promises.
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from tests.server_utils import REPO_ROOT
from vllm_omni_kani.benchmarks import bench_tts, report
from vllm_omni_kani.benchmarks.bench_tts import SAMPLES_PER_FRAME, percentile
from vllm_omni_kani.cli import main
from vllm_omni_kani.model_executor.models.kani_tts.configuration import SAMPLE_RATE

# The serving tests' server (same checkpoint and YAML), so the session starts it once.
DEPLOY = "kani_tts_cpu.yaml"
FRAMES = 8
LEVEL_KEYS = {
    "concurrency",
    "requests",
    "ok",
    "errors",
    "connections",
    "wall_s",
    "ttfa_ms_p50",
    "ttfa_ms_p90",
    "ttfa_ms_p95",
    "rtf_p50",
    "rtf_p95",
    "audio_s_total",
    "realtime_x",
    "frames_per_s",
    "stalled_share",
    "stall_ms_p50",
    "stall_ms_p95",
    "stall_ms_max",
}

pytestmark = pytest.mark.server


def test_requests_per_level():
    assert bench_tts.requests_per_level(256, 3, 8, 0.0) == 3  # --requests wins
    assert bench_tts.requests_per_level(256, 0, 8, 0.0) == 2048
    assert bench_tts.requests_per_level(256, 0, 0, 0.0) == 512
    assert bench_tts.requests_per_level(64, 0, 0, 2.0) == 256
    assert bench_tts.requests_per_level(2, 0, 0, 0.0) == 8


def test_percentile_interpolates():
    assert percentile([], 50) is None
    assert percentile([4.0, 1.0, 3.0, 2.0], 50) == 2.5
    assert percentile([1.0, 2.0], 95) == pytest.approx(1.95)


def test_one_tiny_level_against_the_cpu_server(omni_server, tiny_parallel, tmp_path):
    server = omni_server(tiny_parallel, DEPLOY)
    argv = ["bench", "--url", server.base_url, "--model", server.model, "--label", "cpu", "--concurrency", "2"]
    # One wave: one request per stream, each opening its connection inside the level's clock (as before preconnect).
    argv += ["--waves", "1", "--max-new-frames", str(FRAMES), "--warmup", "0", "--out", str(tmp_path)]
    assert main([*argv, "--no-preconnect"]) == 0

    result = json.loads((tmp_path / "cpu.json").read_text())
    assert result["kind"] == "serve" and result["config"]["tokens_per_frame"] == 1
    assert result["meta"]["device"] and "vllm-omni" in result["meta"]["versions"]
    (level,) = result["levels"]
    assert set(level) >= LEVEL_KEYS
    assert (level["concurrency"], level["requests"], level["ok"], level["errors"]) == (2, 2, 2, 0)
    assert result["config"]["preconnect"] is False and (level["preconnected"], level["connections"]) == (0, 2)
    # Random weights may end speech early, never late: at most FRAMES frames of PCM per request.
    assert 0 < level["audio_s_total"] <= 2 * FRAMES * SAMPLES_PER_FRAME / SAMPLE_RATE
    assert 0 < level["ttfa_ms_p50"] <= level["ttfa_ms_p90"] <= level["ttfa_ms_p95"]
    assert level["rtf_p50"] > 0 and level["realtime_x"] > 0 and level["frames_per_s"] > 0
    # A player started at each first byte (playback.py): its stalls are as long as the request lasted at most.
    assert 0.0 <= level["stalled_share"] <= 1.0
    assert 0.0 <= level["stall_ms_p50"] <= level["stall_ms_p95"] <= level["stall_ms_max"] <= 1000.0 * level["wall_s"]
    assert (level["stall_ms_max"] > 0) == (level["stalled_share"] > 0)
    # The client's own collections over the level, per generation (its heap was frozen before it).
    assert [set(g) for g in level["client_gc"]] == [{"count", "total_ms", "max_ms"}] * 3
    assert all(g["count"] >= 0 and 0 <= g["max_ms"] <= g["total_ms"] for g in level["client_gc"])

    markdown = (tmp_path / report.REPORT_MD).read_text()
    assert "| concurrency |" in markdown and "\n| 2 | 2 | 0 |" in markdown
    assert "| stalled | stall p95 ms |" in markdown
    assert (tmp_path / report.REPORT_PNG).stat().st_size > 1000
    assert f"]({report.REPORT_PNG})" in markdown


def test_traced_requests_split_their_ttfa_into_segments_that_add_up(omni_server, tiny_parallel, tmp_path, monkeypatch):
    """``bench --trace`` against the real server: every request's id and client times join the server's
    ``[KaniTTFA]`` points (one clock on one host), in order, and the segments add up to what the client saw."""
    server = omni_server(tiny_parallel, DEPLOY)
    before = len(server.log_text())
    argv = ["bench", "--url", server.base_url, "--model", server.model, "--label", "traced", "--concurrency", "2"]
    argv += ["--requests", "3", "--max-new-frames", str(FRAMES), "--warmup", "0", "--out", str(tmp_path), "--trace"]
    assert main(argv) == 0
    (level,) = json.loads((tmp_path / "traced.json").read_text())["levels"]
    assert level["ok"] == 3 and len(level["trace"]) == 3
    # Each request's playback (playback.py): where its first gap began, if it had one, within its audio.
    for t in level["trace"]:
        assert t["stall_s"] >= 0 and (t["first_stall_at_s"] is None) == (t["stalls"] == 0)
        assert t["first_stall_at_s"] is None or 0 < t["first_stall_at_s"] < FRAMES * SAMPLES_PER_FRAME / SAMPLE_RATE
    # Each stream opened its one connection before the level's clock (bench_tts.open_connection) and kept it alive:
    # no request opened another.
    assert level["preconnected"] == 2 and level["connections"] == 2

    monkeypatch.syspath_prepend(str(REPO_ROOT / "benchmarks"))
    import ttfa_breakdown

    # The line is logged when the response has ended on the server, which may be just after the client's last byte.
    deadline = time.monotonic() + 30
    while True:
        points = ttfa_breakdown.server_points(server.log_text()[before:].splitlines())
        if len(points) >= 3 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert {t["id"] for t in level["trace"]} <= set(points), points
    split, joined = ttfa_breakdown.segments(level["trace"], points)
    assert joined == 3
    # The client notes when it starts writing each request to its socket, which splits the way in at its edge.
    assert all(t["sent"] <= t["writing"] <= points[t["id"]]["arrived"] for t in level["trace"])
    # The server notes when it had each request's whole body, between admission and the handler.
    assert all(
        points[t["id"]]["arrived"] <= points[t["id"]]["body"] <= points[t["id"]]["handler"] for t in level["trace"]
    )
    # The orchestrator's handoff of the first audio is noted (output_handoff) and lies between submission and the
    # handler seeing it.
    assert list(split) == [name for name, _, _ in ttfa_breakdown.SEGMENTS]
    assert all(
        points[t["id"]]["submitted"]
        <= points[t["id"]]["queued"]
        <= points[t["id"]]["orchestrated"]
        <= points[t["id"]]["dequeued"]
        for t in level["trace"]
    )
    assert 0 < level["client_cpu_share"] < 1.5
    # The client's own collections over the level, printed beside the segments.
    full = level["client_gc"][2]
    assert ttfa_breakdown.client_collections(level).startswith(
        f"the client's collections over the level: {full['count']} full"
    )
    assert ttfa_breakdown.client_collections({k: v for k, v in level.items() if k != "client_gc"}) is None
    log_resolution_ms = 1e-3  # the log prints microseconds
    for name, values in split.items():
        assert min(values) >= -log_resolution_ms, (name, values)
    for i, trace in enumerate(level["trace"]):
        total = sum(values[i] for values in split.values())
        assert total == pytest.approx((trace["first_byte"] - trace["sent"]) * 1000.0, abs=4 * log_resolution_ms)
    # Per wave: the first `concurrency` requests by send time, then the rest.
    first, later = ttfa_breakdown.wave_segments(level["trace"], points, 2)
    assert (first[1], later[1]) == (2, 1) and list(first[0]) == list(split)
    # Results of a client that did not note it: one segment from sending to admission, the rest the same.
    unsplit, joined = ttfa_breakdown.segments([{**t, "writing": None} for t in level["trace"]], points)
    assert joined == 3 and list(unsplit) == [
        name for name, _, _ in (ttfa_breakdown.UNSPLIT, *ttfa_breakdown.SEGMENTS[2:])
    ]
    # Results of a server that did not note the handoff: one segment from submission to first audio.
    without = {rid: {k: v for k, v in p.items() if k not in ("orchestrated", "dequeued")} for rid, p in points.items()}
    engine, joined = ttfa_breakdown.segments(level["trace"], without)
    handoff = ttfa_breakdown.SEGMENTS[ttfa_breakdown._HANDOFF]
    assert joined == 3 and list(engine) == [
        name
        for name, _, _ in (*ttfa_breakdown.SEGMENTS[:5], ttfa_breakdown.ENGINE_UNSPLIT, *ttfa_breakdown.SEGMENTS[9:])
    ]
    assert engine[ttfa_breakdown.ENGINE_UNSPLIT[0]] == pytest.approx(
        [sum(split[name][i] for name, _, _ in handoff) for i in range(3)], abs=4 * log_resolution_ms
    )
    # Results of a server that noted the handoff but not the engine request's queueing: one segment up to the put.
    unqueued = {rid: {k: v for k, v in p.items() if k != "queued"} for rid, p in points.items()}
    engine, joined = ttfa_breakdown.segments(level["trace"], unqueued)
    assert joined == 3 and list(engine) == [
        name
        for name, _, _ in (*ttfa_breakdown.SEGMENTS[:5], ttfa_breakdown.QUEUE_UNSPLIT, *ttfa_breakdown.SEGMENTS[7:])
    ]
    # Results of a server that did not note the body: one segment from admission to the handler.
    bodiless = {rid: {k: v for k, v in p.items() if k != "body"} for rid, p in points.items()}
    way_in, joined = ttfa_breakdown.segments(level["trace"], bodiless)
    assert joined == 3 and list(way_in) == [
        name for name, _, _ in (*ttfa_breakdown.SEGMENTS[:2], ttfa_breakdown.BODY_UNSPLIT, *ttfa_breakdown.SEGMENTS[4:])
    ]
    # Each stage's scheduler logged its first output (KANI_TRACE_FIRST_OUTPUTS, on for test servers); joined by the
    # request's id, the points follow the request through both stages on the same clock, and the segments between
    # "queued" and "orchestrated" add up to that span.
    import first_outputs

    stages = first_outputs.first_output_points(server.log_text()[before:].splitlines())
    for t in level["trace"]:
        p, s = points[t["id"]], stages[t["id"]]
        assert p["queued"] <= s["s0_added"] <= s["s0_scheduled"] <= s["s0_output"] <= p["orchestrated"], (p, s)
        # The codec engine's output thread took the message with the first audio before the orchestrator's read of it
        # ended, and came back for the next one (its "sent") after taking it; "sent" is noted when the thread returns
        # from the send, which the other process's read can beat (CI saw it 0.3 ms after the read). Stage 0 likewise.
        assert s["s1_added"] <= s["s1_scheduled"] <= s["s1_output"] <= s["s1_taken"] <= s["s1_sent"], (p, s)
        assert s["s1_taken"] <= p["read"] <= p["orchestrated"], (p, s)
        assert s["s0_output"] <= s["s0_taken"] <= s["s0_sent"] <= s["s1_scheduled"], s
    engines, joined = first_outputs.engine_segments(level["trace"], points, stages)
    assert joined == 3 and list(engines) == [name for name, _, _ in first_outputs.SEGMENTS]

    def in_one(whole: dict, segment: tuple, parts: tuple) -> None:
        assert whole[segment[0]] == pytest.approx(
            [sum(engines[name][i] for name, _, _ in parts) for i in range(3)], abs=1e-6
        )

    # A server that did not note the output thread (older results): the codec's first audio to the read in one.
    unsent = {rid: {k: v for k, v in p.items() if k not in ("s1_taken", "s1_sent")} for rid, p in stages.items()}
    whole, joined = first_outputs.engine_segments(level["trace"], points, unsent)
    chain = (*first_outputs.SEGMENTS[:-4], first_outputs.UNSENT, first_outputs.SEGMENTS[-1])
    assert joined == 3 and list(whole) == [name for name, _, _ in chain]
    in_one(whole, first_outputs.UNSENT, first_outputs.SEGMENTS[-4:-1])
    # Nor the read: the codec's first audio to the put in one segment.
    unread = {rid: {k: v for k, v in p.items() if k != "read"} for rid, p in points.items()}
    whole, joined = first_outputs.engine_segments(level["trace"], unread, unsent)
    assert joined == 3 and list(whole) == [name for name, _, _ in (*first_outputs.SEGMENTS[:-4], first_outputs.UNREAD)]
    in_one(whole, first_outputs.UNREAD, first_outputs.SEGMENTS[-4:])
    for i, t in enumerate(level["trace"]):
        span = (points[t["id"]]["orchestrated"] - points[t["id"]]["queued"]) * 1000.0
        assert sum(values[i] for values in engines.values()) == pytest.approx(span, abs=4 * log_resolution_ms)
    # The engine request is named after the client's id, so vLLM-Omni's own per-request lines join too.
    assert all(f"speech-{t['id']}" in server.log_text() for t in level["trace"])
    # The first wave's way in (first_wave.py): its two requests, in the order of the points they passed.
    import first_wave

    row = first_wave.wave_entry(level["trace"], points, stages, 2)
    assert row["requests"] == 2
    assert 0 <= row["first at the handler (ms)"] <= row["last at the handler (ms)"]
    assert row["first at the handler (ms)"] <= row["first Stage-0 admission (ms)"] <= row["last Stage-0 admission (ms)"]
    waited = row["queued -> Stage 0 has it (ms)"]
    assert 0 <= waited["p50"] <= waited["p95"]
    firsts = sorted(level["trace"], key=lambda t: t["sent"])[:2]
    assert row["TTFA (ms)"]["p95"] <= max(t["first_byte"] - t["sent"] for t in firsts) * 1000.0 + 0.1
    assert first_wave.wave_entry(level["trace"], {}, stages, 2) == {"requests": 0}
    # Where the streams' time went (stream_time.py): three requests on two streams, so one stream fell idle once the
    # third was taken; before and after the first audio split the requests' time in flight.
    import stream_time

    spent = stream_time.stream_time(level)
    assert (spent["concurrency"], spent["requests"]) == (2, 3)
    assert 0 < spent["busy"] < 1 and spent["drain (s)"] > 0
    assert 0 < spent["before first audio"] < 1
    assert spent["before first audio"] + spent["after first audio"] == pytest.approx(1.0, abs=2e-3)
    # Where playback ran dry (stalls.py): the level's three requests, the stalled ones' first gaps within their frames.
    import stalls

    row = stalls.stall_row(level["trace"])
    stalled = [t for t in level["trace"] if t["stalls"] > 0]
    assert row["requests"] == 3 and row["stalled"] == round(len(stalled) / 3, 3)
    assert sum(row["first gap after frame"].values()) == len(stalled)
    assert all(0 < frame <= FRAMES for frame in row["first gap after frame"])
    assert row["mean stall (ms)"] == pytest.approx(sum(t["stall_s"] for t in level["trace"]) / 3 * 1000.0, abs=0.1)
    assert stalls.stall_row([]) == {"requests": 0}
    assert spent["frames/s if always busy"] >= spent["frames/s"] > 0
    assert stream_time.stream_time({k: v for k, v in level.items() if k != "trace"}) == {}


def test_sleep_until_never_returns_before_its_deadline():
    """A stream's stagger is a lower bound: each return comes at or after its deadline on ``perf_counter``'s clock,
    however the event loop's timer rounds, and a deadline already past returns without sleeping."""

    async def run() -> list[tuple[float, float]]:
        seen = []
        for delay in (0.0005, 0.001, 0.003, 0.02, -1.0):
            deadline = time.perf_counter() + delay
            await bench_tts.sleep_until(deadline)
            seen.append((deadline, time.perf_counter()))
        return seen

    for deadline, woke in asyncio.run(run()):
        assert woke >= deadline


def test_staggered_streams_send_their_first_requests_apart(omni_server, tiny_parallel, tmp_path):
    """``--stagger-s``: stream k of N sends its first request k·S/N into the level, each stream sends 4 requests,
    and the row's "later" TTFA covers every request but each stream's first."""
    server = omni_server(tiny_parallel, DEPLOY)
    argv = ["bench", "--url", server.base_url, "--model", server.model, "--label", "staggered", "--concurrency", "2"]
    argv += ["--max-new-frames", str(FRAMES), "--warmup", "0", "--out", str(tmp_path), "--trace", "--stagger-s", "1"]
    assert main(argv) == 0
    (level,) = json.loads((tmp_path / "staggered.json").read_text())["levels"]
    assert (level["requests"], level["ok"], level["stagger_s"]) == (8, 8, 1.0)
    assert level["requests_later"] == 6
    assert 0 < level["ttfa_ms_p50_later"] <= level["ttfa_ms_p95_later"]
    firsts = sorted(t["sent"] for t in level["trace"] if t["first_of_stream"])
    assert len(firsts) == 2 and firsts[1] - firsts[0] >= 0.5
    # The report's row says how the streams started and gives the later requests' TTFA.
    later = f"| 1.0 | {level['ttfa_ms_p50_later']:,.0f} / {level['ttfa_ms_p95_later']:,.0f} |"
    assert "| streams start over s | later TTFA p50 / p95 ms |" in (tmp_path / report.REPORT_MD).read_text()
    assert later in (tmp_path / report.REPORT_MD).read_text()
