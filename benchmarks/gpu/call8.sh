#!/usr/bin/env bash
# GPU call 8 (nvidia-h200-x2, after call 6): one-knob variants of the shipped kani_tts.yaml (made by call 6), two
# one-GPU servers at a time as in call 7, then Stage 0 eager next to the flattened checkpoint's Stage-0 step time
# through vLLM-Omni's LM-only path (separates the Omni engine's per-step cost from our heads).
#   GPU 0: codec_chunk_frames=64                                  GPU 1: codec_chunk_frames=16, max_codec_chunk_frames=64
#   GPU 0: stages.0.enforce_eager=true                            GPU 1: step_time flattened --engine omni
# As run: the two chunk servers took 253 / 286 s (startup 186 / 219 s, codec graphs for frames up to 96 included),
# so the second half was skipped at 304 s; call10.sh ran it.
source benchmarks/gpu/common.sh
Y=/tmp/kani-yaml
W="--warmup 64 --out $R --e2e --concurrency 1,64,256"
for v in chunks-c64 chunks-ramp16-64 stage0-eager; do cp "$Y/$v.yaml" "$R/"; done
step chunks-c64 290 env CUDA_VISIBLE_DEVICES=0 VLLM_CACHE_ROOT=/tmp/vc0 python3 -m vllm_omni_kani.cli bench --serve "$CK/par" \
  --deploy-config "$Y/chunks-c64.yaml" --label chunks-c64 $W &
sleep 5
step chunks-ramp16-64 290 env CUDA_VISIBLE_DEVICES=1 VLLM_CACHE_ROOT=/tmp/vc1 python3 -m vllm_omni_kani.cli bench --serve "$CK/par" \
  --deploy-config "$Y/chunks-ramp16-64.yaml" --label chunks-ramp16-64 $W &
wait
pack 8
if [ "$SECONDS" -lt 300 ]; then
  step stage0-eager 240 env CUDA_VISIBLE_DEVICES=0 VLLM_CACHE_ROOT=/tmp/vc0 python3 -m vllm_omni_kani.cli bench --serve "$CK/par" \
    --deploy-config "$Y/stage0-eager.yaml" --label stage0-eager $W &
  sleep 5
  step stage0-flat-omni 240 env CUDA_VISIBLE_DEVICES=1 VLLM_CACHE_ROOT=/tmp/vc1 python3 -m vllm_omni_kani.benchmarks.step_time \
    "$CK/flat" --engine omni --label stage0-flat-omni --out "$R" --sampled &
  wait
else
  echo "[stage0-eager, stage0-flat-omni] skipped: out of time ($SECONDS s)"
fi
pack 8
