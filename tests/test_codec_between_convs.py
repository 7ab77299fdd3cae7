"""The stateful decoder's between-conv kernels (Triton, CUDA) against the eager ops they replace.

Each kernel does the eager float32 sums in eager's order, except the up-sampler, whose four multiply-adds per
sample cuDNN sums in an order of its own: every kernel is held to a few float32 ulps of its eager counterpart, and a
whole streamed decode with the kernels to the eager stream and to the one-shot decode at the stream tolerance.
Off CUDA the switch changes nothing.
"""

from __future__ import annotations

import math

import pytest
import torch

from tests.test_codec_streaming import STREAM_ATOL, codes, stream_all
from vllm_omni_kani.model_executor.models.kani_tts.codec_streams import CodecStreams
from vllm_omni_kani.model_executor.models.kani_tts.nanocodec import between_convs, load_codec
from vllm_omni_kani.model_executor.models.kani_tts.nanocodec.decoder import CausalUpsample, HalfSnake
from vllm_omni_kani.model_executor.models.kani_tts.nanocodec.streaming import StreamingCodec

F32_EPS = torch.finfo(torch.float32).eps
# Elementwise float32 work in eager's order: a few ulps (libdevice's sin may differ by one); the up-sampler sums five
# terms in another order than cuDNN.
ULPS = 8

