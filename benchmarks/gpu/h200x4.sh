#!/usr/bin/env bash
# The GPU suite for a four-GPU machine (nvidia-h200-x4): two two-GPU servers at once on one host, so a change is
# measured against its absence under the same load, machine and minute.
#   bash benchmarks/gpu/h200x4.sh PHASE...
# Stage the bundle first (as for h200.sh / h200x2.sh). Each server is h200x2.sh's dp4 (kani_tts_dp.yaml with Stage 0's
# num_replicas 4 on devices 0,1,0,1: two Stage-0 engines and a codec on each of its GPUs, one API server); the first
# side runs on GPUs 0,1 and the second on 2,3, or the other way round with AB_SWAP=1. A fresh machine starts both in
# about 6 minutes: DP_LIMIT_S (default 560) bounds each side's server and sweeps.
#   pcm16ab    the codec's audio as 16-bit PCM (codec_pcm16_audio, shipped) against float32 audio encoded in the API
#              server: DP4_SWEEP (default 250:256,512), WAVES requests per stream (default 4), audio vs frames for both
#   scale      dp4 on GPUs 0,1 beside the shipped kani_tts.yaml on GPU 2 and the same with float32 codec audio on GPU 3:
#              two GPUs against one, and the codec_pcm16_audio A/B on one GPU (ONE_SWEEP, default 250:128,256)
#   onegpu4    four one-GPU servers at once: kani_tts.yaml on GPUs 0 and 3, with float32 codec audio on GPU 1, without the
#              /dev/shm listing on GPU 2; ONE4_SWEEPS (default "64:1,64,256 250:64,256"), ONE4_LIMIT_S (560)
#   firstchunk four one-GPU servers at once: kani_tts.yaml on GPUs 0 and 3, initial_codec_chunk_frames 1 on GPU 1
#              and 2 on GPU 2 (shipped: 3); ONE4_SWEEPS, ONE4_LIMIT_S as onegpu4
#   mainswitch four one-GPU servers at once: kani_tts.yaml on GPUs 0 and 3, with the API server's GIL switch
#              interval at 1 ms (GPU 1) and 0.5 ms (GPU 2) (KANI_MAIN_GIL_SWITCH_INTERVAL_MS); ONE4_SWEEPS, ONE4_LIMIT_S
#   replicareads  four one-GPU servers at once: kani_tts.yaml on GPUs 0 and 3 (the orchestrator's output polls answered
#              by one pending read per replica, wait_for_replica_outputs, shipped), and with vLLM-Omni's 1-ms polls
#              (KANI_DISABLE_PATCHES) on GPUs 1 and 2; ONE4_SWEEPS, ONE4_LIMIT_S; first_wave.py for each
#   apiwakes   four one-GPU servers at once: kani_tts.yaml with KANI_WAKE_ON_FINAL_OUTPUTS=1 (the API server's output
#              task woken by the orchestrator's put) on GPUs 0 and 3, as shipped on GPU 1 (its 1-ms poll), and with
#              vLLM-Omni's 1-ms polls at both ends of the orchestrator (KANI_DISABLE_PATCHES=wait_for_replica_outputs)
#              on GPU 2; ONE4_SWEEPS, ONE4_LIMIT_S; first_wave.py for each
#   listingab  the receiving connector's polls answered from one /dev/shm listing (poll_shm_chunks_from_one_listing,
#              shipped) against vLLM-Omni's failed open per pending chunk (KANI_DISABLE_PATCHES), the same sweeps
source "$(dirname "$0")/lib.sh"

# float_codec_config: Stage 1's shipped additional_config with float32 audio (codec_pcm16_audio false), as JSON; an
# overlay replaces additional_config whole, so the variant carries the whole block.
float_codec_config() {
  python3 -c "import json, yaml
c = yaml.safe_load(open('stage_configs/kani_tts.yaml'))['stages'][1]['additional_config']
print(json.dumps({**c, 'codec_pcm16_audio': False}))"
}

