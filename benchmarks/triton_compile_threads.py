"""Does Triton compile kernels in parallel threads? Compile N specialisations of one ``tl.dot`` kernel for a CUDA target
one after another, then in threads, each in an empty cache; no GPU needed (``triton.compile`` with an explicit target).

    python3 benchmarks/triton_compile_threads.py [--kernels 4] [--threads 2] [--arch 90] [--repeat 2]

Stage 0's load-time warm-ups are Triton compiles (``model_executor/models/kani_tts/warm_ups.py``); threads only help
as far as the compile runs outside the GIL (``ptxas`` is a subprocess).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kernels", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--arch", type=int, default=90, help="CUDA compute capability to compile for")
    parser.add_argument("--repeat", type=int, default=2, help="rounds of (one after another, in threads)")
    args = parser.parse_args()
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="triton-threads-")
    import triton
    import triton.language as tl
    from triton.backends.compiler import GPUTarget

    @triton.jit
    def matmul(a, b, c, k_size, stride_a, stride_b, stride_c, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
               SCALE: tl.constexpr):  # fmt: skip
        rm = tl.program_id(0) * BM + tl.arange(0, BM)
        rn = tl.program_id(1) * BN + tl.arange(0, BN)
        rk = tl.arange(0, BK)
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k in range(0, k_size, BK):
            x = tl.load(a + rm[:, None] * stride_a + (k + rk)[None, :])
            y = tl.load(b + (k + rk)[:, None] * stride_b + rn[None, :])
            acc += tl.dot(x, y)
        tl.store(c + rm[:, None] * stride_c + rn[None, :], (acc * SCALE).to(tl.bfloat16))

    target = GPUTarget("cuda", args.arch, 32)
    signature = {name: "*bf16" for name in ("a", "b", "c")}
    signature.update({name: "i32" for name in ("k_size", "stride_a", "stride_b", "stride_c")})
    signature.update({name: "constexpr" for name in ("BM", "BN", "BK", "SCALE")})
    counter = iter(range(1, 1 << 30))

    def compile_one(_: int) -> None:
        # A new SCALE each time: a specialisation no earlier compile has cached.
        constexprs = {"BM": 128, "BN": 128, "BK": 64, "SCALE": float(next(counter))}
        triton.compile(triton.compiler.ASTSource(fn=matmul, signature=signature, constexprs=constexprs), target=target)

    compile_one(0)  # Triton's one-time set-up, outside the clock
    for _ in range(args.repeat):
        start = time.perf_counter()
        for i in range(args.kernels):
            compile_one(i)
        alone = time.perf_counter() - start
        start = time.perf_counter()
        with ThreadPoolExecutor(args.threads) as pool:
            list(pool.map(compile_one, range(args.kernels)))
        threaded = time.perf_counter() - start
        print(
            f"{args.kernels} kernels: one after another {alone:.2f} s, in {args.threads} threads {threaded:.2f} s "
            f"({alone / threaded:.2f}x)",
            flush=True,
        )


if __name__ == "__main__":
    sys.exit(main())