cuda = pytest.mark.skipif(
    not between_convs.available(), reason="the between-conv kernels need Triton and a CUDA device (CPU CI has none)"
)
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def randn(*shape: int, seed: int, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(*shape, device="cuda", generator=torch.Generator("cuda").manual_seed(seed)) * scale


def assert_ulps(got: torch.Tensor, expected: torch.Tensor, magnitude: torch.Tensor) -> None:
    tol = ULPS * F32_EPS * magnitude.clamp_min(1.0)
    bad = (got - expected).abs() > tol
    assert not bad.any(), f"{int(bad.sum())} values off by up to {float((got - expected).abs().max()):.3g}"


def test_cpu_decoder_keeps_the_eager_path(tiny_parallel):
    """On CPU the kernels do not apply, asked for or not: the same ops, the same audio bit for bit."""
    decoder = load_codec(tiny_parallel).set_fused_activations(True)
    utterances = {"a": codes(23, 1), "b": codes(9, 2)}
    asked = StreamingCodec(decoder, num_slots=2, fuse_between_convs=True)
    assert asked.fuse_between_convs and not asked.between_fused
    assert not StreamingCodec(decoder, num_slots=2).fuse_between_convs  # the CPU default
    plain = StreamingCodec(decoder, num_slots=2, fuse_between_convs=False)
    a = stream_all(CodecStreams(asked, max_piece_frames=16), utterances, (1, 4, 16), seed=3)
    b = stream_all(CodecStreams(plain, max_piece_frames=16), utterances, (1, 4, 16), seed=3)
    for rid in utterances:
        assert torch.equal(a[rid], b[rid])


def test_cpu_decoder_keeps_float32_channels_last_convs(tiny_parallel):
    """Half-precision narrow convs need the CUDA kernels and TF32: on CPU they stay float32, asked for or not, and a
    dtype the kernels cannot read is refused."""
    decoder = load_codec(tiny_parallel).set_precision("tf32")
    codec = StreamingCodec(decoder, num_slots=2, channels_last_below=512, channels_last_dtype=torch.float16)
    assert codec.channels_last_layers and codec.channels_last_dtype == torch.float32
    assert {p.dtype for p in codec.pool} == {torch.float32}
    with pytest.raises(ValueError, match="channels_last_dtype"):
        StreamingCodec(decoder, num_slots=2, channels_last_dtype=torch.bfloat16)


@cuda
@pytest.mark.parametrize("rate", [2, 3, 6, 7])
@pytest.mark.parametrize("padded", [None, 8, 40])  # channel-major out, or channels-last with zero padding
def test_upsample_kernel_equals_transposed_conv(rate, padded):
    channels = 5 if padded != 40 else 27
    up = CausalUpsample(2 * channels, rate).cuda()
    with torch.no_grad():
        up.weight.copy_(randn(*up.weight.shape, seed=rate))
        up.bias.copy_(randn(*up.bias.shape, seed=rate + 1))
    steps = 37
    # The joined [state | new] input as the decoder hands it: a slice of a wider buffer.
    wide = randn(3, 2 * channels, steps + 4, seed=7, scale=3)
    joined = wide[..., 2 : 3 + steps]
    expected = up.transpose(joined)[..., rate : rate * (steps + 1)]
    if padded is None:
        out = torch.full((3, channels, steps * rate), float("nan"), device="cuda")
        got = between_convs.upsample_into(joined, up.weight, up.bias, rate, out, channel_major=True)
    else:
        out = torch.full((3, steps * rate, padded), float("nan"), device="cuda")
        between_convs.upsample_into(joined, up.weight, up.bias, rate, out, channel_major=False)
        assert torch.equal(out[..., channels:], torch.zeros_like(out[..., channels:])), "padding must be zero"
        got = out[..., :channels].transpose(1, 2)
    magnitude = up.bias.abs().max() + 4 * joined.abs().max() * up.weight.abs().max()
    assert_ulps(got, expected, magnitude.expand_as(expected))


@cuda
@pytest.mark.parametrize("channel_major", [True, False])
def test_residual_kernel_equals_eager(channel_major):
    batch, channels, steps, width = 3, 27, 301, 32
    shape = (batch, channels, steps) if channel_major else (batch, steps, width)
    y, s, total = (randn(*shape, seed=i, scale=2) for i in (1, 2, 3))
    bias = randn(channels if channel_major else width, seed=4)
    view = bias.view(1, -1, 1) if channel_major else bias.view(1, 1, -1)
    # A residual add in place of the conv output.
    expected = y + (s + view)
    got = between_convs.residual_into(y, s.clone(), bias, torch.empty_like(s), channel_major)
    assert_ulps(got, expected, expected.abs())
    # The layer's last unit: the branch mean, into channel-major memory without the padding.
    mean = (total + (y + (s + view))) / 3
    out = torch.full((batch, channels, steps), float("nan"), device="cuda")
    between_convs.residual_into(
        y,
        s,
        bias,
        out if channel_major else out.transpose(1, 2),
        channel_major,
        total=total,
        divisor=3,
        channels=channels,
    )
    want = mean if channel_major else mean[..., :channels].transpose(1, 2)
    assert_ulps(out, want, want.abs())


@cuda
@pytest.mark.parametrize("channels_last", [False, True])
def test_half_snake_with_bias_equals_eager(channels_last):
    channels = 27
    snake = HalfSnake(channels).cuda()
    with torch.no_grad():
        snake.alpha.copy_(torch.rand(snake.alpha.shape, generator=torch.Generator().manual_seed(0)).cuda() * 3 + 0.05)
    snake.refresh()
    bias = randn(channels, seed=5)
    memory = randn(2, 400, channels, seed=6, scale=3) if channels_last else randn(2, channels, 400, seed=6, scale=3)
    x = memory.transpose(1, 2) if channels_last else memory
    expected = snake(x + bias.view(1, -1, 1))
    out = torch.empty_like(memory)
    out = out.transpose(1, 2) if channels_last else out
    snake.fused = True
    snake.write(x, out, bias)
    assert_ulps(out, expected, expected.abs())


@cuda
@pytest.mark.parametrize("channels_last_below", [None, 0], ids=["channels-last", "channel-major"])
def test_stream_with_kernels_equals_eager_and_one_shot(tiny_parallel, channels_last_below):
    decoder = load_codec(tiny_parallel, device="cuda").set_fused_activations(True)  # strict float32
    utterances = {f"r{i}": codes(n, 50 + i) for i, n in enumerate((41, 7, 90, 1))}
    runs = {}
    for on in (False, True):
        codec = StreamingCodec(decoder, num_slots=8, channels_last_below=channels_last_below, fuse_between_convs=on)
        assert codec.between_fused == on
        runs[on] = stream_all(CodecStreams(codec, max_piece_frames=24), utterances, (1, 3, 16, 64), seed=8)
    for rid, utt in utterances.items():
        torch.testing.assert_close(runs[True][rid], runs[False][rid], atol=STREAM_ATOL, rtol=0)
        torch.testing.assert_close(runs[True][rid], decoder.decode(utt[None].cuda())[0], atol=STREAM_ATOL, rtol=0)


@cuda
def test_graphs_with_kernels_equal_eager(tiny_parallel):
    from vllm_omni_kani.model_executor.models.kani_tts.nanocodec.graphs import StreamingGraphs

    # Strict float32: in TF32 a padded graph bucket and an eager batch of another size pick different conv kernels,
    # which differ by ~5e-4 whatever runs between the convs.
    decoder = load_codec(tiny_parallel, device="cuda").set_fused_activations(True)
    eager_codec = StreamingCodec(decoder, num_slots=8, scratch_rows=4)
    graphed_codec = StreamingCodec(decoder, num_slots=8, scratch_rows=4)
    assert eager_codec.between_fused and graphed_codec.between_fused
    graphs = StreamingGraphs(graphed_codec, batch_buckets=(1, 2, 4), frame_buckets=(1, 3, 8, 16))
    assert graphs.capture() == 12
    utterances = {f"r{i}": codes(n, 60 + i) for i, n in enumerate((37, 5, 20, 16, 9))}
    a = stream_all(CodecStreams(eager_codec, max_piece_frames=16), utterances, (1, 3, 16, 20), seed=9)
    b = stream_all(CodecStreams(graphed_codec, max_piece_frames=16, graphs=graphs), utterances, (1, 3, 16, 20), seed=9)
    assert graphs.replays > 0
    for rid in utterances:
        torch.testing.assert_close(b[rid], a[rid], atol=STREAM_ATOL, rtol=0)


@cuda
def test_kernels_read_and_write_float16_conv_sides():
    """The channels-last layers' float16 convs: the half-snake reads a float16 conv output and writes a float16 conv
    input, computing in float32 and rounding once; the residual add reads a float16 skip-conv output into the float32
    residual stream."""
    channels = 27
    snake = HalfSnake(channels).cuda()
    with torch.no_grad():
        snake.alpha.copy_(torch.rand(snake.alpha.shape, generator=torch.Generator().manual_seed(0)).cuda() * 3 + 0.05)
    snake.refresh()
    snake.fused = True
    bias = randn(channels, seed=5)
    x = randn(2, 400, channels, seed=6, scale=3).half().transpose(1, 2)  # a channels-last conv's [B, C, T] view
    out = torch.empty(2, 400, channels, dtype=torch.float16, device="cuda").transpose(1, 2)
    snake.write(x, out, bias)
    expected = snake(x.float() + bias.view(1, -1, 1))
    # One float16 rounding of a float32 result that may itself be a few float32 ulps off eager's: one float16 ulp.
    torch.testing.assert_close(out, expected.half(), rtol=torch.finfo(torch.float16).eps, atol=2**-24)

    y = randn(2, 301, 32, seed=1, scale=2)
    s = randn(2, 301, 32, seed=2, scale=2).half()
    bias = randn(32, seed=4)
    expected = y + (s.float() + bias.view(1, 1, -1))
    got = between_convs.residual_into(y, s, bias, torch.empty_like(y), channel_major=False)
    assert got.dtype == torch.float32
    assert_ulps(got, expected, expected.abs())
    with pytest.raises(ValueError, match="float32"):
        between_convs.residual_into(y.half(), s, bias, torch.empty_like(y), channel_major=False)


@cuda
def test_stream_with_float16_narrow_convs_keeps_tf32s_snr(tiny_parallel):
    """float16 has TF32's 10-bit mantissa but also rounds each conv's output: the stream with half-precision
    channels-last convs (every layer of the tiny codec) stays within 6 dB of the TF32 stream's SNR against the strict
    float32 one-shot decode (at most 4x its noise power; 2.2x measured on an H200) and above the 60 dB that the
    default precision must hold, and its narrow states are float16."""
    decoder = load_codec(tiny_parallel, device="cuda").set_fused_activations(True)
    utterances = {f"r{i}": codes(n, 70 + i) for i, n in enumerate((41, 7, 90, 1))}
    reference = torch.cat([decoder.decode(u[None].cuda())[0] for u in utterances.values()])
    decoder.set_precision("tf32")
    snr = {}
    for dtype in (torch.float32, torch.float16):
        codec = StreamingCodec(decoder, num_slots=8, channels_last_dtype=dtype)
        assert codec.between_fused and codec.channels_last_layers and codec.channels_last_dtype == dtype
        assert {p.dtype for p in codec.pool} == {torch.float32, dtype}
        streamed = stream_all(CodecStreams(codec, max_piece_frames=24), utterances, (1, 3, 16, 64), seed=8)
        audio = torch.cat([streamed[rid] for rid in utterances])
        noise = (audio.double() - reference.double()).pow(2).sum()
        snr[dtype] = float(10 * torch.log10(reference.double().pow(2).sum() / noise))
    assert snr[torch.float16] >= max(snr[torch.float32] - 10 * math.log10(4), 60), snr


@cuda
@pytest.mark.parametrize("channel_major", [True, False])
@pytest.mark.parametrize("act_dtype", [torch.float32, torch.float16])
def test_residual_kernel_writes_the_next_half_snake(channel_major, act_dtype):
    """The residual add's output and its half-snake (into a slice of a conv input buffer, float32 or float16) in one
    pass: the half-snake equals the half-snake kernel's of the output read back, to a few ulps of the output dtype."""
    channels, width, steps, context = 27, 32, 301, 10
    snake = HalfSnake(channels).cuda()
    with torch.no_grad():
        snake.alpha.copy_(torch.rand(snake.alpha.shape, generator=torch.Generator().manual_seed(0)).cuda() * 3 + 0.05)
    snake.refresh()
    snake.fused = True
    shape = (2, channels, steps) if channel_major else (2, steps, width)
    y, s = randn(*shape, seed=1, scale=2), randn(*shape, seed=2, scale=2)
    bias = randn(shape[1] if channel_major else width, seed=4)
    time_dim = 2 if channel_major else 1
    joined_shape = list(shape)
    joined_shape[time_dim] += context
    joined = torch.full(joined_shape, 7.0, dtype=act_dtype, device="cuda")
    new = joined.narrow(time_dim, context, steps)
    act = between_convs.NextActivation(new, snake.alpha, snake.inv_alpha, 0.01)
    out = between_convs.residual_into(y, s, bias, torch.empty_like(y), channel_major, activation=act)
    expected_out = between_convs.residual_into(y, s, bias, torch.empty_like(y), channel_major)
    assert_ulps(out, expected_out, expected_out.abs())
    expected = torch.empty_like(new)
    # The half-snake works on [B, C, T] views; channels-last: leaky ReLU past the snake channels, padding included.
    as_bct = (lambda t: t) if channel_major else (lambda t: t.transpose(1, 2))
    snake.write(as_bct(out), as_bct(expected))
    if act_dtype == torch.float32:
        assert_ulps(new, expected, expected.abs())
    else:
        torch.testing.assert_close(new, expected, rtol=torch.finfo(torch.float16).eps, atol=2**-24)
    assert bool((joined.narrow(time_dim, 0, context) == 7.0).all()), "the state part was written"
    with pytest.raises(ValueError, match="next activation"):
        bad = between_convs.NextActivation(new.narrow(time_dim, 0, steps - 1), snake.alpha, snake.inv_alpha, 0.01)
        between_convs.residual_into(y, s, bias, torch.empty_like(y), channel_major, activation=bad)


@cuda
@pytest.mark.parametrize("channels_last_below", [None, 0], ids=["channels-last", "channel-major"])
@pytest.mark.parametrize("precision", ["fp32", "tf32"])
def test_stream_with_the_next_half_snake_fused_equals_without(tiny_parallel, channels_last_below, precision):
    """Each residual add writing the next unit's half-snake (and that unit's state from it) streams the same audio as
    the half-snake kernel reading the add's output back: the same float32 arithmetic, float16 conv sides included.
    In TF32 an input one float32 ulp off could round to the neighbouring 10-bit mantissa: held to that precision."""
    decoder = load_codec(tiny_parallel, device="cuda").set_fused_activations(True).set_precision(precision)
    utterances = {f"r{i}": codes(n, 80 + i) for i, n in enumerate((41, 7, 90, 1))}
    runs = {}
    for on in (False, True):
        codec = StreamingCodec(decoder, num_slots=8, channels_last_below=channels_last_below, fuse_next_activation=on)
        assert codec.between_fused and codec.fuse_next_activation == on
        runs[on] = stream_all(CodecStreams(codec, max_piece_frames=24), utterances, (1, 3, 16, 64), seed=8)
    atol = STREAM_ATOL if precision == "fp32" else torch.finfo(torch.float16).eps  # audio is within [-1, 1]
    for rid in utterances:
        torch.testing.assert_close(runs[True][rid], runs[False][rid], atol=atol, rtol=0)