# ab_pair LABEL_A YAML_A ENV_A LABEL_B YAML_B ENV_B: both servers at once (ENV_x: "NAME=VALUE ..." or "-"), then the
# audio checks and the step meters of both.
ab_pair() {
  local gpus_a=0,1 gpus_b=2,3 sweep=${DP4_SWEEP:-250:256,512} limit=${DP_LIMIT_S:-560}
  [ "${AB_SWAP:-0}" = 1 ] && { gpus_a=2,3; gpus_b=0,1; }
  echo "$1 on GPUs $gpus_a, $4 on GPUs $gpus_b; $sweep, ${WAVES:-4} requests per stream" | tee "$R/ab-$1-$4.txt"
  # shellcheck disable=SC2086
  ( [ "$3" != - ] && export $3; serve_sweeps "$gpus_a" "$1" "$CK/par" "$2" "$limit" --waves "${WAVES:-4}" "$sweep" ) &
  # shellcheck disable=SC2086
  ( [ "$6" != - ] && export $6; serve_sweeps "$gpus_b" "$4" "$CK/par" "$5" "$limit" --waves "${WAVES:-4}" "$sweep" ) &
  wait; cleanup
  frames_check "$1"
  frames_check "$4"
  step_rates
}

# four_servers "GPU LABEL ENV YAML_NAME" x4: one one-GPU server a GPU, all at once (ENV: "NAME=VALUE" or "-"), each
# through the ONE4_SWEEPS levels; then the audio checks and the step meters of all four.
four_servers() {
  local side sweeps=${ONE4_SWEEPS:-64:1,64,256 250:64,256} labels=()
  for side in "$@"; do
    # shellcheck disable=SC2086
    set -- $side
    labels+=("$2")
    # shellcheck disable=SC2086
    ( [ "$3" != - ] && export $3; serve_sweeps "$1" "$2" "$CK/par" "stage_configs/$4.yaml" "${ONE4_LIMIT_S:-560}" \
        --waves "${WAVES:-4}" $sweeps ) &
  done
  wait; cleanup
  for side in "${labels[@]}"; do frames_check "$side"; done
  step_rates
}

# first_waves LABEL...: first_wave.py for each server's sweeps (how each level's first wave got to Stage 0).
first_waves() {
  local side f
  for side in "$@"; do
    for f in "$R/$side"-f*.json; do
      [ -e "$f" ] && python3 benchmarks/first_wave.py "$R/serve-$side.log" "$f" > "$R/first-wave-$(basename "$f" .json).txt"
    done
  done
}

