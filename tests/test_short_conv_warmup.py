"""The short-conv Triton warm-up (``model_executor/warmup/short_conv_triton_warmup.py``) and its patch.

vLLM's Triton kernels need a GPU (on a CPU build vLLM replaces Triton with a placeholder, Triton's interpreter
included), so the warm-up's kernels run in the served GPU benchmarks, whose logs say what was warmed and which
kernels still compiled under load (``KANI_JIT_EVENTS``; docs/BENCHMARKS.md). Here: the patch stays out of a CPU
build, a CPU model runner warms nothing, and the state indices have the layout vLLM's metadata builder gives a step's
prompts and decodes (what Triton's specialisation keys read: row stride and alignment).
"""

from __future__ import annotations

import types

import torch

from tests.conftest import run_python
from vllm_omni_kani.model_executor.warmup import short_conv_triton_warmup as warmup


def test_the_patch_is_not_applied_on_a_cpu_build():
    code = (
        "import vllm_omni_kani, vllm.plugins as p\n"
        "p.load_general_plugins()\n"
        "from vllm_omni_kani import patch\n"
        "print('active', 'warm_short_conv_triton_kernels' in patch.apply_all())\n"
        "print('guard', patch._vllm_cuda_0_26())\n"
    )
    out = run_python(code).stdout
    assert "active False" in out and "guard False" in out, out


def test_a_cpu_runner_warms_nothing():
    runner = types.SimpleNamespace(device=torch.device("cpu"))
    assert warmup.warm_up(runner) == []


def test_state_index_rows_are_laid_out_as_vllms_metadata_builder_lays_them_out():
    from vllm.v1.attention.backends.utils import NULL_BLOCK_ID

    width, rows = 1, 2
    # The builder splits the group's block table rows [decodes | prompts] and takes column 0 of the prompts' rows.
    table = torch.zeros(8, width, dtype=torch.int32)
    for offset in warmup.PROMPT_ROW_OFFSETS:
        served = torch.split(table[: offset + rows], [offset, rows])[1][:, 0]
        warmed = warmup._table_rows(width, offset, rows, torch.device("cpu"))[:, 0]
        assert warmed.stride() == served.stride() and warmed.shape == served.shape and warmed.dtype == served.dtype
        assert (warmed.data_ptr() % 16 == 0) == (served.data_ptr() % 16 == 0) == (offset * width * 4 % 16 == 0)
        assert bool((warmed == NULL_BLOCK_ID).all())
    decode = warmup._table_rows(width, 0, rows, torch.device("cpu"))[:, :1]
    assert decode.shape == (rows, 1) and decode.stride() == table[:rows, :1].stride()
    # Triton's integer specialisations (1, a multiple of 16, anything else) each met once.
    for counts in (warmup.ZERO_KV_BLOCK_COUNTS, warmup.DECODE_ROWS):
        assert {1 if n == 1 else 16 if n % 16 == 0 else 0 for n in counts} == {0, 1, 16}
