"""Fused half-snake (one Triton kernel on CUDA) against eager PyTorch.

The kernel does eager's float32 arithmetic op for op, so the two agree to a few float32 ulps; the stateful decoder
with fused activations writes them straight into its ``[state | new]`` conv inputs and must still equal its eager
self (and so the one-shot decode). Off CUDA the switch must leave the eager path untouched.
"""

from __future__ import annotations

import pytest
import torch

from vllm_omni_kani.model_executor.models.kani_tts.codec_streams import CodecStreams, StreamChunk
from vllm_omni_kani.model_executor.models.kani_tts.nanocodec import fused, load_codec
from vllm_omni_kani.model_executor.models.kani_tts.nanocodec.decoder import HalfSnake
from vllm_omni_kani.model_executor.models.kani_tts.nanocodec.streaming import StreamingCodec
from vllm_omni_kani.model_executor.models.kani_tts.token_layout import CODEBOOK_SIZE

# Elementwise float32 work, same ops in the same order: allow a few ulps of each value (sin may differ by 1 ulp
# between libdevice builds), plus one ulp of 1.0 near zero.
ULPS = 4
F32_EPS = torch.finfo(torch.float32).eps
# Whole decodes: the convs are identical, the activations differ by ULPS at most and the codec's gain carries that
# through ~100 layers; streamed vs one-shot already differs by 1e-6 (tests/test_codec_streaming.py).
DECODE_ATOL = 1e-5

cuda = pytest.mark.skipif(
    not fused.available(), reason="the fused kernel needs Triton and a CUDA device (CPU CI has none)"
)
pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def ckpt(make_ckpt):
    return make_ckpt("parallel")


def random_snake(channels: int, device: str) -> HalfSnake:
    snake = HalfSnake(channels).to(device)
    with torch.no_grad():
        snake.alpha.copy_(torch.rand(snake.alpha.shape, generator=torch.Generator().manual_seed(channels)) * 3 + 0.05)
    snake.refresh()
    return snake


def codes(frames: int, seed: int) -> torch.Tensor:
    return torch.randint(0, CODEBOOK_SIZE, (frames, 4), generator=torch.Generator().manual_seed(seed))


def stream(decoder, utterance: torch.Tensor, sizes: list[int]) -> torch.Tensor:
    streams = CodecStreams(StreamingCodec(decoder, num_slots=2, scratch_rows=2), max_piece_frames=16)
    pieces, start = [], 0
    for seq, size in enumerate(sizes):
        piece = utterance[start : start + size]
        start += size
        (audio,) = streams.decode([StreamChunk("r", piece.to(decoder.device), seq, start == utterance.shape[0])])
        assert audio is not None
        pieces.append(audio.cpu())
    return torch.cat(pieces)


def test_switch_off_cuda_keeps_eager(ckpt):
    """On CPU the kernel does not apply: the switched-on decoder runs exactly the eager ops."""
    decoder = load_codec(ckpt)
    utterance = codes(21, 3)
    eager = stream(decoder, utterance, [1, 4, 16])
    decoder.set_fused_activations(True)
    assert decoder.fused_activations
    assert torch.equal(stream(decoder, utterance, [1, 4, 16]), eager)


@cuda
@pytest.mark.parametrize("channels", [2, 7, 64, 1024])
def test_half_snake_kernel_equals_eager(channels):
    snake = random_snake(channels, "cuda")
    # A strided input (a slice of a wider buffer, as the decoder's upsampler hands over) and a strided output.
    wide = torch.randn(3, channels, 5000, device="cuda", generator=torch.Generator("cuda").manual_seed(1)) * 4
    x = wide[..., 3:4700]
    expected = snake(x)
    out = torch.full((3, channels, x.shape[-1] + 9), float("nan"), device="cuda")
    snake.fused = True
    snake.write(x, out[..., 9:])
    got = out[..., 9:]
    assert torch.isnan(out[..., :9]).all(), "the kernel wrote outside its slice"
    tol = ULPS * F32_EPS * expected.abs().clamp_min(1.0)
    assert ((got - expected).abs() <= tol).all()
    assert torch.equal(snake(x), got)  # forward uses the same kernel


@cuda
def test_fused_stateful_decode_equals_eager(ckpt):
    decoder = load_codec(ckpt, device="cuda")
    utterance = codes(45, 7)
    sizes = [1, 3, 16, 9, 16]
    eager = stream(decoder, utterance, sizes)
    one_shot = decoder.decode(utterance[None].cuda())[0].cpu()
    decoder.set_fused_activations(True)
    got = stream(decoder, utterance, sizes)
    torch.testing.assert_close(got, eager, atol=DECODE_ATOL, rtol=0)
    torch.testing.assert_close(decoder.decode(utterance[None].cuda())[0].cpu(), one_shot, atol=DECODE_ATOL, rtol=0)


@cuda
@pytest.mark.parametrize("channels", [3, 27, 56, 112, 216])  # 216: two channel tiles of the kernel
def test_half_snake_kernel_on_channels_last_views_equals_eager(channels):
    """The channels-last layers hand the activation ``[B, C, T]`` views of ``[B, T, C]`` memory (channel stride 1);
    the kernel tiles them by time and writes only its slice."""
    snake = random_snake(channels, "cuda")
    memory = torch.randn(3, 3000, channels, device="cuda", generator=torch.Generator("cuda").manual_seed(2)) * 4
    x = memory[:, 5:2905].transpose(1, 2)
    snake.fused = False
    expected = snake(x)
    out = torch.full((3, 2909, channels), float("nan"), device="cuda")
    snake.fused = True
    snake.write(x, out[:, 9:].transpose(1, 2))
    got = out[:, 9:].transpose(1, 2)
    assert torch.isnan(out[:, :9]).all(), "the kernel wrote outside its slice"
    tol = ULPS * F32_EPS * expected.abs().clamp_min(1.0)
    assert ((got - expected).abs() <= tol).all()
