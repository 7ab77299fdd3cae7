"""Does every request's audio equal the frames its Stage 0 generated? Read from a server log's per-request stats.

    python3 benchmarks/audio_vs_frames.py SERVER_LOG[.gz] [--tokens-per-frame 1|4] [--json OUT]

The API server logs one ``[KaniRequestStats]`` line per request (older logs, or ``KANI_REQUEST_TABLES=1``: vLLM-Omni's
``StageRequestStats`` table): Stage 0's ``num_tokens_out`` and Stage 1's ``audio_generated_frames`` (samples). A
request is *whole* when its audio is exactly the frames of its output tokens: ``tokens // tokens_per_frame`` frames,
less the frame-less tokens a stream that ended by itself carries (END_OF_SPEECH and what follows it: at most 3
tokens; parallel heads: 1). Anything else lost or repeated audio.

A request whose Stage 1 finished before vLLM-Omni's orchestrator took Stage 0's last output has no Stage-0 row: the
orchestrator drops that output with a warning (``Dropping output for unknown req ... at stage-0``). A server started
with ``KANI_LOG_STAGE0_FINISHED=1`` also logs Stage 0's own count of each request's output tokens as it frees the
request (``[KaniStage0Finished]``, ``core/sched/finished_tokens.py``); such a request is checked with that count (and
counted as such), and for every request with both counts the two must agree. Without the line it is counted apart,
not as a cut table.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
from collections import Counter
from pathlib import Path

from vllm_omni_kani.entrypoints import request_stats

SAMPLES_PER_FRAME = 1764
_ROW = re.compile(r"\|\s*(\w+)\s*\|\s*([^|]*?)\s*\|\s*([^|]*?)\s*\|")
# vLLM-Omni's orchestrator, for an output that arrives after its request finished.
_DROPPED = re.compile(r"Dropping output for unknown req (\S+) at stage-0\b")
STAGE0_DROPPED = "Stage 0's last output dropped by the orchestrator (Stage 1 finished first): not checked"
# Stage 0's scheduler, for each request it frees (KANI_LOG_STAGE0_FINISHED).
_FINISHED = re.compile(r"\[KaniStage0Finished\] request_id=(\S+) tokens=(\d+) status=(\S+)")
CHECKED_WITH_STAGE0_COUNT = "checked with Stage 0's own token count (its last output dropped)"
COUNTS_DISAGREE = "Stage 0's own token count differs from the orchestrator's"


def log_lines(log: Path) -> list[str]:
    """A server log's lines; ``.gz`` logs (as kept under ``benchmarks/results/``) are read through gzip."""
    data = log.read_bytes()
    return (gzip.decompress(data) if log.suffix == ".gz" else data).decode(errors="replace").splitlines()


def _from_record(record: dict) -> dict[str, tuple[str, str]]:
    """A ``[KaniRequestStats]`` record's stage rows as the tables' {field: (stage-0 text, stage-1 text)}."""
    stages = record.get("stages", {})
    first, second = stages.get("0", {}), stages.get("1", {})
    return {k: (str(first.get(k, "")), str(second.get(k, ""))) for k in {*first, *second}}


def requests(log: Path) -> dict[str, dict[str, str]]:
    """request id -> {field: (stage-0 value, stage-1 value)} of every stats line or table in the log."""
    out: dict[str, dict[str, tuple[str, str]]] = {}
    current = None
    for line in log_lines(log):
        if parsed := request_stats.parse(line):
            out[parsed[0]] = _from_record(parsed[1])
            current = None
            continue
        m = re.search(r"StageRequestStats \[request_id=([^\]]+)\]", line)
        if m:
            current = out.setdefault(m.group(1), {})
            continue
        if current is not None:
            row = _ROW.search(line)
            if row and row.group(1) != "Field":
                current[row.group(1)] = (row.group(2), row.group(3))
            elif "+---" not in line and "| Field" not in line:
                current = None
    return out


def stage0_dropped(log: Path) -> set[str]:
    """Request ids whose Stage-0 output the orchestrator dropped as unknown (its request already finished)."""
    return {m.group(1) for line in log_lines(log) if (m := _DROPPED.search(line))}


def stage0_finished(log: Path) -> dict[str, int]:
    """Request id -> output tokens, from Stage 0's ``[KaniStage0Finished]`` lines (empty without them)."""
    return {m.group(1): int(m.group(2)) for line in log_lines(log) if (m := _FINISHED.search(line))}


def check(
    stats: dict[str, tuple[str, str]], tokens_per_frame: int, dropped: bool, stage0_tokens: int | None
) -> list[str]:
    """The verdicts of one request: ``classify``'s, with Stage 0's own count standing in for a dropped row and
    compared with the orchestrator's where both exist."""
    if "num_tokens_out" not in stats and stage0_tokens is not None and "audio_generated_frames" in stats:
        filled = {**stats, "num_tokens_out": (str(stage0_tokens), "")}
        return [classify(filled, tokens_per_frame), CHECKED_WITH_STAGE0_COUNT]
    verdicts = [classify(stats, tokens_per_frame, dropped)]
    orchestrator_tokens = stats.get("num_tokens_out", ("",))[0].replace(",", "")
    if stage0_tokens is not None and orchestrator_tokens and int(float(orchestrator_tokens)) != stage0_tokens:
        verdicts.append(COUNTS_DISAGREE)
    return verdicts


def classify(stats: dict[str, tuple[str, str]], tokens_per_frame: int, stage0_output_dropped: bool = False) -> str:
    def num(text: str) -> int:
        return int(float(text.replace(",", ""))) if text else 0

    if "num_tokens_out" not in stats and stage0_output_dropped:
        return STAGE0_DROPPED
    if "num_tokens_out" not in stats or "audio_generated_frames" not in stats:
        return "table cut by other log lines"
    tokens = num(stats["num_tokens_out"][0])
    samples = num(stats.get("audio_generated_frames", ("", "0"))[1])
    if samples % SAMPLES_PER_FRAME:
        return "partial frame"
    frames = samples // SAMPLES_PER_FRAME
    if frames * tokens_per_frame == tokens:
        return "whole"
    if 0 < tokens - frames * tokens_per_frame <= 3 + (tokens_per_frame - 1):
        return "whole, ended by itself"
    return f"mismatch ({tokens} tokens, {frames} frames)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("log", type=Path)
    parser.add_argument("--tokens-per-frame", type=int, default=1)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    dropped, finished = stage0_dropped(args.log), stage0_finished(args.log)
    verdicts = {
        rid: check(s, args.tokens_per_frame, rid in dropped, finished.get(rid)) for rid, s in requests(args.log).items()
    }
    counts = Counter(v if not v.startswith("mismatch") else "mismatch" for vs in verdicts.values() for v in vs)
    summary = {"log": args.log.name, "requests": len(verdicts), **counts}
    bad = ("mismatch", "partial", COUNTS_DISAGREE)
    summary["mismatches"] = [f"{r}: {v}" for r, vs in verdicts.items() for v in vs if v.startswith(bad)][:20]
    print(json.dumps(summary, indent=1))
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1) + "\n")


if __name__ == "__main__":
    main()
