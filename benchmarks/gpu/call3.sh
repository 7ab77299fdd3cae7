#!/usr/bin/env bash
# GPU call 3: our Stage-0 decode step (parallel heads, mask, code payload) measured like the stock one, FP8, and
# the greedy code agreement of FP8 with bf16.
source benchmarks/gpu/common.sh
step stage0 220 python3 -m vllm_omni_kani.benchmarks.step_time "$CK/par" --engine omni --label stage0 --out "$R" --sampled --codes
pack 3
step stage0-fp8 200 python3 -m vllm_omni_kani.benchmarks.step_time "$CK/par" --engine omni --label stage0-fp8 --out "$R" --quantization fp8 --codes
python3 -m vllm_omni_kani.benchmarks.step_time --compare "$R/stage0.json" "$R/stage0-fp8.json" --out "$R" --label agreement-fp8
pack 3
