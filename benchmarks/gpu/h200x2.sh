#!/usr/bin/env bash
# The GPU suite for an nvidia-h200-x2 machine (two H200s; one server or job per GPU at a time, so two run at once).
#   bash benchmarks/gpu/h200x2.sh [--quick] PHASE...
# Stage the bundle first (../shared/device/build_bundle.sh, then one device call per part with stage.sh); the
# machine keeps /tmp (stack, checkpoints, compile caches) only while it stays held, so send the phases back to back.
# Each phase fits one 10-minute device call; --quick shortens the sweeps (levels 1,64,256; 250-frame 64,256).
#   codec   checkpoints; Stage 1 alone (windows vs stateful, per precision, SNR) on GPU 1 and the CUDA-only tests,
#           while GPU 0 serves the shipped kani_tts.yaml (64- and 250-frame requests)      -> docs/BENCHMARKS.md
#   flat    the flattened baseline served with the same YAML (GPU 1) and the Stage-0 step, ours vs stock (GPU 0)
#   twogpu  the one-stage-per-GPU file, kani_tts_2gpu.yaml (both GPUs)
#   replicas  scale-out on vLLM-Omni's own machinery (both GPUs, 250-frame requests at 64 and 256 streams): Stage 0
#           on GPU 0 with two Stage-1 replicas on GPU 1 (kani_tts_codec_replicas.yaml), then two full pipelines
#           data-parallel behind one API server (kani_tts_dp.yaml); the one-GPU reference is the codec phase's
#           shipped run, so send `codec replicas` back to back                                      -> docs/DEPLOY.md
source "$(dirname "$0")/lib.sh"
quick=0
if [ "${1:-}" = "--quick" ]; then quick=1; shift; fi
if [ $quick = 1 ]; then
  SHORT=64:1,64,256; LONG=250:64,256
else
  SHORT=64:1,10,64,128,256; LONG=250:1,64,128,256
fi

for phase in "$@"; do
  case $phase in
    codec)
      device_info
      checkpoints
      serve_sweeps 0 shipped "$CK/par" stage_configs/kani_tts.yaml 540 $SHORT $LONG &
      ( step codec-streaming 420 env CUDA_VISIBLE_DEVICES=1 python3 benchmarks/bench_codec_streaming.py \
          --device cuda --batches 64 128 256 --chunks 16 64 --out "$R"
        step cuda-tests 150 env CUDA_VISIBLE_DEVICES=1 python3 -m pytest -q -p no:cacheprovider \
          tests/test_codec_streaming.py tests/test_codec_graphs.py -k "graph" ) &
      wait; cleanup
      pack codec ;;
    flat)
      checkpoints
      serve_sweeps 1 flattened "$CK/flat" stage_configs/kani_tts.yaml 540 $SHORT $LONG &
      ( step stock 200 env CUDA_VISIBLE_DEVICES=0 python3 -m vllm_omni_kani.benchmarks.step_time "$CK/flat" \
          --engine vllm --label stock --out "$R" --sampled
        step stage0 240 env CUDA_VISIBLE_DEVICES=0 python3 -m vllm_omni_kani.benchmarks.step_time "$CK/par" \
          --engine omni --label stage0 --out "$R" --sampled --codes ) &
      wait; cleanup
      pack flat ;;
    twogpu)
      checkpoints
      step cuda-tests 150 python3 -m pytest -q -p no:cacheprovider tests/test_codec_streaming.py \
        tests/test_codec_graphs.py -k "graph"
      serve_sweeps 0,1 shipped-2gpu "$CK/par" stage_configs/kani_tts_2gpu.yaml 540 $SHORT $LONG
      cleanup
      pack twogpu ;;
    replicas)
      checkpoints
      serve_sweeps 0,1 codec-replicas "$CK/par" stage_configs/kani_tts_codec_replicas.yaml 290 250:64,256
      cleanup
      serve_sweeps 0,1 dp "$CK/par" stage_configs/kani_tts_dp.yaml 290 250:64,256
      cleanup
      pack replicas ;;
    *) echo "unknown phase $phase (codec, flat, twogpu, replicas)"; exit 2 ;;
  esac
done
