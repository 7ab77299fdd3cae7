#!/usr/bin/env bash
# GPU call 9 (nvidia-h200-x2, right after call 7 on the same machine): call 7's first half again with longer limits.
# In call 7 both servers were still starting at 290 s (cold vLLM, Triton and FlashInfer caches, two starts at once)
# and were killed before sweeping; now the caches under /tmp were warm and both became healthy in 131 / 154 s.
#   GPU 0: the shipped stage_configs/kani_tts.yaml (async scheduling off), parallel-head 350m
#   GPU 1: the flattened 350m checkpoint through the same pipeline and YAML (the flattened baseline, served)
# (Run as one inline command of the same steps; the package is the committed one, see common.sh.)
source benchmarks/gpu/common.sh
W="--warmup 64 --out $R --e2e"
step shipped 480 env CUDA_VISIBLE_DEVICES=0 VLLM_CACHE_ROOT=/tmp/vc0 python3 -m vllm_omni_kani.cli bench --serve "$CK/par" \
  --deploy-config stage_configs/kani_tts.yaml --label shipped --concurrency 1,10,64,128,256 $W &
sleep 5
step flattened 480 env CUDA_VISIBLE_DEVICES=1 VLLM_CACHE_ROOT=/tmp/vc1 python3 -m vllm_omni_kani.cli bench --serve "$CK/flat" \
  --deploy-config stage_configs/kani_tts.yaml --label flattened --concurrency 1,10,64,128,256 $W &
wait
pack 9
