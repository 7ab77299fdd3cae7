"""``benchmarks/replay_padding.py`` on the committed served chunk trace (256 streams x 250 frames, one H200): the
cheapest replay plan decodes less padding than rounding up, at a lower modelled cost."""

from __future__ import annotations

from tests.conftest import REPO_ROOT, benchmark_script

TRACE = REPO_ROOT / "benchmarks/results/h200x2-stateful/trace-shipped-chunks.log.gz"


def test_the_cheapest_plan_decodes_less_padding_on_the_served_trace():
    padding = benchmark_script("replay_padding")
    trace = padding.steps(padding.log_lines(TRACE))
    assert len(trace) == 129 and sum(map(sum, trace)) == 138_510
    buckets = list(padding.DEFAULT_BATCH_BUCKETS)
    round_up, cheapest = (padding.plan_totals(trace, plan, buckets) for plan in ("round_up", "cheapest"))
    assert round_up["decoded_per_real"] == 1.152 and cheapest["decoded_per_real"] == 1.029
    assert cheapest["replays"] > round_up["replays"]  # some remainders split in two or three replays
    assert cheapest["modelled_cost_frames"] < 0.93 * round_up["modelled_cost_frames"]
