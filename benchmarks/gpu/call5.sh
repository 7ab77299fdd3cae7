#!/usr/bin/env bash
# GPU call 5 (fresh machine, after staging): the shipped kani_tts.yaml alone (async scheduling off), e2e + sweep.
source benchmarks/gpu/common.sh
step ckpt-par 60 python3 -m vllm_omni_kani.tools.make_checkpoint "$CK/par" --preset 350m --variant parallel --force
step serve-shipped 330 python3 -m vllm_omni_kani.cli bench --serve "$CK/par" --deploy-config stage_configs/kani_tts.yaml \
  --label shipped --concurrency 1,64,128,256 --out "$R" --e2e --deploy-config-note stage_configs/kani_tts.yaml
pack 5