for phase in "$@"; do
  case $phase in
    pcm16ab)
      device_info
      checkpoints
      dp4_variant kani_tts_dp4
      # additional_config is replaced whole by an overlay: the shipped block with the one key changed.
      dp4_variant kani_tts_dp4_float "stages.1.additional_config=$(float_codec_config)"
      ab_pair pcm16 stage_configs/kani_tts_dp4.yaml - float stage_configs/kani_tts_dp4_float.yaml -
      pack pcm16ab ;;
    scale)
      # Two GPUs against one on the same host and minute: dp4 (shipped, GPUs 0,1) beside kani_tts.yaml on GPU 2 and
      # kani_tts.yaml with float32 codec audio on GPU 3 (the one-GPU codec_pcm16_audio A/B). A machine that ran a
      # dp4 phase lends its compile caches to the one-GPU servers.
      checkpoints
      dp4_variant kani_tts_dp4
      variant kani_tts_float "stages.1.additional_config=$(float_codec_config)"
      for n in 2 3; do [ -e /tmp/vc$n ] || cp -r /tmp/vc2,3 /tmp/vc$n 2> /dev/null; done
      serve_sweeps 0,1 dp4 "$CK/par" stage_configs/kani_tts_dp4.yaml "${DP_LIMIT_S:-560}" --waves "${WAVES:-4}" \
        "${DP4_SWEEP:-250:256,512}" &
      serve_sweeps 2 onegpu "$CK/par" stage_configs/kani_tts.yaml "${DP_LIMIT_S:-560}" --waves "${WAVES:-4}" \
        "${ONE_SWEEP:-250:128,256}" &
      serve_sweeps 3 onegpu-float "$CK/par" stage_configs/kani_tts_float.yaml "${DP_LIMIT_S:-560}" \
        --waves "${WAVES:-4}" "${ONE_SWEEP:-250:128,256}" &
      wait; cleanup
      for side in dp4 onegpu onegpu-float; do frames_check $side; done
      step_rates
      pack scale ;;
    firstchunk)
      # The first codec chunk's frames against TTFA in waves: every side the shipped file but for that one key.
      device_info
      checkpoints
      variant kani_tts_first1 "connectors.shm.extra.initial_codec_chunk_frames=1"
      variant kani_tts_first2 "connectors.shm.extra.initial_codec_chunk_frames=2"
      four_servers "0 shipped - kani_tts" "1 first1 - kani_tts_first1" "2 first2 - kani_tts_first2" \
        "3 shipped-b - kani_tts"
      pack firstchunk ;;
    mainswitch)
      # The API server's GIL switch interval (KANI_MAIN_GIL_SWITCH_INTERVAL_MS; engines keep CPython's 5 ms): a wave's
      # requests reach the engines while the event loop still takes the rest of the wave in.
      device_info
      checkpoints
      four_servers "0 shipped - kani_tts" "1 main1ms KANI_MAIN_GIL_SWITCH_INTERVAL_MS=1 kani_tts" \
        "2 main05ms KANI_MAIN_GIL_SWITCH_INTERVAL_MS=0.5 kani_tts" "3 shipped-b - kani_tts"
      pack mainswitch ;;
    replicareads)
      device_info
      checkpoints
      four_servers "0 reads - kani_tts" "1 polls KANI_DISABLE_PATCHES=wait_for_replica_outputs kani_tts" \
        "2 polls-b KANI_DISABLE_PATCHES=wait_for_replica_outputs kani_tts" "3 reads-b - kani_tts"
      first_waves reads polls polls-b reads-b
      pack replicareads ;;
    apiwakes)
      device_info
      checkpoints
      four_servers "0 wakes KANI_WAKE_ON_FINAL_OUTPUTS=1 kani_tts" "1 shipped - kani_tts" \
        "2 polls KANI_DISABLE_PATCHES=wait_for_replica_outputs kani_tts" "3 wakes-b KANI_WAKE_ON_FINAL_OUTPUTS=1 kani_tts"
      first_waves wakes shipped polls wakes-b
      pack apiwakes ;;
    onegpu4)
      # Four one-GPU servers at once, one a GPU: the shipped kani_tts.yaml twice (GPUs 0 and 3: the spread between
      # two identical servers), with float32 codec audio (GPU 1) and with vLLM-Omni's connector polls instead of the
      # /dev/shm listing (GPU 2); 64-frame and 250-frame requests (ONE4_SWEEPS), audio vs frames for all four.
      device_info
      checkpoints
      variant kani_tts_float "stages.1.additional_config=$(float_codec_config)"
      four_servers "0 shipped - kani_tts" "1 float - kani_tts_float" \
        "2 nolisting KANI_DISABLE_PATCHES=poll_shm_chunks_from_one_listing kani_tts" "3 shipped-b - kani_tts"
      pack onegpu4 ;;
    listingab)
      device_info
      checkpoints
      dp4_variant kani_tts_dp4
      ab_pair listing stage_configs/kani_tts_dp4.yaml - nolisting stage_configs/kani_tts_dp4.yaml \
        KANI_DISABLE_PATCHES=poll_shm_chunks_from_one_listing
      pack listingab ;;
    *) echo "unknown phase $phase (see the list at the top)"; exit 2 ;;
  esac
done
