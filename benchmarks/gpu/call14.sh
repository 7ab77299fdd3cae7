#!/usr/bin/env bash
# GPU call 14 (nvidia-h200-x2, right after staging; call 13 found a fresh machine and did not run): where the first
# audio of one stream waits, in one call. Stage 0 eager (starts in about a minute; the ~200 ms hold showed with it
# eager too), KANI_TRACE_CHUNKS=1, eight requests one at a time on each of two servers:
#   GPU 0: chunks 3 / 16, no ramp                                  GPU 1: the shipped ramp (16 -> 64)
source benchmarks/gpu/common.sh
python3 -m vllm_omni_kani.tools.make_checkpoint "$CK/par" --preset 350m --variant parallel --force | tail -1
Y=/tmp/kani-yaml; mkdir -p "$Y"
V() { python3 -m vllm_omni_kani.benchmarks.variants stage_configs/kani_tts.yaml "$Y/$1.yaml" "${@:2}"; }
V trace-no-ramp stages.0.enforce_eager=true connectors.shm.extra.max_codec_chunk_frames=16
V trace-ramp stages.0.enforce_eager=true
cp "$Y"/trace-*.yaml "$R/"
W="--warmup 4 --out $R --concurrency 1 --requests 8"
step trace-no-ramp 330 env KANI_TRACE_CHUNKS=1 CUDA_VISIBLE_DEVICES=0 VLLM_CACHE_ROOT=/tmp/vc0 python3 -m \
  vllm_omni_kani.cli bench --serve "$CK/par" --deploy-config "$Y/trace-no-ramp.yaml" --label trace-no-ramp $W &
sleep 5
step trace-ramp 330 env KANI_TRACE_CHUNKS=1 CUDA_VISIBLE_DEVICES=1 VLLM_CACHE_ROOT=/tmp/vc1 python3 -m \
  vllm_omni_kani.cli bench --serve "$CK/par" --deploy-config "$Y/trace-ramp.yaml" --label trace-ramp $W &
wait
grep -h "kani trace" "$R"/serve-trace-*.log | tail -n 5
tar -C /tmp -czf "$OUT/results-14.tgz" kani-results
