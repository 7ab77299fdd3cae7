#!/usr/bin/env bash
# The GPU suite for a one-GPU machine (nvidia-h200, or nvidia-h100-x1 with the same commands; compare timings only
# between runs on the same kind). Everything runs on GPU 0, one job at a time.
#   bash benchmarks/gpu/h200.sh [--quick] PHASE...
# Stage the bundle first (../shared/device/build_bundle.sh, then one device call per part with stage.sh) and send
# the phases back to back: /tmp (stack, checkpoints, compile caches) lasts only while the machine stays held.
#   codec    checkpoints; Stage 1 alone (windows vs stateful, per precision, SNR); the CUDA-only tests
#   shipped  the shipped kani_tts.yaml served with 64- and 250-frame requests
#   flat     the flattened baseline served with the same YAML; the Stage-0 step, ours vs stock
source "$(dirname "$0")/lib.sh"
quick=0
if [ "${1:-}" = "--quick" ]; then quick=1; shift; fi
if [ $quick = 1 ]; then
  SHORT=64:1,64,256; LONG=250:64,256; PRECISIONS="fp32 tf32"
else
  SHORT=64:1,10,64,128,256; LONG=250:1,64,128,256; PRECISIONS="fp32 tf32 bf16 fp16"
fi

for phase in "$@"; do
  case $phase in
    codec)
      device_info
      checkpoints
      # shellcheck disable=SC2086
      step codec-streaming 420 python3 benchmarks/bench_codec_streaming.py --device cuda --batches 64 128 256 \
        --chunks 16 64 --precisions $PRECISIONS --out "$R"
      step cuda-tests 150 python3 -m pytest -q -p no:cacheprovider tests/test_codec_streaming.py \
        tests/test_codec_graphs.py -k "graph"
      pack codec ;;
    shipped)
      checkpoints
      serve_sweeps 0 shipped "$CK/par" stage_configs/kani_tts.yaml 540 $SHORT $LONG
      cleanup
      pack shipped ;;
    flat)
      checkpoints
      serve_sweeps 0 flattened "$CK/flat" stage_configs/kani_tts.yaml 420 $SHORT $LONG
      cleanup
      step stock 200 python3 -m vllm_omni_kani.benchmarks.step_time "$CK/flat" --engine vllm --label stock \
        --out "$R" --sampled
      step stage0 240 python3 -m vllm_omni_kani.benchmarks.step_time "$CK/par" --engine omni --label stage0 \
        --out "$R" --sampled --codes
      pack flat ;;
    *) echo "unknown phase $phase (codec, shipped, flat)"; exit 2 ;;
  esac
done
