#!/usr/bin/env bash
# GPU call 13 (nvidia-h200-x2, after call 12, warm caches): where the first audio of one stream waits. Two servers
# with KANI_TRACE_CHUNKS=1 (one log line per chunk Stage 0 emits and per codec step, with wall-clock times),
# eight requests one at a time each:
#   GPU 0: chunks 3 / 16, no ramp (first audio 205-265 ms in the second set)   GPU 1: the shipped ramp (46 ms)
source benchmarks/gpu/common.sh
Y=/tmp/kani-yaml
W="--warmup 4 --out $R --concurrency 1 --requests 8"
step trace-no-ramp 400 env KANI_TRACE_CHUNKS=1 CUDA_VISIBLE_DEVICES=0 VLLM_CACHE_ROOT=/tmp/vc0 python3 -m \
  vllm_omni_kani.cli bench --serve "$CK/par" --deploy-config "$Y/no-ramp.yaml" --label trace-no-ramp $W &
sleep 5
step trace-ramp 400 env KANI_TRACE_CHUNKS=1 CUDA_VISIBLE_DEVICES=1 VLLM_CACHE_ROOT=/tmp/vc1 python3 -m \
  vllm_omni_kani.cli bench --serve "$CK/par" --deploy-config stage_configs/kani_tts.yaml --label trace-ramp $W &
wait
grep -h "kani trace" "$R"/serve-trace-*.log | tail -n 5
pack 13
