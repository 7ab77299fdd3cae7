"""One ``[KaniRequestStats]`` line per finished request (``entrypoints/request_stats.py``): the fields of vLLM-Omni's
tables, read back by the benchmark tools the same way from either form."""

from __future__ import annotations

import logging

from tests.conftest import benchmark_script
from vllm_omni_kani.entrypoints.request_stats import TAG, log_request_stats, parse, request_stats

summaries = benchmark_script("request_summaries")
aggregator = summaries.aggregator  # a served request's stats, as the benchmark times them
FRAMES, SAMPLES_PER_FRAME = summaries.FRAMES, summaries.SAMPLES_PER_FRAME


def test_one_line_carries_the_tables_fields_and_parses_back(caplog):
    caplog.set_level(logging.INFO, logger="vllm_omni_kani.entrypoints.request_stats")
    log_request_stats(aggregator("speech-abc"))
    (line,) = [m for m in caplog.messages if TAG in m]
    rid, record = parse(f"(APIServer pid=1) INFO 11-25 21:43:43 [request_stats.py:66] {line}")
    assert rid == "speech-abc" and record == request_stats(aggregator("speech-abc"))["speech-abc"]
    stage0, stage1 = record["stages"]["0"], record["stages"]["1"]
    assert stage0["num_tokens_out"] == FRAMES + 1 and stage1["audio_generated_frames"] == FRAMES * SAMPLES_PER_FRAME
    assert (stage0["vllm_ttft_ms"], stage1["vllm_ttft_ms"]) == (60.0, 61.0)
    # Zero fields and the per-output latency lists stay out; their means would stay.
    assert "audio_generated_frames" not in stage0 and "vllm_itls_ms" not in stage0
    assert "inter_output_latencies_ms" not in stage1
    assert record["e2e"]["e2e_total_ms"] == 3500.0 and record["transfers"]["0->1"]["tx_time_ms"] == 0.5


def test_other_lines_and_cut_lines_are_not_records():
    assert parse("request summaries: one [KaniRequestStats] line per request, logged on a background thread") is None
    assert parse('[KaniRequestStats] request_id=speech-abc {"stages": {"0": {"num_tok') is None
    assert parse("[KaniRequestStats] request_id=speech-abc {not json}") is None


def test_audio_vs_frames_reads_the_line_and_the_tables_alike(tmp_path, caplog):
    audio_vs_frames = benchmark_script("audio_vs_frames")
    caplog.set_level(logging.INFO)
    log_request_stats(aggregator("speech-line"))
    aggregator("speech-table").build_and_log_summary()
    log = tmp_path / "server.log"
    log.write_text("\n".join(r.getMessage() for r in caplog.records) + "\n")
    found = audio_vs_frames.requests(log)
    assert set(found) == {"speech-line", "speech-table"}, list(found)
    for fields in found.values():
        assert audio_vs_frames.classify(fields, 1) == "whole, ended by itself", fields  # 251 tokens, 250 frames
        assert float(fields["vllm_ttft_ms"][1].replace(",", "")) == 61.0


def test_audio_vs_frames_counts_a_dropped_stage0_output_apart(tmp_path):
    """When Stage 1 finishes before the orchestrator takes Stage 0's last output, the orchestrator drops that output
    and the request's record has no Stage-0 row: reported as not checked, not as a cut table. Lines from a served
    run's log (twenty-eighth set), the orchestrator's list of known requests shortened."""
    audio_vs_frames = benchmark_script("audio_vs_frames")
    rid = "speech-bench-280-b30c3ff0a11f-9bb66008"
    record = (
        '{"e2e":{"e2e_total_ms":458.5},"stages":{"1":{"batch_id":459,"batch_size":1,"audio_generated_frames":51156,'
        '"audio_sample_rate":22050,"audio_duration_s":2.32,"output_unit_type":"audio"}},"transfers":{"0->1":{}}}'
    )
    lines = [
        f"(APIServer pid=1692) WARNING 11-27 07:58:10 [orchestrator.py:1047] [Orchestrator] Dropping output for unknown"
        f" req {rid} at stage-0 (known reqs: ['speech-bench-264-16fc384c27fd-9761f413'])",
        f"(APIServer pid=1692) INFO 11-27 07:58:10 [request_stats.py:65] [KaniRequestStats] request_id={rid} {record}",
        "(APIServer pid=1692) INFO 11-27 07:58:10 [request_stats.py:65] [KaniRequestStats] request_id=speech-cut "
        + record,
    ]
    log = tmp_path / "server.log"
    log.write_text("\n".join(lines) + "\n")
    found, dropped = audio_vs_frames.requests(log), audio_vs_frames.stage0_dropped(log)
    assert dropped == {rid}
    assert audio_vs_frames.classify(found[rid], 1, rid in dropped) == audio_vs_frames.STAGE0_DROPPED
    assert audio_vs_frames.classify(found["speech-cut"], 1, "speech-cut" in dropped) == "table cut by other log lines"


def test_a_dropped_stage0_output_is_checked_with_stage0_s_own_count(tmp_path):
    """With Stage 0's ``[KaniStage0Finished]`` lines a request whose last Stage-0 output was dropped is checked with
    the engine's count (29 frames of audio: 29 tokens whole, 30 ended by itself, 33 a mismatch), and where both counts
    exist a disagreement is reported."""
    audio_vs_frames = benchmark_script("audio_vs_frames")
    record = (
        '{"stages":{"0":{"num_tokens_out":12},"1":{"audio_generated_frames":%d}}}',
        '{"stages":{"1":{"audio_generated_frames":%d}}}',
    )
    lines = []
    for rid, tokens, stats in (
        ("speech-a", 29, record[1] % (29 * 1764)),
        ("speech-b", 30, record[1] % (29 * 1764)),
        ("speech-c", 33, record[1] % (29 * 1764)),
        ("speech-d", 12, record[0] % (12 * 1764)),
        ("speech-e", 13, record[0] % (12 * 1764)),
    ):
        if '"0"' not in stats:
            lines.append(f"WARNING [Orchestrator] Dropping output for unknown req {rid} at stage-0")
        lines.append(f"INFO [finished_tokens.py:40] [KaniStage0Finished] request_id={rid} tokens={tokens} status=X")
        lines.append(f"INFO [request_stats.py:65] [KaniRequestStats] request_id={rid} {stats}")
    log = tmp_path / "server.log"
    log.write_text("\n".join(lines) + "\n")
    found, dropped = audio_vs_frames.requests(log), audio_vs_frames.stage0_dropped(log)
    finished = audio_vs_frames.stage0_finished(log)
    assert finished == {"speech-a": 29, "speech-b": 30, "speech-c": 33, "speech-d": 12, "speech-e": 13}
    verdicts = {rid: audio_vs_frames.check(found[rid], 1, rid in dropped, finished[rid]) for rid in found}
    checked = audio_vs_frames.CHECKED_WITH_STAGE0_COUNT
    assert verdicts["speech-a"] == ["whole", checked]
    assert verdicts["speech-b"] == ["whole, ended by itself", checked]
    assert verdicts["speech-c"][0].startswith("mismatch") and verdicts["speech-c"][1] == checked
    assert verdicts["speech-d"] == ["whole"]
    assert verdicts["speech-e"] == ["whole", audio_vs_frames.COUNTS_DISAGREE]
