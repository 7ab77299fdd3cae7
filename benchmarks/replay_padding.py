"""How much padding the codec's graph replays decode, per replay plan, from a served chunk trace.

    python3 benchmarks/replay_padding.py results/h200x2-stateful/trace-shipped-chunks.log.gz [--json OUT]

A server run with ``KANI_TRACE_CHUNKS=1`` logs every codec step's windows (``kani trace: stage1 decode
windows=[(new, left), ...]``). Each step's rows are grouped by frame bucket as ``CodecStreams`` groups them, then
split into replays by each plan of ``StreamingGraphs`` with the shipped buckets: ``round_up`` (full slices of the
largest bucket, the rest rounded up) and ``cheapest`` (``replay_plan.py``, here from modelled costs: frames plus a
fixed part per replay). Per plan: frames decoded against frames real, the replay count, and the modelled cost.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
from collections import Counter
from pathlib import Path

from audio_vs_frames import log_lines

from vllm_omni_kani.model_executor.models.kani_tts.nanocodec.graphs import (
    DEFAULT_BATCH_BUCKETS,
    replay_cover,
    round_up,
)
from vllm_omni_kani.model_executor.models.kani_tts.nanocodec.replay_plan import REPLAY_OVERHEAD_FRAMES

_STEP = re.compile(r"kani trace: stage1 decode windows=(\[.*?\])")
# The shipped frame buckets (codec_stage._graph_buckets for the shipped chunking: every 8 frames to 64, plus 3).
FRAME_BUCKETS = [3, 8, 16, 24, 32, 40, 48, 56, 64]


def steps(lines: list[str]) -> list[list[int]]:
    """New frames of every row of every traced codec step."""
    return [[new for new, _ in ast.literal_eval(m.group(1))] for line in lines if (m := _STEP.search(line))]


def plan_totals(trace: list[list[int]], plan: str, batch_buckets: list[int]) -> dict[str, float]:
    real = decoded = replays = 0
    for rows in trace:
        groups = Counter(round_up(new, FRAME_BUCKETS) for new in rows)
        real += sum(rows)
        for frames, count in groups.items():
            cover = replay_cover(count, frames, plan, batch_buckets)  # no times: the cheapest plan models them
            decoded += sum(cover) * frames
            replays += len(cover)
    return {
        "plan": plan,
        "real_frames": real,
        "decoded_frames": decoded,
        "decoded_per_real": round(decoded / real, 3),
        "replays": replays,
        "modelled_cost_frames": decoded + REPLAY_OVERHEAD_FRAMES * replays,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trace", type=Path)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    trace = steps(log_lines(args.trace))
    rows = [plan_totals(trace, plan, list(DEFAULT_BATCH_BUCKETS)) for plan in ("round_up", "cheapest")]
    print(f"{len(trace)} codec steps, {rows[0]['real_frames']:,} real frames")
    print("| plan | decoded / real frames | replays | modelled cost (frames) |\n|---|---|---|---|")
    for r in rows:
        print(f"| {r['plan']} | {r['decoded_per_real']:.3f} | {r['replays']} | {r['modelled_cost_frames']:,} |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
