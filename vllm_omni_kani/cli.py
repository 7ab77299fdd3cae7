"""The ``vllm-omni-kani`` command: checkpoint and LoRA-adapter factories, INT4 quantization, and benchmarks."""

from __future__ import annotations

import argparse
import sys

from vllm_omni_kani.benchmarks import bench_tts
from vllm_omni_kani.tools import lora_factory, make_checkpoint, quantize_w4a16


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="vllm-omni-kani")
    sub = parser.add_subparsers(dest="command", required=True)
    mk = sub.add_parser("make-checkpoint", help="write a random-weight Kani checkpoint")
    make_checkpoint.add_arguments(mk)
    mk.set_defaults(func=make_checkpoint.run)
    lora = sub.add_parser("make-lora", help="write a random LoRA adapter (a LoRA voice) for a checkpoint")
    lora_factory.add_arguments(lora)
    lora.set_defaults(func=lora_factory.run)
    int4 = sub.add_parser("quantize-w4a16", help="write a W4A16 (INT4 weight-only) copy of a checkpoint")
    quantize_w4a16.add_arguments(int4)
    int4.set_defaults(func=quantize_w4a16.run)
    bench = sub.add_parser("bench", help="stream speech from a running server at several concurrencies; baselines")
    bench_tts.add_arguments(bench)
    bench.set_defaults(func=bench_tts.run)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
