"""The benchmark's candidate conv kernel (``benchmarks/triton_conv.py``) computes the codec's convs.

``benchmarks/codec_layers.py`` times it beside cuDNN on the GPU; here it runs on Triton's interpreter (CPU tensors,
``TRITON_INTERPRET=1``, which Triton reads at import, hence the subprocess) against ``F.conv1d`` in strict float32:
the two differ only in summation order.
"""

from __future__ import annotations

import pytest

from tests.conftest import run_python

pytest.importorskip("triton")

CHECK = """
import sys, torch, torch.nn.functional as F
sys.path.insert(0, "benchmarks")
import triton_conv
torch.manual_seed(0)
for ci, co, k, d, t in [(27, 27, 11, 5, 300), (54, 54, 3, 1, 100), (27, 1, 3, 1, 50), (40, 20, 7, 3, 90)]:
    x = torch.randn(2, ci, t)
    w = torch.randn(co, ci, k) / (ci * k) ** 0.5
    b, res = torch.randn(co), torch.randn(2, co, t - (k - 1) * d)
    want = F.conv1d(x, w, b, dilation=d)
    taps = triton_conv.tap_major(w)
    got = triton_conv.causal_conv(x, taps, b, d, tf32=False, block_t=64)
    got_res = triton_conv.causal_conv(x, taps, b, d, residual=res, tf32=False, block_t=64)
    # float32 sums of ci*k products of unit-scale terms: a few ulps of the sum's magnitude.
    tol = 8 * (ci * k) ** 0.5 * torch.finfo(torch.float32).eps
    assert (got - want).abs().max() <= tol, (ci, k, d, (got - want).abs().max())
    assert (got_res - (res + want)).abs().max() <= tol + 1e-6, (ci, k, d)
try:
    triton_conv.causal_conv(torch.randn(1, 3, 5), taps, b, 1)
except ValueError as exc:
    print("refused:", exc)
print("ok")
"""


def test_candidate_conv_kernel_equals_conv1d_on_the_interpreter():
    done = run_python(CHECK, env={"TRITON_INTERPRET": "1"})
    assert "refused: input has 3 channels, the weight 40" in done.stdout
    assert done.stdout.strip().endswith("ok")
