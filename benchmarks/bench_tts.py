"""Entry point kept beside the other benchmark scripts: ``python benchmarks/bench_tts.py ...`` is
``vllm-omni-kani bench ...`` (implementation: ``vllm_omni_kani/benchmarks/bench_tts.py``)."""

from __future__ import annotations

import sys

from vllm_omni_kani.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))
