"""The streams' states into and out of a conv input in one Triton kernel each way (``nanocodec/state_copies.py``).

Pure data movement, so every check is exact: the kernels against PyTorch's ``index_select`` / ``gather`` /
``index_copy_`` form (the module's ``*_torch`` functions, the codec's path without the kernels) on random pools,
slots and lengths in both layouts and both state dtypes (under Triton's interpreter on the CPU, compiled on CUDA),
and a streamed decode with the kernels against the same decode without them, eager and in CUDA graphs.
"""

from __future__ import annotations

import pytest
import torch

from tests.conftest import run_python
from tests.test_codec_streaming import STREAM_ATOL, chunk_payload, codes, run, stateful_stage, stream_all
from vllm_omni_kani.model_executor.models.kani_tts.codec_streams import CodecStreams
from vllm_omni_kani.model_executor.models.kani_tts.nanocodec import load_codec, state_copies
from vllm_omni_kani.model_executor.models.kani_tts.nanocodec.streaming import StreamingCodec

cuda = pytest.mark.skipif(
    not state_copies.available(),
    reason="the compiled state kernels need Triton and a CUDA device (CPU CI has none)",
)
pytestmark = pytest.mark.usefixtures("one_torch_thread")

# (channels, context, steps): a transposed conv's one input of state, a narrow dilated conv, a wide conv whose
# channels span several programs' tiles.
SHAPES = ((3, 1, 5), (27, 10, 33), (300, 6, 17))


def _layout(shape: tuple[int, int, int], time_dim: int) -> tuple[int, ...]:
    """``[rows, C, T]`` as the layout stores it (``time_dim`` 1: ``[rows, T, C]``)."""
    rows, channels, steps = shape
    return shape if time_dim == 2 else (rows, steps, channels)


