"""Fill vLLM's model-info cache for this plugin's architectures before a machine's first server starts.

    VLLM_CACHE_ROOT=/tmp/vc0 python3 benchmarks/gpu/modelinfo_warm.py

A model registered as ``module:Class`` is inspected by vLLM in a subprocess (so that the API server does not import
it and initialize CUDA), and the result is cached under ``$VLLM_CACHE_ROOT/modelinfos`` keyed by the module file's
hash. On a fresh H200 machine the API server spent 79 s resolving the two stages' configs (two such subprocesses,
one after the other, importing vLLM cold), and none on the next server (docs/BENCHMARKS.md, forty-fourth set).
``lib.sh``'s ``checkpoints`` runs this beside the checkpoint factory, so that time overlaps with it instead of
delaying the first server. Every architecture is inspected at once, each in its own subprocess.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import vllm_omni_kani


def inspect(arch: str) -> float:
    """Inspect ``arch`` as vLLM's registry does (from its cache when fresh); returns the seconds it took."""
    from vllm import ModelRegistry

    start = time.perf_counter()
    ModelRegistry.models[arch].inspect_model_cls()
    return time.perf_counter() - start


def main() -> None:
    vllm_omni_kani.register()
    archs = list(vllm_omni_kani.MODELS)
    with ThreadPoolExecutor(len(archs)) as pool:
        for arch, seconds in zip(archs, pool.map(inspect, archs), strict=True):
            print(f"{arch}: {seconds:.1f} s")


if __name__ == "__main__":
    main()
