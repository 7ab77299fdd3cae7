#!/usr/bin/env bash
# GPU call 10 (nvidia-h200-x2, right after call 8): call 8's second half, which call 8 skipped at 304 s.
#   GPU 0: stages.0.enforce_eager=true (the variant call 6 made; codec graphs unchanged), swept at 1, 64, 256
#   GPU 1: Stage-0 step time of the flattened checkpoint through vLLM-Omni's LM-only path (greedy and sampled)
# (Run as one inline command of the same steps.)
source benchmarks/gpu/common.sh
Y=/tmp/kani-yaml
step stage0-eager 220 env CUDA_VISIBLE_DEVICES=0 VLLM_CACHE_ROOT=/tmp/vc0 python3 -m vllm_omni_kani.cli bench --serve "$CK/par" \
  --deploy-config "$Y/stage0-eager.yaml" --label stage0-eager --warmup 64 --out "$R" --e2e --concurrency 1,64,256 &
sleep 2
step stage0-flat-omni 220 env CUDA_VISIBLE_DEVICES=1 VLLM_CACHE_ROOT=/tmp/vc1 python3 -m vllm_omni_kani.benchmarks.step_time \
  "$CK/flat" --engine omni --label stage0-flat-omni --out "$R" --sampled &
wait
pack 10
