#!/usr/bin/env bash
# The GPU suite for a two-GPU machine (nvidia-h200-x2, or nvidia-h100-x2 with the same commands; compare timings only
# between runs on the same kind): one server or job per GPU at a time, so two run at once.
#   bash benchmarks/gpu/h200x2.sh [--quick] PHASE...
# Stage the bundle first (../shared/device/build_bundle.sh, benchmarks/gpu/fit_bundle.sh, then one device call per
# part with stage.sh); the machine keeps /tmp (stack, checkpoints, compile caches) only while it stays held, so send
# the phases back to back.
# A server's first start on a fresh machine takes about 4 minutes (compile, memory profiling, graph capture: 244 s
# measured), so a served step needs a limit of 420 s or more. Each phase fits one 10-minute device call; --quick shortens the sweeps (levels 1,64,256; 250-frame 64,256).
#   codec   checkpoints; Stage 1 alone (windows vs stateful, per precision, SNR) on GPU 1 and the CUDA-only tests,
#           while GPU 0 serves the shipped kani_tts.yaml (64- and 250-frame requests)      -> docs/BENCHMARKS.md
#   flat    the flattened baseline served with the same YAML (GPU 1) and the Stage-0 step, ours vs stock (GPU 0)
#   twogpu  the one-stage-per-GPU file, kani_tts_2gpu.yaml (both GPUs)
#   profile  the shipped YAML under 256 streams of 250 frames profiled on GPU 0 (benchmarks/gpu/profile_served.py:
#           CPU per process and thread, py-spy stacks), while GPU 1 serves the same YAML unprofiled at 64 and 256
#           streams of 250 frames: the one-GPU reference of the scale-out phases                 -> docs/BENCHMARKS.md
#   asyncsched  the shipped YAML with Stage 0's async scheduling on (deferred output building off) on GPU 0, the
#           shipped YAML as is on GPU 1 (the reference of the same call): 250-frame requests at 64 and 256 streams,
#           and audio == Stage-0 frames for both
#   codecreplicas  scale-out on vLLM-Omni's own machinery (both GPUs, 250-frame requests at 64 and 256 streams):
#           one Stage 0 with a Stage-1 replica on each GPU (kani_tts_codec_replicas.yaml)          -> docs/DEPLOY.md
#   dp      two full pipelines data-parallel behind one API server (kani_tts_dp.yaml), the same requests
#           (a fresh machine took 323 s to start it: DP_LIMIT_S, default 540)
#   dp4     dp with two Stage-0 engines on each GPU, as kani_tts.yaml runs them on one (kani_tts_dp.yaml with Stage 0's
#           num_replicas 4 on devices 0,1,0,1, written as stage_configs/kani_tts_dp4.yaml): the same requests, audio vs
#           frames; send after onegpu for the one-GPU reference of the same instance (DP4_SWEEP: another sweep, e.g.
#           250:64,256,512 adds each GPU's 256 streams; DP_SWEEP the same for dp)
#   WAVES=N  onegpu, dp and dp4 send N requests per stream at each level instead of bench's 2: a steadier figure
#           (two waves of 512 streams are ~14 s, the first wave's admission and the last one's tail a large share)
#   replicas  codecreplicas, then dp (one call of up to 10 minutes)
#   onegpu  the shipped YAML on each GPU at once, 250-frame requests at 64 and 256 streams: the one-GPU reference of
#           a dp call on the same instance, twice; audio vs frames for both
#   coalesce  Stage 0's outputs every kani_output_every_steps steps (shipped, GPU 0) against every step (GPU 1), at
#           once: 250-frame requests at 64 and 256 streams, audio vs frames for both; with dp after it, the one-GPU
#           reference of the same code
#   lmab    one Stage-0 engine beside the codec (kani_tts_one_lm.yaml, GPU 1) against the shipped file (two, GPU 0),
#           at once: 250-frame requests at 64 and 256 streams, audio vs frames for both
#   steps   py-spy of the Stage-0 step at batch 256 held steady, stock vs ours, on GPU 0 (spy_step), then the codec
#           graphs' memory under vLLM's load-time allocator limit, lifted and not (memory_steps); meanwhile GPU 1
#           times the step at every batch size, stock vs ours, sampled (stage0_steps); last on GPU 0, the host cost
#           of the code heads' seeded noise and of vLLM's penalty tokens (benchmarks/sampling_host.py)
#   kernels  the Stage-0 step at batch 256, greedy and sampled, under vLLM's torch profiler (step_time
#           --torch-profile): stock vLLM LFM2 on GPU 0, ours on GPU 1; tables of kernels by device time
#   altab   a code A/B at once on one host: GPU 0 serves the tree's package, GPU 1 the carried .devsrc/alt.tar's
#           (lib.sh alt_root; .devsrc/alt-commit says what it is, e.g. HEAD with changes reverted), the shipped YAML at 64 and 256 streams of 250 frames, audio vs frames for both
#   mps     the shipped YAML on GPU 0 under an MPS daemon of that GPU only (Stage 0 and the codec run kernels at
#           once instead of time-slicing the GPU), the shipped YAML as is on GPU 1: 250 frames at 64 and 256 streams
source "$(dirname "$0")/lib.sh"
quick=0
if [ "${1:-}" = "--quick" ]; then quick=1; shift; fi
if [ $quick = 1 ]; then
  SHORT=64:1,64,256; LONG=250:64,256; MPS_SWEEP=250:256
