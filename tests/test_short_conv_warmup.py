"""The short-conv Triton warm-up (``model_executor/warmup/short_conv_triton_warmup.py``) and its patch.

vLLM's Triton kernels need a GPU (on a CPU build vLLM replaces Triton with a placeholder, Triton's interpreter
included). On CPU: the patch stays out of a CPU build, a CPU model runner warms nothing, and the state indices have
the layout vLLM's metadata builder gives a step's prompts and decodes (what Triton's specialisation keys read: row
stride and alignment). With CUDA: a stock LFM2 engine (the flattened checkpoint) runs a burst of mixed steps, decodes
beside prompt chunks, with every Triton compile logged (``KANI_JIT_EVENTS``) in a fresh Triton cache; warmed, none of
the short-conv or KV-zeroing kernels compiles inside the burst, and without the warm-up some do (the reason for the
patch: when that stops, vLLM warms them itself and the patch can go).
"""

from __future__ import annotations

import re
import textwrap
import types

import pytest
import torch

from tests.conftest import run_python
from vllm_omni_kani.model_executor.warmup import short_conv_triton_warmup as warmup


def test_the_patch_is_applied_on_cuda_only():
    code = (
        "import vllm_omni_kani, vllm.plugins as p\n"
        "p.load_general_plugins()\n"
        "from vllm_omni_kani import patch\n"
        "print('active', 'warm_short_conv_triton_kernels' in patch.apply_all())\n"
        "print('guard', patch._vllm_cuda_0_26())\n"
    )
    out = run_python(code).stdout
    cuda = torch.cuda.is_available()  # a CPU build (CI) has no CUDA platform
    assert f"active {cuda}" in out and f"guard {cuda}" in out, out


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


# The kernels the warm-up covers (vLLM 0.26's names).
WARMED_KERNELS = ("_causal_conv1d_fwd_kernel", "_causal_conv1d_update_kernel", "_zero_kv_blocks_kernel")
BURST = textwrap.dedent(
    """
    import time
    from vllm import LLM, SamplingParams
    llm = LLM(model=CKPT, max_model_len=256, max_num_seqs=16, max_num_batched_tokens=32, enforce_eager=True,
              gpu_memory_utilization=0.2, enable_prefix_caching=False)
    # Prompts longer than a step's token budget: each step decodes the admitted ones beside the next prompt's chunk.
    prompts = [{"prompt_token_ids": [1, *range(300, 300 + n)]} for n in (9, 21, 30, 14, 27, 5, 18, 25, 11, 3)]
    print(f"KANI_BURST_START {time.perf_counter():.6f}", flush=True)
    llm.generate(prompts, SamplingParams(max_tokens=20, ignore_eos=True), use_tqdm=False)
    """
)
_JIT = re.compile(r"\[KaniJit\] kernel=(\S+) start=([\d.]+)")


def _burst_compiles(ckpt, tmp_path, env: dict[str, str]) -> tuple[list[str], list[str], str]:
    """The kernels Triton compiled before the burst and inside it, and the run's output."""
    env = {"KANI_JIT_EVENTS": "1", "TRITON_CACHE_DIR": str(tmp_path / "triton"), **env}
    out = run_python(f"CKPT = {str(ckpt)!r}\n{BURST}", env=env)
    text = out.stdout + out.stderr
    start = float(re.search(r"KANI_BURST_START ([\d.]+)", text)[1])
    events = [(m[1], float(m[2])) for m in _JIT.finditer(text)]
    before = [kernel for kernel, t in events if t < start]
    inside = [kernel for kernel, t in events if t >= start]
    side = env.get("KANI_DISABLE_PATCHES", "warmed")
    print(f"compiled before the burst ({side}): {before}\ncompiled in the burst ({side}): {inside}")  # the suite's log
    return before, inside, text


@pytest.mark.skipif(not torch.cuda.is_available(), reason="vLLM's Triton kernels need a CUDA device (CPU CI has none)")
def test_cuda_a_warmed_engine_compiles_no_short_conv_kernel_in_its_first_mixed_steps(tiny_flattened, tmp_path):
    before, inside, text = _burst_compiles(tiny_flattened, tmp_path, {})
    assert "short-conv Triton kernels warmed" in text, text[-3000:]
    # The engine process logs its compiles (the warm-up's among them, in the fresh cache) ...
    assert "_causal_conv1d_fwd_kernel" in before, before
    # ... and none of the warmed kernels compiles again once requests come.
    assert not [k for k in inside if k in WARMED_KERNELS], inside


@pytest.mark.skipif(not torch.cuda.is_available(), reason="vLLM's Triton kernels need a CUDA device (CPU CI has none)")
def test_cuda_without_the_warm_up_the_first_mixed_steps_compile_short_conv_kernels(tiny_flattened, tmp_path):
    off = {"KANI_DISABLE_PATCHES": "warm_short_conv_triton_kernels"}
    _, inside, text = _burst_compiles(tiny_flattened, tmp_path, off)
    assert "short-conv Triton kernels warmed" not in text, text[-3000:]
    assert [k for k in inside if k in WARMED_KERNELS], inside
