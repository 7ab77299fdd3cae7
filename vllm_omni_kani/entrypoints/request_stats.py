"""Each finished request's stats as one log line, instead of vLLM-Omni's tables of ~34 lines.

vLLM-Omni logs, per request, an overall summary, an E2E table, an ``[OmniTiming]`` line, a stage table and a
transfer table. Served at 256 streams, waves of requests end together, and the API server's event loop, which admits
new requests, stalled for 100-700 ms at the waves' edges, sampled in ordinary per-chunk work as a thread that waits
for the GIL is (docs/BENCHMARKS.md, seventeenth set). The summary thread holds it while it formats and writes:
1.6 ms a request for the tables, 0.14 ms for one line (``benchmarks/request_summaries.py``). The same per-request
fields (the stage rows, the E2E row, the transfers; zero fields left out as the tables do, and so are the per-output
latency lists) go out as one JSON object on one line, ``[KaniRequestStats] request_id=ID {...}``, which the benchmark
tools read (``benchmarks/audio_vs_frames.py``). ``KANI_REQUEST_TABLES=1`` brings vLLM-Omni's tables back.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

logger = logging.getLogger(__name__)

TAG = "[KaniRequestStats]"
_LINE = re.compile(re.escape(TAG) + r" request_id=(\S+) (\{.*\})\s*$")


def _shown(row: dict[str, Any]) -> dict[str, Any]:
    """The fields the tables would show (they leave out 0, None and ""), less the per-output latency lists (one
    number per frame of a long request; their means stay)."""
    return {k: v for k, v in row.items() if v not in (0, None, "") and not isinstance(v, (list, tuple, dict))}


def request_stats(aggregator: Any) -> dict[str, dict[str, Any]]:
    """request id -> {"e2e": row, "stages": {stage id: row}, "transfers": {"a->b": row}} of one aggregator (vLLM-Omni's
    ``OrchestratorAggregator``), each row as the tables would show it (vLLM-Omni's field definitions)."""
    from vllm_omni.metrics.stats import E2E_FIELDS, STAGE_FIELDS, TRANSFER_FIELDS
    from vllm_omni.metrics.utils import _build_row

    ids = sorted(set(aggregator.stage_events) | {e.request_id for e in aggregator.e2e_events})
    out = {}
    for rid in ids:
        record: dict[str, Any] = {}
        e2e = next((e for e in aggregator.e2e_events if e.request_id == rid), None)
        if e2e is not None:
            record["e2e"] = _shown(_build_row(e2e, E2E_FIELDS))
        stages = {}
        for evt in aggregator.stage_events.get(rid, []):
            row = _build_row(evt, STAGE_FIELDS)
            row.pop("diffusion_metrics", None)
            stages[str(evt.stage_id)] = _shown(row)
        record["stages"] = stages
        transfers = {
            f"{e.from_stage}->{e.to_stage}": _shown(_build_row(e, TRANSFER_FIELDS))
            for e in aggregator.transfer_events.values()
            if e.request_id == rid
        }
        if transfers:
            record["transfers"] = transfers
        out[rid] = record
    return out


def log_request_stats(aggregator: Any) -> None:
    """One ``TAG`` line per request of ``aggregator`` (vLLM-Omni's ``build_and_log_summary``, compact)."""
    for rid, record in request_stats(aggregator).items():
        logger.info("%s request_id=%s %s", TAG, rid, json.dumps(record, separators=(",", ":"), default=str))


def parse(line: str) -> tuple[str, dict[str, Any]] | None:
    """``(request id, record)`` of a ``TAG`` log line; None for any other line, or one cut by other output."""
    m = _LINE.search(line)
    if m is None:
        return None
    try:
        return m[1], json.loads(m[2])
    except json.JSONDecodeError:
        return None
