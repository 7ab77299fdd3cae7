"""Codec CUDA graphs: bucket padding, batch slicing and replay plans give the same audio as eager decodes.

CUDA graphs themselves need a GPU (benchmarks/codec_graphs.py checks replay == eager there); here every
"graph" is an eager stand-in that decodes its static input into its static output, so the padding, slicing
and copying logic of ``CodecGraphs`` runs on the CPU exactly as it does around a real replay.
"""

from __future__ import annotations

import pytest
import torch

from vllm_omni_kani.model_executor.models.kani_tts.codec_streams import CodecStreams, StreamChunk
from vllm_omni_kani.model_executor.models.kani_tts.nanocodec import DEFAULT_CONFIG, load_codec
from vllm_omni_kani.model_executor.models.kani_tts.nanocodec.graphs import (
    DEFAULT_BATCH_BUCKETS,
    CodecGraphs,
    StreamingGraphs,
    batch_slices,
    round_up,
)
from vllm_omni_kani.model_executor.models.kani_tts.nanocodec.streaming import StreamingCodec


class _EagerReplay:
    """Stands in for a captured graph: ``replay()`` recomputes the static output from the static input."""

    def __init__(self, decoder, static_in: torch.Tensor, static_out: torch.Tensor) -> None:
        self.decoder, self.static_in, self.static_out = decoder, static_in, static_out

    def replay(self) -> None:
        with torch.inference_mode():
            self.static_out.copy_(self.decoder(self.static_in))


def _stand_in_graphs(decoder, batches, frames) -> CodecGraphs:
    graphs = CodecGraphs(decoder, batches, frames)
    for b in graphs.batch_buckets:
        for t in graphs.frame_buckets:
            # Padding starts as valid codes from "another request", as after earlier replays.
            static_in = torch.randint(0, DEFAULT_CONFIG.codebook_size, (b, t, 4))
            static_out = torch.empty(b, t * decoder.samples_per_frame)
            graphs.graphs[(b, t)] = _EagerReplay(decoder, static_in, static_out)
            graphs.static_in[(b, t)], graphs.static_out[(b, t)] = static_in, static_out
    return graphs


@pytest.fixture(scope="module")
def codec(make_ckpt):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield load_codec(make_ckpt("parallel"))
    torch.set_num_threads(threads)


def test_bucket_helpers():
    assert [round_up(v, [8, 16, 24]) for v in (1, 8, 9, 24, 25)] == [8, 8, 16, 24, None]
    assert batch_slices(5, 2) == [(0, 2), (2, 4), (4, 5)]
    assert batch_slices(2, 4) == [(0, 2)]


def test_padded_replay_equals_eager_decode(codec):
    """3 rows of 5 and 11 frames: padded to buckets (2 rows + 1 row of 8 or 16 frames), same kept samples."""
    graphs = _stand_in_graphs(codec, [1, 2], [8, 16])
    gen = torch.Generator().manual_seed(0)
    for frames in (5, 11):
        codes = torch.randint(0, DEFAULT_CONFIG.codebook_size, (3, frames, 4), generator=gen)
        with torch.inference_mode():
            expected = codec(codes)
            got = graphs(codes)
        assert got.shape == expected.shape == (3, frames * codec.samples_per_frame)
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    assert graphs.replays == 4 and graphs.eager_calls == 0


def test_long_windows_fall_back_to_eager(codec):
    graphs = _stand_in_graphs(codec, [1], [8])
    codes = torch.randint(0, DEFAULT_CONFIG.codebook_size, (1, 9, 4))
    with torch.inference_mode():
        torch.testing.assert_close(graphs(codes), codec(codes), atol=0, rtol=0)
    assert graphs.eager_calls == 1 and graphs.replays == 0


