#!/usr/bin/env bash
# GPU call 12 (nvidia-h200-x2, after call 11): the served runs again with the Stage-0 producer that closes a stream
# only on the finish flag of its step (4c47ab6); the first set of these rows lost audio under load.
#   GPU 0: the shipped stage_configs/kani_tts.yaml (chunk ramp 16 -> 64), parallel-head 350m
#   GPU 1: the flattened 350m checkpoint through the same pipeline and YAML (the flattened baseline, served)
source benchmarks/gpu/common.sh
W="--warmup 64 --out $R --e2e --concurrency 1,10,64,128,256"
step shipped-ramp 560 env CUDA_VISIBLE_DEVICES=0 VLLM_CACHE_ROOT=/tmp/vc0 python3 -m vllm_omni_kani.cli bench \
  --serve "$CK/par" --deploy-config stage_configs/kani_tts.yaml --label shipped-ramp $W &
sleep 5
step flattened-ramp 560 env CUDA_VISIBLE_DEVICES=1 VLLM_CACHE_ROOT=/tmp/vc1 python3 -m vllm_omni_kani.cli bench \
  --serve "$CK/flat" --deploy-config stage_configs/kani_tts.yaml --label flattened-ramp $W &
wait
pack 12
