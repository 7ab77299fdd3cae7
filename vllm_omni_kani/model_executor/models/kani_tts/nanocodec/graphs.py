"""CUDA graphs of the NanoCodec decoder, one per (batch, frames) bucket, with an eager fallback.

A decode of a few frames is ~600 small kernels, so at batch 1 the GPU mostly waits for launches; replaying a
captured graph removes that wait. Inputs are padded up to the nearest bucket: rows are independent and every
layer is causal, so padded rows and frames never reach a kept sample (frames past a row's length are decoded
and dropped by the caller, exactly as in an eager right-padded batch). Batches larger than the largest batch
bucket are decoded in slices of it; windows longer than the largest frame bucket run eagerly.

Graphs are captured once, largest first, in one memory pool; the static input keeps valid codes (zeros or a
previous request's) in its padding, so a replay never indexes out of the FSQ table.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence

import torch

from vllm_omni_kani.model_executor.models.kani_tts.nanocodec.decoder import NanoCodecDecoder
from vllm_omni_kani.model_executor.models.kani_tts.nanocodec.replay_plan import (
    cheapest_cover,
    cover_slices,
    inversions,
    modelled_costs,
)
from vllm_omni_kani.model_executor.models.kani_tts.nanocodec.streaming import StreamingCodec

logger = logging.getLogger(__name__)

# Streaming windows are [left context (<= 28) | new frames (initial 3, then 16)]: up to 44 frames; 48 covers
# them with 8-frame steps (a padded frame costs ~1/40 of a window, a graph ~0.3 s to capture).
DEFAULT_FRAME_BUCKETS = (8, 16, 24, 32, 40, 48)
DEFAULT_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64)


# vLLM 0.26.0 loads every model with the caching allocator's max_split_size_mb at 20 (``Worker.load_model`` in
# vllm/v1/worker/gpu_worker.py, ``_scoped_allocator_max_split``), and the codec stage captures its graphs during that
# load. Blocks over the limit are never split, so each bucket's large activations took blocks of their own: 64 GiB
# reserved for the 63 shipped graphs, against 14 GiB captured with splitting allowed (docs/BENCHMARKS.md).
VLLM_LOAD_MAX_SPLIT_MB = 20
NO_SPLIT_LIMIT_MB = (2**64 - 1) // 2**20  # PyTorch's default: no limit


@contextlib.contextmanager
def block_splitting(restore_max_split_mb: int | None = VLLM_LOAD_MAX_SPLIT_MB) -> Iterator[None]:
    """Let the CUDA caching allocator split blocks of any size inside, so graph buckets share one pool's blocks;
    set ``max_split_size_mb`` back to ``restore_max_split_mb`` after (None, or no CUDA: nothing changes)."""
    if restore_max_split_mb is None or not torch.cuda.is_available():
        yield
        return
    torch._C._accelerator_setAllocatorSettings(f"max_split_size_mb:{NO_SPLIT_LIMIT_MB}")
    try:
        yield
    finally:
        torch._C._accelerator_setAllocatorSettings(f"max_split_size_mb:{restore_max_split_mb}")


def replay_ms(graph: torch.cuda.CUDAGraph, repeat: int = 2) -> float:
    """Best of ``repeat`` timed replays of a captured graph, in ms (CUDA events on the current stream). For the
    shipped 63 buckets of the real codec that is ~5 s at load (a 64 x 64-frame replay is ~0.2 s)."""
    best = float("inf")
    for _ in range(repeat):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        stop.record()
        stop.synchronize()
        best = min(best, start.elapsed_time(stop))
    return best


REPLAY_PLANS = ("cheapest", "round_up")


def check_replay_plan(plan: str, name: str = "replay plan") -> str:
    """``plan`` when it names a replay plan, else a ValueError naming the setting (``name``)."""
    if plan not in REPLAY_PLANS:
        raise ValueError(f"{name} must be one of {', '.join(REPLAY_PLANS)}; got {plan!r}")
    return plan


def replay_cover(
    rows: int,
    frames: int,
    plan: str,
    batch_buckets: Sequence[int],
    replay_ms: Mapping[tuple[int, int], float] | None = None,
) -> list[int]:
    """The batch buckets (largest first) that replay ``rows`` rows of frame bucket ``frames`` under ``plan``:
    ``round_up``, full slices of the largest bucket and the rest rounded up; ``cheapest``, the least total of
    ``replay_ms`` per (batch, frames) bucket, or of modelled costs where a bucket has no time."""
    buckets = list(batch_buckets)
    if check_replay_plan(plan) == "round_up":
        return [round_up(stop - start, buckets) for start, stop in batch_slices(rows, buckets[-1])]
    costs = {b: (replay_ms or {}).get((b, frames)) for b in buckets}
    if any(cost is None for cost in costs.values()):
        costs = modelled_costs(buckets, frames)
    return cheapest_cover(rows, costs)


def round_up(value: int, buckets: Sequence[int]) -> int | None:
    """Smallest bucket >= value, or None when value is larger than every bucket (buckets sorted)."""
    i = bisect.bisect_left(buckets, value)
    return buckets[i] if i < len(buckets) else None


def batch_slices(batch: int, max_batch: int) -> list[tuple[int, int]]:
    """``[start, stop)`` row ranges of at most ``max_batch`` rows covering ``batch`` rows."""
    return [(s, min(s + max_batch, batch)) for s in range(0, batch, max_batch)]


def capture_buckets(
    device: torch.device,
    batch_buckets: Sequence[int],
    frame_buckets: Sequence[int],
    make_inputs: Callable[[int, int], tuple[torch.Tensor, ...]],
    run: Callable[..., torch.Tensor],
) -> dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, tuple[torch.Tensor, ...], torch.Tensor]]:
    """``run(*make_inputs(b, t))`` captured per (batch, frames) bucket, largest first, in one memory pool.

    Each bucket runs once outside the capture first, so cuDNN picks its algorithms there. Returns per bucket the
    graph, its static inputs and its static output.
    """
    captured = {}
    pool = torch.cuda.graph_pool_handle()
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        for b in reversed(batch_buckets):
            for t in reversed(frame_buckets):
                inputs = make_inputs(b, t)
                run(*inputs)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool, stream=stream):
                    out = run(*inputs)
                captured[(b, t)] = (graph, inputs, out)
    torch.cuda.current_stream(device).wait_stream(stream)
    torch.cuda.synchronize(device)
    return captured


class CodecGraphs:
    """Replays captured decodes of ``decoder.forward`` for ``[B, T, G]`` codes; eager where no bucket fits."""

    def __init__(
        self,
        decoder: NanoCodecDecoder,
        batch_buckets: Sequence[int] = DEFAULT_BATCH_BUCKETS,
        frame_buckets: Sequence[int] = DEFAULT_FRAME_BUCKETS,
    ) -> None:
        self.decoder = decoder
        self.batch_buckets = sorted({int(b) for b in batch_buckets if int(b) > 0})
        self.frame_buckets = sorted({int(t) for t in frame_buckets if int(t) > 0})
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self.static_in: dict[tuple[int, int], torch.Tensor] = {}
        self.static_out: dict[tuple[int, int], torch.Tensor] = {}
        self.replays = 0
        self.eager_calls = 0

    @property
    def enabled(self) -> bool:
        return bool(self.graphs)

    @torch.inference_mode()
    def capture(self) -> int:
        """Capture every bucket on the decoder's CUDA device (no-op elsewhere); returns the number captured."""
        device = self.decoder.device
        if device.type != "cuda" or not self.batch_buckets or not self.frame_buckets:
            return 0
        groups = self.decoder.config.num_codebooks

        def inputs(b: int, t: int) -> tuple[torch.Tensor, ...]:
            return (torch.zeros(b, t, groups, dtype=torch.int64, device=device),)

        for key, (graph, (codes,), out) in capture_buckets(
            device, self.batch_buckets, self.frame_buckets, inputs, self.decoder
        ).items():
            self.graphs[key], self.static_in[key], self.static_out[key] = graph, codes, out
        return len(self.graphs)

    def __call__(self, codes: torch.Tensor) -> torch.Tensor:
        """``[B, T, G]`` int64 codes on the decoder's device → ``[B, T·spf]`` audio (a fresh tensor)."""
        batch, frames = codes.shape[0], codes.shape[1]
        t_bucket = round_up(frames, self.frame_buckets) if self.graphs else None
        if t_bucket is None:
            self.eager_calls += 1
            return self.decoder(codes)
        spf = self.decoder.samples_per_frame
        out = torch.empty(batch, frames * spf, dtype=self.decoder.dtype, device=codes.device)
        for start, stop in batch_slices(batch, self.batch_buckets[-1]):
            rows = stop - start
            key = (round_up(rows, self.batch_buckets), t_bucket)
            self.static_in[key][:rows, :frames].copy_(codes[start:stop])
            self.graphs[key].replay()
            out[start:stop].copy_(self.static_out[key][:rows, : frames * spf])
            self.replays += 1
        return out


