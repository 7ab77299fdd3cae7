"""The streaming resampler gives the samples a one-shot resample gives, however the audio is chunked."""

from __future__ import annotations

import pytest
import torch

from vllm_omni_kani.entrypoints.openai.resample import StreamingResampler, resample

NATIVE = 22_050


@pytest.mark.parametrize("new_sr", [24_000, 16_000, 8_000])
@pytest.mark.parametrize("seed", [0, 1])
def test_chunked_stream_equals_one_shot(new_sr, seed):
    gen = torch.Generator().manual_seed(seed)
    audio = torch.rand(NATIVE // 2, generator=gen) * 2 - 1
    cuts = sorted(torch.randint(1, audio.numel(), (12,), generator=gen).tolist())
    stream = StreamingResampler(NATIVE, new_sr)
    pieces = [stream.push(chunk) for chunk in torch.tensor_split(audio, cuts)] + [stream.flush()]
    streamed = torch.cat(pieces)
    whole = resample(audio, NATIVE, new_sr)
    assert streamed.shape == whole.shape
    # Same float32 FIR on overlapping windows: equal up to float32 rounding of the sums.
    torch.testing.assert_close(streamed, whole, rtol=0, atol=100 * torch.finfo(torch.float32).eps)


def test_passthrough_hands_back_the_input_and_ends_empty():
    stream = StreamingResampler(NATIVE, NATIVE)
    chunk = torch.arange(100, dtype=torch.float32)
    assert stream.passthrough and stream.push(chunk) is chunk
    assert stream.flush().numel() == 0
    assert StreamingResampler(NATIVE, NATIVE).flush().numel() == 0  # a stream that never received audio
