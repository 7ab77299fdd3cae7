"""``benchmarks/codec_layers.py`` times other forms of the codec's convs on the GPU; each must compute the same conv.

On the CPU the forms run through PyTorch's CPU kernels, so this checks the reshapes and paddings that make them
equivalent (the GPU run reports each form's largest difference from cuDNN strict float32 beside its time).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from tests.conftest import benchmark_script

pytest.importorskip("triton")  # the benchmark imports its Triton candidate

# float32 sums of up to 108 x 11 products in a different order: a few ulps of the sums' magnitude (~30).
ATOL = 1e-4


@pytest.fixture(scope="module")
def layers():
    return benchmark_script("codec_layers")


@pytest.mark.parametrize(
    ("channels", "kernel", "dilation", "length"), [(27, 11, 5, 203), (54, 7, 3, 100), (108, 3, 5, 64)]
)
def test_conv_forms_equal_conv1d(layers, channels, kernel, dilation, length):
    gen = torch.Generator().manual_seed(channels)
    x = torch.randn(2, channels, length, generator=gen)
    w = torch.randn(channels, channels, kernel, generator=gen)
    b = torch.randn(channels, generator=gen)
    want = F.conv1d(x, w, b, dilation=dilation)
    forms = {
        "dilation as height": layers.dilation_as_height(x, w, b, dilation),
        "channels-last padded x8": layers.padded(x, w, b, dilation, 8, channels_last=True),
        "channel-major padded x16": layers.padded(x, w, b, dilation, 16, channels_last=False),
    }
    for name, form in forms.items():
        got = form()
        if got.dim() == 4:
            got = got[:, :, 0]
        assert got.shape == want.shape, name
        torch.testing.assert_close(got, want, atol=ATOL, rtol=0, msg=name)


def test_conv_engines_covers_every_channels_last_conv_of_a_step():
    """``benchmarks/conv_engines.py`` times each distinct narrow conv once and weights it by how often a step runs it:
    the real-size codec's three channels-last layers hold 3 branches x 3 units x 2 convs each."""
    from vllm_omni_kani.model_executor.models.kani_tts.nanocodec import NanoCodecDecoder
    from vllm_omni_kani.model_executor.models.kani_tts.nanocodec.streaming import CHANNELS_LAST_BELOW
    from vllm_omni_kani.tools.codec_factory import CODEC_PRESETS

    engines = benchmark_script("conv_engines")
    decoder = NanoCodecDecoder(CODEC_PRESETS["350m"])
    narrow = [c for c in decoder.config.stage_channels if c < CHANNELS_LAST_BELOW]
    convs = engines.narrow_convs(decoder)
    shapes = {(conv.weight.shape[1], conv.weight.shape[2], conv.dilation) for conv, _, _ in convs}
    assert len(shapes) == len(convs)
    assert {c for c, _, _ in shapes} == set(narrow)
    assert sum(calls for _, _, calls in convs) == len(narrow) * 3 * 3 * 2
    # Each at its layer's rate: the narrowest at the output's samples per frame, each wider one slower.
    rates = {conv.weight.shape[1]: rate for conv, rate, _ in convs}
    assert rates[min(narrow)] == math.prod(up.rate for up in decoder.up_sample_conv_layers)
    assert sorted(rates.values()) == [rates[c] for c in sorted(narrow, reverse=True)]
