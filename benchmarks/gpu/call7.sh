#!/usr/bin/env bash
# GPU call 7 (nvidia-h200-x2, after call 6): two one-GPU servers at once, one per GPU (CUDA_VISIBLE_DEVICES=0 / 1:
# vLLM-Omni maps each stage's `devices: "0"` onto the visible GPU and locks the physical one, so the two starts do
# not wait on each other), each swept alone on its GPU with its own vLLM cache; then the two-GPU file on both.
#   GPU 0: the shipped stage_configs/kani_tts.yaml (async scheduling off), parallel-head 350m
#   GPU 1: the flattened 350m checkpoint through the same pipeline and YAML (the flattened baseline, served)
#   then:  stage_configs/kani_tts_2gpu.yaml (Stage 0 on GPU 0, Stage 1 on GPU 1), parallel-head 350m
# As run: the first two were still starting at 290 s (a cold machine: vLLM's compile cache, Triton and FlashInfer
# kernels built for the first time, two starts at once; Stage 0's init alone took 122 s) and were killed unswept;
# the two-GPU server then started on warm caches in 156 s and was swept. call9.sh repeated the first half.
source benchmarks/gpu/common.sh
W="--warmup 64 --out $R --e2e"
step shipped 290 env CUDA_VISIBLE_DEVICES=0 VLLM_CACHE_ROOT=/tmp/vc0 python3 -m vllm_omni_kani.cli bench --serve "$CK/par" \
  --deploy-config stage_configs/kani_tts.yaml --label shipped --concurrency 1,10,64,128,256 $W &
sleep 5
step flattened 290 env CUDA_VISIBLE_DEVICES=1 VLLM_CACHE_ROOT=/tmp/vc1 python3 -m vllm_omni_kani.cli bench --serve "$CK/flat" \
  --deploy-config stage_configs/kani_tts.yaml --label flattened --concurrency 1,10,64,128,256 $W &
wait
pack 7
if [ "$SECONDS" -lt 330 ]; then
  step shipped-2gpu 240 env VLLM_CACHE_ROOT=/tmp/vc0 python3 -m vllm_omni_kani.cli bench --serve "$CK/par" \
    --deploy-config stage_configs/kani_tts_2gpu.yaml --label shipped-2gpu --concurrency 1,64,128,256 $W
else
  echo "[shipped-2gpu] skipped: out of time ($SECONDS s)"
fi
pack 7