def _against_torch(device: str) -> None:
    """Both kernels against PyTorch's form on random states, for every shape, layout and dtype: equal bit for bit."""
    gen = torch.Generator().manual_seed(0)
    for channels, context, steps in SHAPES:
        for time_dim in (2, 1):
            for dtype in (torch.float32, torch.float16):
                rows, batch = 12, 5
                pool = torch.randn(_layout((rows, channels, context), time_dim), generator=gen).to(device, dtype)
                joined = torch.randn(_layout((batch, channels, context + steps), time_dim), generator=gen)
                joined = joined.to(device, dtype)
                # Distinct slots, the pool's last rows among them (as scratch slots are); lengths 0..steps.
                slots = torch.randperm(rows, generator=gen)[:batch].to(device)
                lengths = torch.tensor([0, steps, 1, steps // 2, steps - 1], device=device)

                expected = joined.clone()
                state_copies.load_states_torch(pool, slots, expected, time_dim)
                got = joined.clone()
                state_copies.load_states(pool, slots, got, time_dim)
                assert torch.equal(got, expected), (channels, context, time_dim, dtype, "load")

                span = lengths[:, None] + torch.arange(context, device=device)
                want = pool.clone()
                state_copies.save_states_torch(want, slots, joined, span, time_dim)
                saved = pool.clone()
                state_copies.save_states(saved, slots, joined, lengths, time_dim)
                assert torch.equal(saved, want), (channels, context, time_dim, dtype, "save")


def test_the_kernels_copy_as_torch_does_under_the_interpreter():
    code = "import tests.test_codec_state_copies as t\nt._against_torch('cpu')\nprint('kernels ok')\n"
    assert "kernels ok" in run_python(code, env={"TRITON_INTERPRET": "1"}).stdout


def _stream_with_kernels_on_cpu(ckpt: str) -> None:
    """The codec's own calls of the kernels (both layouts), run by the interpreter on the CPU: the same audio and
    states bit for bit as PyTorch's copies."""
    decoder = load_codec(ckpt)
    utterances = {f"r{i}": codes(n, 50 + i) for i, n in enumerate((9, 1, 20))}
    for below in (0, 128):  # every layer channel-major; every (tiny) layer channels-last
        runs, pools = {}, {}
        for on in (False, True):
            codec = StreamingCodec(decoder, num_slots=4, channels_last_below=below, fuse_state_copies=on)
            codec._state_kernels = on  # the interpreter stands in for a CUDA device
            assert codec.state_copies_fused == on
            runs[on] = stream_all(CodecStreams(codec, max_piece_frames=16), utterances, (1, 8), seed=4)
            pools[on] = codec.pool
        for rid in utterances:
            assert torch.equal(runs[True][rid], runs[False][rid]), (below, rid)
        assert all(torch.equal(a, b) for a, b in zip(pools[True], pools[False], strict=True)), below


def test_the_codec_streams_with_the_kernels_under_the_interpreter(tiny_parallel):
    code = f"import tests.test_codec_state_copies as t\nt._stream_with_kernels_on_cpu({str(tiny_parallel)!r})\n"
    assert "streams ok" in run_python(code + "print('streams ok')\n", env={"TRITON_INTERPRET": "1"}).stdout


def test_mismatched_states_and_buffers_are_refused():
    pool, joined = torch.zeros(4, 3, 2), torch.zeros(2, 3, 9)
    slots = torch.tensor([0, 1])
    with pytest.raises(ValueError, match="differ"):
        state_copies.load_states(pool.half(), slots, joined, 2)
    with pytest.raises(ValueError, match="different channels"):
        state_copies.load_states(torch.zeros(4, 5, 2), slots, joined, 2)
    with pytest.raises(ValueError, match="time_dim must be 1 or 2"):
        state_copies.load_states(pool, slots, joined, 0)
    with pytest.raises(ValueError, match="lengths"):
        state_copies.save_states(pool, slots, joined, torch.tensor([1, 2, 3]), 2)


def test_cpu_codec_keeps_torchs_copies(tiny_parallel):
    """Asked for on the CPU, the kernels do not apply: the same ops and the same audio bit for bit."""
    decoder = load_codec(tiny_parallel)
    utterances = {"a": codes(23, 1), "b": codes(9, 2)}
    asked = StreamingCodec(decoder, num_slots=2, fuse_state_copies=True)
    assert asked.fuse_state_copies and not asked.state_copies_fused
    assert not StreamingCodec(decoder, num_slots=2).fuse_state_copies  # the CPU default
    a = stream_all(CodecStreams(asked, max_piece_frames=16), utterances, (1, 4, 16), seed=3)
    b = stream_all(CodecStreams(StreamingCodec(decoder, num_slots=2), max_piece_frames=16), utterances, (1, 4, 16), 3)
    for rid in utterances:
        assert torch.equal(a[rid], b[rid])


def test_stage_passes_the_state_copies_switch_to_its_codec(tiny_flattened):
    """``codec_fused_state_copies`` (default: where the kernels run) reaches the stateful codec; on the CPU it changes
    no audio."""
    utt = codes(20, 24)
    audio = {}
    for switch in (None, True):
        extra = {} if switch is None else {"codec_fused_state_copies": switch}
        stage = stateful_stage(tiny_flattened, slots=2, **extra)
        assert stage.streams.codec.fuse_state_copies is bool(switch)
        assert not stage.streams.codec.state_copies_fused
        audio[switch] = run(stage, ["r"], [chunk_payload(utt, 0, True)])[0]
    assert torch.equal(audio[None], audio[True])


@cuda
def test_the_compiled_kernels_copy_as_torch_does():
    _against_torch("cuda")


@cuda
@pytest.mark.parametrize("channels_last_below", [None, 0], ids=["channels-last", "channel-major"])
@pytest.mark.parametrize("precision", ["fp32", "tf32"])
def test_stream_with_the_state_kernels_equals_without(tiny_parallel, channels_last_below, precision):
    """The same decode with the states moved by the kernels: the same inputs to the same convs, so the same audio
    and the same states bit for bit, float16 channels-last states (TF32) included."""
    decoder = load_codec(tiny_parallel, device="cuda").set_fused_activations(True).set_precision(precision)
    utterances = {f"r{i}": codes(n, 80 + i) for i, n in enumerate((41, 7, 90, 1))}
    runs, pools = {}, {}
    for on in (False, True):
        codec = StreamingCodec(decoder, num_slots=8, channels_last_below=channels_last_below, fuse_state_copies=on)
        assert codec.state_copies_fused == on
        runs[on] = stream_all(CodecStreams(codec, max_piece_frames=24), utterances, (1, 3, 16, 64), seed=8)
        pools[on] = codec.pool
    for rid in utterances:
        assert torch.equal(runs[True][rid], runs[False][rid]), rid
    assert all(torch.equal(a, b) for a, b in zip(pools[True], pools[False], strict=True))


@cuda
def test_graphs_with_the_state_kernels_equal_eager_without(tiny_parallel):
    """Captured with the kernels, replayed in padded buckets: the eager stream without them, to the stream tolerance
    (padding changes the convs' shapes, hence their blocking)."""
    from vllm_omni_kani.model_executor.models.kani_tts.nanocodec.graphs import StreamingGraphs

    decoder = load_codec(tiny_parallel, device="cuda").set_fused_activations(True)  # strict float32
    eager = CodecStreams(StreamingCodec(decoder, num_slots=8, scratch_rows=4, fuse_state_copies=False), 16)
    graphed_codec = StreamingCodec(decoder, num_slots=8, scratch_rows=4)
    assert graphed_codec.state_copies_fused  # the CUDA default
    graphs = StreamingGraphs(graphed_codec, batch_buckets=(1, 2, 4), frame_buckets=(1, 3, 8, 16))
    assert graphs.capture() == 12
    graphed = CodecStreams(graphed_codec, max_piece_frames=16, graphs=graphs)
    utterances = {f"r{i}": codes(n, 30 + i) for i, n in enumerate((37, 5, 20, 16, 9))}
    a = stream_all(eager, utterances, (1, 3, 16, 20), seed=9)
    b = stream_all(graphed, utterances, (1, 3, 16, 20), seed=9)
    assert graphs.replays > 0
    for rid in utterances:
        torch.testing.assert_close(b[rid], a[rid], atol=STREAM_ATOL, rtol=0)
