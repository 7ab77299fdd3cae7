"""vLLM's top-k/top-p Triton kernel on a CPU, in Triton's interpreter: whole speech-masked rows against the open columns
(``open_columns``), each against the exact sort-based filter.

    python3 benchmarks/top_k_interpreter.py [--rows 256] [--top-k 50] [--top-p 0.95] [--seed 0]

The kernel's top-p cut comes from a pivot search over the row, so on a GPU it can keep a different token set than
vLLM's sort-based function, and the set can depend on the columns it sees. vLLM imports Triton only where a GPU driver
is active; this loads the installed kernel module with Triton's own imports under ``TRITON_INTERPRET=1``, with the
GPU's tile sizes, and counts the rows whose kept tokens equal the exact filter's. Minutes for 256 rows.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import tempfile
import types
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "1"

import torch
from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p_pytorch

from vllm_omni_kani.model_executor.models.kani_tts import token_layout as tl
from vllm_omni_kani.model_executor.models.kani_tts.speech_mask import Phase, SpeechMask

# The installed kernel module's text, changed only where the interpreter or a CPU needs it.
EDITS = (
    ("from vllm.triton_utils import tl, triton", "import triton\nimport triton.language as tl"),
    ("row_id.to(tl.int64)", "row_id"),  # the interpreter's loop index is a Python int
    ('if logits.device.type == "cpu":\n        block_size', "if False:\n        block_size"),  # the GPU's tiles
    ("num_compute_units(logits.device.index)", "132"),  # an H100/H200's SMs
)


def interpreted_kernel_module() -> types.ModuleType:
    spec = importlib.util.find_spec("vllm.v1.sample.ops.topk_topp_triton")
    assert spec is not None and spec.origin is not None
    with open(spec.origin) as f:
        source = f.read()
    for old, new in EDITS:
        if old not in source:
            sys.exit(f"the installed kernel module has changed: {old!r} not found")
        source = source.replace(old, new)
    # Triton reads a kernel's source from its file, so the edited module is imported from one.
    path = Path(tempfile.mkdtemp()) / "topk_topp_triton_interpreted.py"
    path.write_text(source)
    edited = importlib.util.spec_from_file_location(path.stem, path)
    assert edited is not None and edited.loader is not None
    module = importlib.util.module_from_spec(edited)
    edited.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--top-k", type=int, default=50)
    parser.add_argument("--top-p", type=float, default=0.95)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    kernel = interpreted_kernel_module()
    mask = SpeechMask(tl.PARALLEL_VOCAB_SIZE, "parallel")
    gen = torch.Generator().manual_seed(args.seed)
    logits = torch.randn(args.rows, tl.PARALLEL_VOCAB_SIZE, generator=gen).mul_(2)
    logits = mask.apply(logits, torch.full((args.rows,), int(Phase.SPEECH_0)))
    k = torch.full((args.rows,), args.top_k, dtype=torch.int32)
    p = torch.full((args.rows,), args.top_p)
    exact = torch.isfinite(apply_top_k_top_p_pytorch(logits.clone(), k, p))
    whole = torch.isfinite(kernel.apply_top_k_top_p_triton(logits.clone(), k, p))
    opened = logits.clone()
    kernel.apply_top_k_top_p_triton(opened[:, mask.first_open :], k, p)
    opened = torch.isfinite(opened)
    for name, kept in (("whole rows", whole), ("open columns", opened)):
        differ = (kept != exact).any(dim=1).nonzero().flatten().tolist()
        detail = ", ".join(f"row {r}: {int(kept[r].sum())} kept, exact {int(exact[r].sum())}" for r in differ)
        print(
            f"{name}: {args.rows - len(differ)} of {args.rows} rows keep the exact set"
            + (f" ({detail})" if detail else "")
        )


if __name__ == "__main__":
    main()