else
  SHORT=64:1,10,64,128,256; LONG=250:1,64,128,256; MPS_SWEEP=250:64,256
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
    profile)
      device_info
      checkpoints
      step profile 420 env CUDA_VISIBLE_DEVICES=0 VLLM_CACHE_ROOT=/tmp/vc0 python3 benchmarks/gpu/profile_served.py \
        --ckpt "$CK/par" --deploy-config stage_configs/kani_tts.yaml --out "$R/profile" --frames 250 --streams 256 &
      serve_sweeps 1 shipped-1gpu "$CK/par" stage_configs/kani_tts.yaml 420 250:64,256 &
      wait; cleanup
      frames_check shipped-1gpu
      pack profile ;;
    asyncsched)
      checkpoints
      # Async scheduling alone: vLLM-Omni's deferred output building (kani_async_omni_output) stays off.
      variant kani_tts_async_sched stages.0.async_scheduling=true
      serve_sweeps 0 async-sched "$CK/par" stage_configs/kani_tts_async_sched.yaml 420 250:64,256 &
      serve_sweeps 1 shipped-1gpu "$CK/par" stage_configs/kani_tts.yaml 420 250:64,256 &
      wait; cleanup
      frames_check async-sched
      frames_check shipped-1gpu
      pack asyncsched ;;
    coalesce)
      # Stage 0's outputs sent every kani_output_every_steps steps (the shipped default, GPU 0) against every step
      # (GPU 1), at once on one host: 250-frame requests at 64 and 256 streams, audio vs frames for both.
      checkpoints
      variant kani_tts_every_step stages.0.additional_config.kani_output_every_steps=1
      serve_sweeps 0 coalesced "$CK/par" stage_configs/kani_tts.yaml 450 250:64,256 &
      serve_sweeps 1 every-step "$CK/par" stage_configs/kani_tts_every_step.yaml 450 250:64,256 &
      wait; cleanup
      frames_check coalesced
      frames_check every-step
      step_rates
      pack coalesce ;;
    onegpu)
      checkpoints
      serve_sweeps 0 shipped-gpu0 "$CK/par" stage_configs/kani_tts.yaml 450 ${WAVES:+--waves $WAVES} 250:64,256 &
      serve_sweeps 1 shipped-gpu1 "$CK/par" stage_configs/kani_tts.yaml 450 ${WAVES:+--waves $WAVES} 250:64,256 &
      wait; cleanup
      frames_check shipped-gpu0
      frames_check shipped-gpu1
      step_rates
      pack onegpu ;;
    lmab)
      # One Stage-0 engine beside the codec (kani_tts_one_lm.yaml, GPU 1) against the shipped file (two, GPU 0), at
      # once: 250-frame requests at 64 and 256 streams, audio vs frames for both.
      checkpoints
      serve_sweeps 0 shipped "$CK/par" stage_configs/kani_tts.yaml 450 250:64,256 &
      serve_sweeps 1 one-lm "$CK/par" stage_configs/kani_tts_one_lm.yaml 470 250:64,256 &
      wait; cleanup
      frames_check shipped
      frames_check one-lm
      step_rates
      pack lmab ;;
    codecreplicas|dp|replicas)
      checkpoints
      if [ "$phase" != dp ]; then
        serve_sweeps 0,1 codec-replicas "$CK/par" stage_configs/kani_tts_codec_replicas.yaml 330 250:64,256
        cleanup
        frames_check codec-replicas
      fi
      if [ "$phase" != codecreplicas ]; then
        serve_sweeps 0,1 dp "$CK/par" stage_configs/kani_tts_dp.yaml "${DP_LIMIT_S:-540}" ${WAVES:+--waves $WAVES} \
          "${DP_SWEEP:-250:64,256}"
        cleanup
        frames_check dp
      fi
      step_rates
      pack "$phase" ;;
    dp4)
      checkpoints
      dp4_variant kani_tts_dp4
      serve_sweeps 0,1 dp4 "$CK/par" stage_configs/kani_tts_dp4.yaml "${DP_LIMIT_S:-540}" ${WAVES:+--waves $WAVES} \
        "${DP4_SWEEP:-250:64,256}"
      cleanup
      frames_check dp4
      step_rates
      pack dp4 ;;
    steps)
      checkpoints
      ( export CUDA_VISIBLE_DEVICES=0 VLLM_CACHE_ROOT=/tmp/vc0
        spy_step stock-step vllm "$CK/flat"
        spy_step stage0-step omni "$CK/par"
        memory_steps
        step sampling-host 120 python3 benchmarks/sampling_host.py --device cuda --out "$R" ) &
      ( export CUDA_VISIBLE_DEVICES=1 VLLM_CACHE_ROOT=/tmp/vc1
        stage0_steps ) &
      wait; cleanup
      pack steps ;;
    kernels)
      checkpoints
      ( export CUDA_VISIBLE_DEVICES=0 VLLM_CACHE_ROOT=/tmp/vc0; kernel_tables stock-kernels vllm "$CK/flat" 420 ) &
      ( export CUDA_VISIBLE_DEVICES=1 VLLM_CACHE_ROOT=/tmp/vc1; kernel_tables stage0-kernels omni "$CK/par" 420 ) &
      wait; cleanup
      pack kernels ;;
    mps)
      checkpoints
      if command -v nvidia-cuda-mps-control > /dev/null; then
        ( export CUDA_VISIBLE_DEVICES=0 CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
          mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
          nvidia-cuda-mps-control -d && echo "MPS daemon started on GPU 0"
          serve_sweeps 0 mps "$CK/par" stage_configs/kani_tts.yaml 420 $MPS_SWEEP
          echo quit | nvidia-cuda-mps-control
          cp -r "$CUDA_MPS_LOG_DIRECTORY" "$R/mps-log" 2>/dev/null ) &
        serve_sweeps 1 shipped-1gpu "$CK/par" stage_configs/kani_tts.yaml 420 $MPS_SWEEP &
        wait; cleanup
        frames_check mps
        frames_check shipped-1gpu
      else
        echo "no nvidia-cuda-mps-control on this machine" | tee "$R/mps-missing.txt"
      fi
      pack mps ;;
    altab)
      checkpoints
      alt_root || exit 2
      serve_sweeps 0 tree "$CK/par" stage_configs/kani_tts.yaml 480 250:64,256 &
      alt_sweeps 1 alt "$CK/par" stage_configs/kani_tts.yaml 480 250:64,256 &
      wait; cleanup
      frames_check tree
      frames_check alt
      step_rates
      pack altab ;;
    *) echo "unknown phase $phase (see the list at the top)"; exit 2 ;;
  esac
done
