"""Which captured batch buckets decode a step's rows: the cheapest cover, from each bucket's replay time.

A codec step's rows of one frame bucket replay captured CUDA graphs of at most ``max(batch buckets)`` rows each. A
replay costs what its bucket costs, however many of its rows are real, and every replay also pays a fixed part
(hundreds of kernels: a 3-frame decode at batch 1 takes ~6.7 ms on an H200). Rounding the rows past the last full
slice up to the next bucket wastes up to half a replay (37 rows of 64 frames replay bucket 64: 27 padded rows);
splitting them into many small replays pays the fixed part again each time. On the fourth set's served chunk trace
(256 streams of 250 frames, docs/BENCHMARKS.md) rounding up decoded 15% more frames than were real.

:func:`cheapest_cover` picks the buckets whose total replay time is least (dynamic programming over the row count),
from the times :class:`~.graphs.StreamingGraphs` measures once after capture, or without them from a model of a
replay's cost: its frames plus ``REPLAY_OVERHEAD_FRAMES``. Measured times are read through :func:`monotone`: a
larger bucket never counts as cheaper than a smaller one.
"""

from __future__ import annotations

from collections.abc import Mapping

# A replay's fixed cost in frames of decoding, for plans made without measured times: ~6 ms at ~17,000 frames/s.
REPLAY_OVERHEAD_FRAMES = 100


def modelled_costs(batch_buckets: list[int], frames: int) -> dict[int, float]:
    """Replay cost of each batch bucket at ``frames``, in frames: its rows' frames plus the fixed part."""
    return {b: float(b * frames + REPLAY_OVERHEAD_FRAMES) for b in batch_buckets}


def monotone(costs: Mapping[int, float]) -> dict[int, float]:
    """Each bucket's cost raised to the largest of the smaller buckets' (its least non-decreasing bound).

    A replay of more rows does all of a smaller one's work and more, so a time that says otherwise is noise: on an
    H200 2 rows of 3 frames once timed 2.158 ms against 2.180 for 1 row, and a lone stream's first chunk then
    replayed with a padded row. Besides the padded row's work, its audio then depended on that noise: the batch
    size picks the convs' kernels, whose TF32 / float16 sums round differently (docs/BENCHMARKS.md, fifty-fourth
    set). With ties, :func:`cheapest_cover` takes the smaller bucket.
    """
    out: dict[int, float] = {}
    highest = float("-inf")
    for bucket in sorted(costs):
        highest = max(highest, costs[bucket])
        out[bucket] = highest
    return out


def inversions(costs: Mapping[int, float]) -> int:
    """How many buckets timed below a smaller bucket: the costs :func:`monotone` raises."""
    return sum(monotone(costs)[bucket] > cost for bucket, cost in costs.items())


def cheapest_cover(rows: int, costs: Mapping[int, float]) -> list[int]:
    """Batch buckets, largest first, whose capacities add up to at least ``rows`` at the least total
    :func:`monotone` ``costs``; of equal totals, the one whose first pick is the smaller bucket."""
    if rows <= 0:
        return []
    if not costs:
        raise ValueError("no batch buckets to cover rows with")
    costs = monotone(costs)
    best = [0.0] * (rows + 1)
    pick = [0] * (rows + 1)
    for n in range(1, rows + 1):
        best[n], pick[n] = min((cost + best[max(n - b, 0)], b) for b, cost in costs.items())
    cover, n = [], rows
    while n > 0:
        cover.append(pick[n])
        n = max(n - pick[n], 0)
    return sorted(cover, reverse=True)


def cover_slices(rows: int, cover: list[int]) -> list[tuple[int, int, int]]:
    """``(start, stop, bucket)`` row ranges that fill ``cover``'s buckets in order (the last may be partly padded)."""
    out, start = [], 0
    for bucket in cover:
        if start >= rows:
            break
        stop = min(start + bucket, rows)
        out.append((start, stop, bucket))
        start = stop
    return out