def test_decode_windows_through_graphs(codec):
    """The streaming entry point with ``forward=graphs``: windows with left context, as Stage 1 gets them."""
    graphs = _stand_in_graphs(codec, [1, 2, 4], [8, 16, 24, 32, 40, 48])
    gen = torch.Generator().manual_seed(1)
    windows = [torch.randint(0, DEFAULT_CONFIG.codebook_size, (f, 4), generator=gen) for f in (3, 19, 44)]
    lefts = [0, 3, 28]
    eager = codec.decode_windows(windows, lefts)
    replayed = codec.decode_windows(windows, lefts, forward=graphs)
    for a, b in zip(replayed, eager, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs and the caching allocator's block splitting")
def test_graph_capture_inside_vllms_model_load_shares_blocks_once_splitting_is_lifted():
    """vLLM 0.26 loads models with max_split_size_mb 20, and the codec stage captures its graphs in that load: big
    activations then never share blocks across buckets. ``block_splitting`` lifts the limit around the capture (and
    restores it); the real-size codec's buckets must then reserve well under what they reserve without it."""
    from vllm_omni_kani.model_executor.models.kani_tts.nanocodec import NanoCodecDecoder, load_decoder_state
    from vllm_omni_kani.model_executor.models.kani_tts.nanocodec.graphs import (
        NO_SPLIT_LIMIT_MB,
        VLLM_LOAD_MAX_SPLIT_MB,
        StreamingGraphs,
        block_splitting,
    )
    from vllm_omni_kani.model_executor.models.kani_tts.nanocodec.streaming import StreamingCodec
    from vllm_omni_kani.tools.codec_factory import CODEC_PRESETS, random_decoder_tensors

    with torch.device("cuda"):
        decoder = NanoCodecDecoder(CODEC_PRESETS["350m"])
    load_decoder_state(decoder, random_decoder_tensors(CODEC_PRESETS["350m"], seed=0))
    decoder.set_precision("tf32")

    def reserved_by_capture(lift: bool) -> int:
        codec = StreamingCodec(decoder, num_slots=64, scratch_rows=64)
        graphs = StreamingGraphs(codec, [16, 32, 64], [16, 32, 48, 64])
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        before = torch.cuda.memory_reserved()
        with block_splitting(VLLM_LOAD_MAX_SPLIT_MB if lift else None):
            assert graphs.capture() == 12
        grown = torch.cuda.memory_reserved() - before
        del graphs, codec
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        return grown

    torch._C._accelerator_setAllocatorSettings(f"max_split_size_mb:{VLLM_LOAD_MAX_SPLIT_MB}")
    try:
        limited, lifted = reserved_by_capture(False), reserved_by_capture(True)
    finally:
        torch._C._accelerator_setAllocatorSettings(f"max_split_size_mb:{NO_SPLIT_LIMIT_MB}")
    print(f"reserved by 12 graphs: {limited / 2**30:.2f} GiB under the limit, {lifted / 2**30:.2f} GiB lifted")
    assert lifted < 0.6 * limited


# --- Which buckets replay a step's rows (replay_plan.py) -------------------------------------------------------------


def _brute_force_cost(rows: int, costs: dict[int, float]) -> float:
    """The least total cost of any multiset of buckets covering ``rows`` (exhaustive, small cases only)."""
    if rows <= 0:
        return 0.0
    return min(cost + _brute_force_cost(rows - b, costs) for b, cost in costs.items())


@pytest.mark.parametrize("seed", range(5))
def test_cheapest_cover_is_optimal_and_covers_the_rows(seed):
    from vllm_omni_kani.model_executor.models.kani_tts.nanocodec.replay_plan import cheapest_cover, cover_slices

    gen = torch.Generator().manual_seed(seed)
    buckets = [1, 2, 4, 8]
    # Costs as measured replays give them: a fixed part plus one growing with the bucket, with noise.
    costs = {b: float(3 + b * (1 + torch.rand(1, generator=gen).item())) for b in buckets}
    for rows in range(1, 20):
        cover = cheapest_cover(rows, costs)
        assert sum(cover) >= rows and cover == sorted(cover, reverse=True)
        assert sum(costs[b] for b in cover) == pytest.approx(_brute_force_cost(rows, costs))
        ranges = cover_slices(rows, cover)
        assert [start for start, _, _ in ranges] == [0] + [stop for _, stop, _ in ranges[:-1]]
        assert ranges[-1][1] == rows and all(stop - start <= b for start, stop, b in ranges)


def test_modelled_costs_split_a_long_remainder_and_pad_a_short_one():
    """Without measured times: 37 rows of 64-frame chunks decode as 32 + 4 + 1 (no padded row) where rounding up
    replayed 64 (27 padded rows); 37 first chunks of 3 frames ride one replay of 64, their padding being cheaper
    than two more replays."""
    from vllm_omni_kani.model_executor.models.kani_tts.nanocodec.replay_plan import cheapest_cover, modelled_costs

    buckets = list(DEFAULT_BATCH_BUCKETS)
    assert cheapest_cover(37, modelled_costs(buckets, 64)) == [32, 4, 1]
    assert cheapest_cover(37, modelled_costs(buckets, 3)) == [64]
    assert cheapest_cover(128, modelled_costs(buckets, 64)) == [64, 64]
    assert cheapest_cover(0, modelled_costs(buckets, 64)) == []


def test_a_bucket_timed_below_a_smaller_one_never_takes_its_rows():
    """Measured times are noisy: on an H200 2 rows of 3 frames timed 2.158 ms against 2.180 for 1 row, and a lone
    stream's chunk replayed with a padded row (its audio then hung on that noise). A larger bucket counts at least
    what every smaller one costs, and a tie goes to the smaller bucket."""
    from vllm_omni_kani.model_executor.models.kani_tts.nanocodec.replay_plan import (
        cheapest_cover,
        inversions,
        monotone,
    )

    measured = {1: 2.180, 2: 2.158, 4: 2.9, 8: 2.7, 16: 6.0}
    assert monotone(measured) == {1: 2.180, 2: 2.180, 4: 2.9, 8: 2.9, 16: 6.0}
    assert inversions(measured) == 2 and inversions(monotone(measured)) == 0
    assert cheapest_cover(1, measured) == [1]
    assert cheapest_cover(2, measured) == [2]
    assert cheapest_cover(3, measured) == [4]
    assert cheapest_cover(5, measured) == [8]  # bucket 8, at bucket 4's cost, beats 4 + 1
    assert monotone({}) == {}


class _StepReplay:
    """Stands in for a captured stateful step: ``replay()`` runs the step on the static inputs."""

    def __init__(self, codec, static) -> None:
        self.codec, self.static = codec, static

    def replay(self) -> None:
        codes, lengths, slots, out = self.static
        with torch.inference_mode():
            out.copy_(self.codec.step(codes, lengths, slots))


def _stand_in_streaming_graphs(codec, batches, frames, plan: str):
    graphs = StreamingGraphs(codec, batches, frames, plan=plan)
    for b in graphs.batch_buckets:
        for t in graphs.frame_buckets:
            static = (
                torch.zeros(b, t, 4, dtype=torch.int64),
                torch.full((b,), t, dtype=torch.int64),
                codec.scratch_slots(b).clone(),
                torch.empty(b, t * codec.decoder.samples_per_frame),
            )
            graphs.graphs[(b, t)], graphs.static[(b, t)] = _StepReplay(codec, static), static
    return graphs


@pytest.mark.parametrize("plan", ["cheapest", "round_up"])
def test_planned_replays_stream_equal_to_eager_steps(codec, plan):
    """Seven streams, two chunks each, through stand-in graphs of buckets 1, 2, 4: the cheapest plan (from the
    replay times below) replays 2 + 2 + 2 + 1, rounding up 4 + 4 (one padded row); both equal eager steps."""
    eager = CodecStreams(StreamingCodec(codec, num_slots=8, scratch_rows=4), max_piece_frames=8)
    graphed_codec = StreamingCodec(codec, num_slots=8, scratch_rows=4)
    graphs = _stand_in_streaming_graphs(graphed_codec, [1, 2, 4], [8], plan)
    graphs.replay_ms = {(1, 8): 1.0, (2, 8): 1.2, (4, 8): 5.0} if plan == "cheapest" else {}
    graphed = CodecStreams(graphed_codec, max_piece_frames=8, graphs=graphs)
    expected = {"cheapest": [(0, 2, 2), (2, 4, 2), (4, 6, 2), (6, 7, 1)], "round_up": [(0, 4, 4), (4, 7, 4)]}
    assert graphs.slices(7, 8) == expected[plan]
    gen = torch.Generator().manual_seed(3)
    utterances = [torch.randint(0, DEFAULT_CONFIG.codebook_size, (11, 4), generator=gen) for _ in range(7)]
    for seq, (start, stop) in enumerate([(0, 5), (5, 11)]):
        chunks = [StreamChunk(f"r{i}", u[start:stop], seq, stop == 11) for i, u in enumerate(utterances)]
        for a, b in zip(graphed.decode(chunks), eager.decode(chunks), strict=True):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    assert graphs.replays == 2 * len(expected[plan]) and graphs.eager_calls == 0
    with pytest.raises(ValueError, match="replay plan must be one of cheapest, round_up"):
        StreamingGraphs(graphed_codec, [1], [8], plan="fastest")


def test_a_lone_stream_replays_alone_when_a_larger_bucket_timed_faster(codec):
    """The fifty-fourth set's case through the graphs themselves: a lone stream's 3-frame chunk, with batch bucket 2
    timed 22 µs below bucket 1, replays in bucket 1 (no padded row); its audio is the eager step's."""
    eager = CodecStreams(StreamingCodec(codec, num_slots=4, scratch_rows=2), max_piece_frames=8)
    graphed_codec = StreamingCodec(codec, num_slots=4, scratch_rows=2)
    graphs = _stand_in_streaming_graphs(graphed_codec, [1, 2], [3, 8], "cheapest")
    graphs.replay_ms = {(1, 3): 2.180, (2, 3): 2.158, (1, 8): 2.161, (2, 8): 2.396}
    assert graphs.slices(1, 3) == [(0, 1, 1)] and graphs.slices(2, 3) == [(0, 2, 2)]
    assert graphs.timing_inversions == 1  # what the stage logs at load
    graphed = CodecStreams(graphed_codec, max_piece_frames=8, graphs=graphs)
    utterance = torch.randint(0, DEFAULT_CONFIG.codebook_size, (11, 4), generator=torch.Generator().manual_seed(5))
    for seq, (start, stop) in enumerate([(0, 3), (3, 11)]):
        chunk = [StreamChunk("lone", utterance[start:stop], seq, stop == 11)]
        (a,), (b,) = graphed.decode(chunk), eager.decode(chunk)
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    assert graphs.replays == 2
