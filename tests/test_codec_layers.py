"""``benchmarks/codec_layers.py`` times other forms of the codec's convs on the GPU; each must compute the same conv.

On the CPU the forms run through PyTorch's CPU kernels, so this checks the reshapes and paddings that make them
equivalent (the GPU run reports each form's largest difference from cuDNN strict float32 beside its time).
"""

from __future__ import annotations

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
