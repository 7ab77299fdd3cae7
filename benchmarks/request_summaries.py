"""What logging one finished request's stats costs the API server: vLLM-Omni's tables against one line.

    python3 benchmarks/request_summaries.py [--requests 512] [--rounds 3] [--json OUT]

Builds vLLM-Omni ``OrchestratorAggregator``s as a served 250-frame Kani request leaves them (two stages, per-output
latency lists, one transfer) and logs each the two ways, ``build_and_log_summary`` (the tables) and
``request_stats.log_request_stats`` (one ``[KaniRequestStats]`` line), through a logging handler into memory. Both
run on the API server's summary thread holding the GIL, so their time per request is what a wave of requests ending
together takes from the event loop.
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import time
from pathlib import Path

FRAMES = 250
SAMPLES_PER_FRAME = 1764


def aggregator(rid: str):
    """vLLM-Omni's stats of one served 250-frame request ``rid``: two stages, per-output latency lists, a transfer."""
    from vllm_omni.metrics.stats import OrchestratorAggregator, RequestE2EStats, StageRequestStats, TransferEdgeStats

    agg = OrchestratorAggregator(2, True, time.time(), 1)
    agg.stage_events[rid] = [
        StageRequestStats(
            0, 64, 80, FRAMES + 1, 3300.0, 0, 0.0, 0.0, None, stage_id=stage, request_id=rid,
            audio_generated_frames=FRAMES * SAMPLES_PER_FRAME if stage else 0, vllm_ttft_ms=60.0 + stage,
            vllm_itls_ms=[12.0] * FRAMES, inter_output_latencies_ms=[400.0] * 6, serving_time_to_first_output_ms=130.0,
        )
        for stage in (0, 1)
    ]  # fmt: skip
    agg.e2e_events.append(RequestE2EStats(rid, 3500.0, FRAMES + 1, 3.0, 1000))
    agg.transfer_events[(0, 1, rid)] = TransferEdgeStats(0, 1, rid, 4096, 0.5)
    return agg


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    from vllm_omni.metrics.stats import OrchestratorAggregator

    from vllm_omni_kani.entrypoints.request_stats import log_request_stats

    sink = logging.StreamHandler(io.StringIO())
    sink.setFormatter(logging.Formatter("%(levelname)s %(asctime)s [%(filename)s:%(lineno)d] %(message)s"))
    for name in ("vllm_omni", "vllm_omni_kani"):
        log = logging.getLogger(name)
        log.handlers[:], log.propagate = [sink], False
        log.setLevel(logging.INFO)
    ways = (("tables", OrchestratorAggregator.build_and_log_summary), ("one line", log_request_stats))
    rows = []
    for round_ in range(args.rounds):
        for label, log_one in ways:
            aggs = [aggregator(f"speech-{i:032x}") for i in range(args.requests)]
            start = time.perf_counter()
            for agg in aggs:
                log_one(agg)
            seconds = time.perf_counter() - start
            text = sink.stream.getvalue()
            sink.stream.seek(0)
            sink.stream.truncate()
            rows.append({
                "round": round_, "way": label, "ms_per_request": round(1e3 * seconds / args.requests, 3),
                "lines_per_request": round(text.count("\n") / args.requests, 1),
                "bytes_per_request": round(len(text) / args.requests),
            })  # fmt: skip
            print(json.dumps(rows[-1]))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"requests": args.requests, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