class StreamingGraphs:
    """Replays captured :meth:`StreamingCodec.step` calls, one per (batch, frames) bucket; eager where none fits.

    Static inputs per bucket: codes ``[B, T, G]``, lengths ``[B]`` and slots ``[B]``. A replay fills the first
    rows and points the padded rows at distinct scratch slots with length 0, so they leave every live state alone.
    The state pool lives outside the graphs' memory pool; replays read and write it in place.

    ``plan``: how a step's rows are split into replays. ``cheapest`` (default): the batch buckets of least total
    replay time (``replay_plan.py``), timed once per bucket after capture. ``round_up``: full slices of the largest
    bucket, the rest rounded up to the next bucket.
    """

    def __init__(
        self,
        codec: StreamingCodec,
        batch_buckets: Sequence[int] = DEFAULT_BATCH_BUCKETS,
        frame_buckets: Sequence[int] = DEFAULT_FRAME_BUCKETS,
        plan: str = "cheapest",
    ) -> None:
        self.plan = check_replay_plan(plan)
        self.codec = codec
        self.batch_buckets = sorted({int(b) for b in batch_buckets if 0 < int(b) <= codec.scratch_rows})
        self.frame_buckets = sorted({int(t) for t in frame_buckets if int(t) > 0})
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self.static: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]] = {}
        self.replay_ms: dict[tuple[int, int], float] = {}  # measured after capture
        self._covers: dict[tuple[int, int], list[tuple[int, int, int]]] = {}
        self.replays = 0
        self.eager_calls = 0

    @property
    def max_frames(self) -> int | None:
        return self.frame_buckets[-1] if self.graphs else None

    @torch.inference_mode()
    def capture(self) -> int:
        """Capture every bucket on the codec's CUDA device (no-op elsewhere); returns the number captured."""
        decoder = self.codec.decoder
        device = decoder.device
        if device.type != "cuda" or not self.batch_buckets or not self.frame_buckets:
            return 0
        groups = decoder.config.num_codebooks

        def inputs(b: int, t: int) -> tuple[torch.Tensor, ...]:
            codes = torch.zeros(b, t, groups, dtype=torch.int64, device=device)
            lengths = torch.full((b,), t, dtype=torch.int64, device=device)
            return codes, lengths, self.codec.scratch_slots(b).clone()

        for key, (graph, (codes, lengths, slots), out) in capture_buckets(
            device, self.batch_buckets, self.frame_buckets, inputs, self.codec.step
        ).items():
            self.graphs[key], self.static[key] = graph, (codes, lengths, slots, out)
        if self.plan == "cheapest":
            try:
                self.replay_ms = {key: replay_ms(graph) for key, graph in self.graphs.items()}
            except RuntimeError:  # the graphs stand; plans fall back to modelled costs
                logger.warning("codec graphs: timing the replays failed; replays planned from modelled costs")
                self.replay_ms = {}
        return len(self.graphs)

    @property
    def timing_inversions(self) -> int:
        """Batch buckets whose measured replay timed below a smaller bucket's at the same frames: the plan counts
        them at the smaller one's cost (``replay_plan.monotone``), so none takes a row it would pad for nothing."""
        return sum(
            inversions({b: ms for (b, t), ms in self.replay_ms.items() if t == frames}) for frames in self.frame_buckets
        )

    def slices(self, rows: int, t_bucket: int) -> list[tuple[int, int, int]]:
        """``(start, stop, batch bucket)`` replays for ``rows`` rows of frame bucket ``t_bucket`` (cached)."""
        key = (rows, t_bucket)
        if key not in self._covers:
            cover = replay_cover(rows, t_bucket, self.plan, self.batch_buckets, self.replay_ms)
            self._covers[key] = cover_slices(rows, cover)
        return self._covers[key]

    @torch.inference_mode()
    def __call__(self, codes: torch.Tensor, lengths: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        """Same contract as :meth:`StreamingCodec.step` (inputs on the codec's device); a fresh output tensor."""
        batch, frames = codes.shape[0], codes.shape[1]
        self.codec.zero_acquired()  # outside the graphs: new streams' slots start from zero state
        t_bucket = round_up(frames, self.frame_buckets) if self.graphs else None
        if t_bucket is None:
            self.eager_calls += 1
            return self.codec.step(codes, lengths, slots)
        spf = self.codec.decoder.samples_per_frame
        out = torch.empty(batch, frames * spf, dtype=self.codec.decoder.dtype, device=codes.device)
        for start, stop, b_bucket in self.slices(batch, t_bucket):
            rows = stop - start
            s_codes, s_lengths, s_slots, s_out = self.static[(b_bucket, t_bucket)]
            s_codes[:rows, :frames].copy_(codes[start:stop])
            s_lengths[:rows].copy_(lengths[start:stop])
            s_slots[:rows].copy_(slots[start:stop])
            if rows < b_bucket:
                s_lengths[rows:].zero_()
                s_slots[rows:].copy_(self.codec.scratch_slots(b_bucket)[rows:])
            self.graphs[(b_bucket, t_bucket)].replay()
            out[start:stop].copy_(s_out[:rows, : frames * spf])
            self.replays += 1
        return out
