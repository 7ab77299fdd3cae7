#!/usr/bin/env bash
# The GPU suite for a one-GPU machine (nvidia-h200, or nvidia-h100-x1 with the same commands; compare timings only
# between runs on the same kind). Everything runs on GPU 0, one job at a time.
#   bash benchmarks/gpu/h200.sh [--quick] PHASE...
# Stage the bundle first (../shared/device/build_bundle.sh, benchmarks/gpu/fit_bundle.sh so each part fits beside the
# tree in one transfer, then one device call per part with stage.sh) and send the phases back to back: /tmp (stack,
# checkpoints, compile caches) lasts only while the machine stays held.
#   codec    checkpoints; Stage 1 alone (windows vs stateful, per precision, SNR); the CUDA-only tests
#   convengines  the codec's channels-last narrow convs under each way of asking cuDNN for an engine (heuristics,
#            cudnn.benchmark, the v7 API, heuristic mode B): the kernels each runs (cuDNN's conversions included), ms,
#            strict fp32 and fp16 beside TF32 (benchmarks/conv_engines.py); then Stage 1 alone under each setting
#   codeclayers  the stateful codec step section by section, and every residual conv under cuDNN and under the Triton
#            conv kernel (nanocodec/conv_kernel.py; plain, and with the half-snake on load and the residual add),
#            batch 64 x 64 and 64 x 16 frames (benchmarks/codec_layers.py)
#   codecl   the narrow residual layers channels-last (the CUDA default) against channel-major: Stage 1 alone (SNR,
#            new frames/s at chunks 16 and 64) and the step section by section, each way (no staged bundle needed;
#            EXTRA_BELOW=512 adds every layer channels-last); then the replay plans at 37 and 100 rows;
#            codectests: the CUDA-only codec tests
#   channelmajor  `served` with the codec's layers all channel-major (codec_channels_last_below 0), the layout
#            before the channels-last layers; send beside `served`
#   shipped  the shipped kani_tts.yaml served with 64- and 250-frame requests
#   flat     the flattened baseline served with the same YAML; the Stage-0 step, ours vs stock
#   stage0   the Stage-0 step alone, ours vs stock (no server)
#   v2       a 350m Kani-TTS-2 checkpoint (frame positions, learnable RoPE, speaker slot) served with the shipped
#            YAML, then the v1 flattened checkpoint the same way (64-frame requests, 1/64/256 streams)
#   replicas1  two Stage-1 engines sharing GPU 0 with Stage 0 (num_replicas 2), 250-frame requests at 64 and 256
#            streams; send after `shipped` for the one-engine reference of the same call sequence
#   int4     W4A16 copies (--backend rtn, group 128) of the 350m checkpoints: the backbone step (stock vLLM) and the
#            Stage-0 step with greedy codes, bf16 vs INT4, and their code agreement
#   async    the shipped YAML with Stage 0's async scheduling and vLLM-Omni's deferred output building on (the
#            kani_async_omni_output experiment switch): served at 64 and 250 frames, and audio == Stage-0 frames
#   asyncsched  the shipped YAML with Stage 0's async scheduling on (as shipped since the twenty-seventh set; deferred
#            output building stays off): served at 64 and 250 frames, and audio == Stage-0 frames
#   convwarmuptests  the short-conv Triton warm-up's CUDA tests (what a stock LFM2 engine's first mixed steps compile,
#            warmed and not)
#   leantests  LeanShortConv's engine test on CUDA (tests/test_lean_short_conv.py, in piecewise graphs split at the
#            lean op)
#   samplertests  Stage 0's CUDA-only tests (open columns with their warm-up, code heads, seeded codebook-1 noise, the
#            step's codes copied to the host in stream order, the one-kernel sampler); .whl carried for pytest
#   asyncserved  `served` with vLLM-Omni's deferred output building on as well (output), with Stage 0's async
#            scheduling on (sched: shipped since the twenty-seventh set) or off (sync: the file before it), ASYNC_SIDES
#            picks (default output sched), audio vs frames each; send beside `served`
#   profile  the shipped YAML under 256 streams (PROFILE_STREAMS) of 250 frames (PROFILE_FRAMES): CPU per process and
#            thread, py-spy stacks of the API server (and its GIL) and of each stage's engine core
#            (benchmarks/gpu/profile_served.py);
#            PROFILE_CHANGES (dotted.key=value ..., as variant takes them) profiles the shipped file with those changes,
#            PROFILE_YAML another deploy file (e.g. stage_configs/kani_tts_one_lm.yaml: one Stage-0 engine); PROFILE_LIMIT_S
#            the step's limit (default 420; a fresh machine starting several engines needs more)
#   stepprofile  py-spy of the Stage-0 step at batch 256 held steady, stock vs ours (spy_step); the host cost of
#           the code heads' seeded noise and of vLLM's penalty tokens (benchmarks/sampling_host.py)
#   sampledprofile  py-spy of the Stage-0 step at batch 256 with the serving default sampling (seeded), ours then
#            stock: where the host time of the sampled step goes (the kernels phase found the GPU idle)
#   batch1   the sampled Stage-0 step at batches 1 and 8 with async scheduling (as served), parallel heads through
#            our LM-only pipeline, the flattened checkpoint through the same pipeline, and stock vLLM LFM2; each then
#            under vLLM's torch profiler at batch 1 (kernel and op tables): what the heads add to a one-stream step
#            (the 1-stream RTF target; thirty-sixth set); batch1spy: py-spy of the step held at batch 1, parallel
#            heads then flattened
#   sampler  the code heads' seeded noise as one Triton kernel: its host cost against the torch ops
#            (benchmarks/sampling_host.py), and the Stage-0 step at 64 and 256, greedy and sampled; stockstep: the same
#            step of stock vLLM LFM2 (the next call: one engine start each is ~90 s on this machine)
#   served   the shipped YAML at 64 and 256 streams of 250 frames (the issue's target table), audio vs frames;
#            servedoff: the same with the API server's patches off (KANI_DISABLE_PATCHES), to measure them
#   stepanatomy  one second of each Stage-0 engine's host (torch ops, vLLM's ranges, every Python call) and GPU while
#            64 streams of 64-frame requests are served, split by kind of step (benchmarks/step_anatomy.py): where a
#            step that admits prompts spends its time over a decode step
#   servedkernels  2 s (KERNEL_TRACE_S) of every engine process's GPU activity at once while 256 streams of 250 frames
#            are served (KANI_KERNEL_TRACE, profile_served.py --kernel-trace-s), kani_tts.yaml then
#            kani_tts_one_lm.yaml (KERNEL_YAMLS names others): GPU time per process, their union, the heaviest
#            kernels (kernel_share.py)
#   servedgil  the same as served with every process's GIL switch interval at GIL_MS ms (default 0.5;
#            KANI_GIL_SWITCH_INTERVAL_MS) instead of CPython's 5 ms: does the step loop wait for the GIL after each
#            release while the connector's threads hold it? samplergil: sampler's step_time with that interval
#   abstep   the Stage-0 sampler patches (KANI_STAGE0_SAMPLER_PATCHES, on by default) A/B'd inside one engine
#            (KANI_SAMPLER_AB_PERIOD_S: the patched path in even 2-s windows, vLLM's in odd ones, so the machine's drift
#            cancels): the CUDA-only sampling tests, then the sampled step held at batch 64 and 256; abserved: `served`
#            with the patches alternating (benchmarks/ab_windows.py on the server log: the served step per side);
#            servedsampler: `served` with KANI_STAGE0_SAMPLER_PATCHES=$SAMPLER (default 0: vLLM's own sampler path),
#            audio vs frames
#   abrace   the code heads' one-kernel sampler (code_race_kernel) A/B'd alone inside one engine:
#            the sampled step held at batches 1, 4 and 16 (AB_BATCHES; AB_SOAK_S seconds each, default 40) with
#            async scheduling, then its CUDA tests
#            abracesrv: the same in the served engine (ab_patch) at 1 stream of 250 frames
#   abcodebook1  the seeded codebook-1 noise patch (codebook1_noise, on by default) A/B'd alone in 2-s windows on top of
#            the default patches (KANI_SAMPLER_AB_PATCHES): its CUDA tests, `served` (AB_SWEEPS), ab_windows per batch,
#            audio vs frames
#   abtopk   top-k/top-p over the columns the speech mask can leave open (top_k_open_columns, on by default): its
#            device time against vLLM's kernel on whole rows (benchmarks/bench_top_k.py), then A/B'd alone the way
#            abcodebook1 is
#   kernels  the Stage-0 step at batch 256, greedy and sampled, under vLLM's torch profiler: ours (kernel tables by
#            device time); stockkernels: the same for stock vLLM LFM2 (one call each: a fresh compile is ~100 s)
#   mps      the shipped YAML served under an MPS daemon (started for the phase, quit after it), so Stage 0's and
#            the codec's kernels can share the GPU at once instead of time-slicing between their processes;
#            MPS_YAML=stage_configs/kani_tts_one_lm.yaml serves that file instead (250-frame requests only)
#   memory   the codec graphs' memory (benchmarks/codec_graph_memory.py) under vLLM's load-time allocator limit
#            (max_split_size_mb 20), lifted around the capture as the codec stage does and not
#   lmreplicas  kani_tts.yaml with LM_REPLICAS Stage-0 engines (default 3; the shipped file runs 2, 1 serves
#            kani_tts_one_lm.yaml) beside one codec on GPU 0, at 64 and 256 streams of 250 frames, audio vs frames;
#            send after `served` for the shipped reference
#   budget   the shipped YAML with Stage 1 stepping at most 64 streams per step (max_num_seqs 64; state slots kept
#            at 1,024): shorter codec steps that hold the shared GPU for less time (256 streams, 64 and 250 frames)
#   chunk32  the shipped YAML with chunks ramping to 32 frames, not 64 (max_codec_chunk_frames 32): codec steps of half
#            the frames, so a first chunk waits less behind one (TTFA); alone the codec was 6% slower at 16-frame
#            chunks than at 64 (fourteenth set); 250-frame requests at 64 and 256 streams, audio vs frames
#   alone    the shipped YAML with codec_first_chunks_alone ALONE (default false; shipped true since the
#            twenty-second set: a codec step with first chunks takes only those, the running streams' chunks go in the
#            next step): the first chunk's codec step, for TTFA; 250-frame requests at 64 and 256 streams, audio vs
#            frames; send beside `served`
#   capture  the shipped YAML with Stage 0's CUDA graphs for mixed batches captured up to CAPTURE_MAX tokens (default
#            512: vLLM's own sizes, the file before the twenty-second set; above 512: the shipped sizes, to 2,048):
#            prefill steps against decode steps (step kinds), TTFA and frames/s; 250-frame requests at 64 and 256
#            streams, audio vs frames; send beside `served`
#   servedenv  `served` with SERVED_ENV (KEY=VALUE ...) in the server's environment, labelled SERVED_ENV_LABEL: a
#            same-instance A/B of an environment switch (e.g. KANI_FAST_DECODE_SLOTS=0); send beside `served`
#   abenv    SERVED_ENV (and/or SERVED_YAML, a deploy file served on that side instead of the shipped one, e.g.
#            stage_configs/kani_tts_one_lm.yaml) against the shipped file in one call, in AB_ORDER (default
#            "env shipped env"; ~170 s a run once the machine is warm, so three fit one call): each run labelled by its
#            place (LABEL-1, shipped-2, LABEL-3, with SERVED_ENV_LABEL; numbered on from the runs an earlier abenv
#            call on the same machine left), so no run's files overwrite another's; audio vs frames each, one pack;
#            AB_WAVES=W sends W requests per stream at each level instead of 2 (W=8: ~55 s at 256 streams, ~200 s a
#            run, two a call), for a steadier 256-stream rate; AB_YAML serves another file on both sides (e.g. the
#            LM replicas, SERVED_ENV the only difference), its side labelled AB_BASE_LABEL (default shipped);
#            AB_SWEEPS replaces the sweeps (default 250:64,256; e.g. "64:1,64,256 250:1" for one stream and short
#            requests); send after `served` (a fresh machine's first server compiles for minutes); a side named mps
#            serves the base file (AB_YAML or the shipped one) under an MPS daemon (mps_start), labelled mps-N; a side
#            named flat serves the flattened checkpoint with the base file, labelled flat-N (issue 14's "3x the
#            flattened baseline", measured in alternation on one instance, e.g. AB_ORDER="shipped flat shipped");
#            SERVED_CHANGES ("dotted.key=value;..." as variant takes them) serves the shipped file with those changes
#            on the env side; AB_FRESH=1 gives every side an empty compile cache of its own (a first start's compile
#            and Inductor's timing of its kernels), e.g. for a fresh server's engines against each other (e2e);
#            AB_TRITON_WITHOUT="KERNEL ..." serves each env side in a copy of the Triton cache less those kernels'
#            entries, so they compile when first met as on a fresh machine while the rest is read back (the sixtieth
#            set's A/B of the short-conv warm-up)
#   threads  the shipped YAML with every server process's torch intra-op pool at THREADS threads (OMP_NUM_THREADS,
#            default 1) instead of one per core; send beside `served`
#   stagger  the shipped YAML, then the same with codec_first_chunks_alone ALONE (default false), with requests
#            arriving one by one (bench --stagger-s: the streams' first requests spread over about one request's
#            duration, 4 requests per stream): TTFA under a steady load rather than in waves; 250-frame requests at 64
#            (STAGGER64_S, default 2.5) and 256 streams (STAGGER256_S, default 7); STAGGER_SIDES=shipped or alone runs
#            one side (one call each on a fresh machine)
#   ramp     the shipped YAML with a first chunk of INITIAL frames (default 1, shipped 3) and a ramp from CHUNK
#            (default 2, shipped 16) doubling to 64: the first audio after Stage 0's first frame rather than its third,
#            each later chunk still due before the audio before it has played; 250-frame requests at 64 and 256
#            streams, audio vs frames; send beside `served`
#   stepbound  the shipped YAML with Stage 1's step bound at STEP_MAX_FRAMES frames (default 1,024; 0 is no bound,
#            every chunk that arrived in one codec step, as shipped): the bound's served A/B for TTFA and frames/s;
#            send beside `served`
#   lazy     `served` with a streamed request's engine request queued when its response starts, as vLLM-Omni does
#            (KANI_LAZY_SUBMIT=1), not when the handler has its output generator (early_start.py, shipped): the
#            TTFA A/B of early submission; send beside `served`; earlytests: tests/test_early_start.py on this Python
#   servedtables  `served` with vLLM-Omni's per-request stats tables (KANI_REQUEST_TABLES=1) instead of one line per
#            request: how much the tables' logging stalls the API server's loop; send beside `served`
#   servedtrace  `served` with KANI_TRACE_CHUNKS=1 (Stage 0 logs each chunk it emits, the codec each step after a
#            device sync): how long first chunks wait for the codec and what the step they join costs
#            (benchmarks/chunk_waits.py); the sync makes its frames/s no reference
#   servedalt  `served` with the package from a carried .devsrc/alt.tar (.devsrc/alt-commit says what it is, e.g.
#            HEAD with one change reverted): a same-instance A/B of code rather than of the YAML; send beside `served`
#   betweencodec  the codec's between-conv kernels: CUDA-only tests, the codec alone with them off and on
#   nextact  the residual adds writing the next unit's input half-snake (codec_fused_next_activation): the CUDA-only
#            codec tests, then the codec alone without and with it, in alternation (NEXTACT_ROUNDS, default 2; batch
#            sizes NEXTACT_BATCHES, default "64 256")
#   statecopies  the codec's states moved by one Triton kernel each way (codec_fused_state_copies): their CUDA tests,
#            then the codec alone without and with them, in alternation (STATECOPIES_ROUNDS, default 2; batch sizes
#            STATECOPIES_BATCHES, default "64 256"); served, it is an abenv A/B with
#            SERVED_CHANGES="stages.1.additional_config.codec_fused_state_copies=false" (shipped on)
#   copiescheck  the served codec's streams (350m, TF32, the stage's defaults) decoded eager and in the served graph
#            buckets, with PyTorch's state copies and with the kernels, under both replay plans
#            (benchmarks/codec_copies_check.py): which pairs give the same bits, and the batch bucket a lone row
#            replays in under each side's measured times (fifty-fourth set)
#   betweenoff  the shipped YAML with the codec's between-conv kernels off (codec_fused_between_convs: false): their
#            served A/B; send beside `served`
#   roundup  the shipped YAML with the codec's replays split as before the replay plan (codec_replay_plan round_up:
#            full slices of 64 rows, the rest rounded up): the plan's served A/B; send beside `served`
#   warmups  Stage 0 alone (step_time, batch 1) loaded with an empty Triton cache, its load-time warm-ups one after
#            another (seq) or at once (conc: KANI_CONCURRENT_WARM_UPS=1), alternating (WARMUP_SIDES, default "seq conc
#            seq conc"; ~2-3 min a run: send two a call): "Model loading took" in each log; then the CUDA test that
#            no sampled step compiles after either kind of warm-up
#   detcompile  Stage 0 alone (step_time: greedy codes, the step at batches 1, 64, 256) with Inductor's deterministic
#            mode (det-*: reduction launch configs by rule, not timing; combo kernels kept, untimed) or vLLM's default
#            (default-*), or vLLM's default with the kernels launching their saved picks (picks-*:
#            KANI_INDUCTOR_SAVED_PICKS=1, inductor_patch.py; the shipped default, which det-* and default-* turn off
#            with 0). A run named X-a, X-b or X-c compiles afresh in a compile
#            cache of its own, as a machine's first server's first engine does; X-a2 (X-c2) then loads X-a's (X-c's)
#            compiled graph, as its second engine does. Then the code agreement of each pair that ran: X-a/X-a2 and
#            X-c/X-c2 (a fresh server's two engines), X-a/X-b and X-a/X-c (two fresh compiles), det-a/default-a (what
#            the mode changes). DET_RUNS picks the runs (default "det-a det-a2 det-b default-a
#            default-a2 default-b"; ~1-3 min each: send them over two calls). Codes are decoded one prompt at a time
#            (--codes-alone): decoded as one batch, two runs of one compiled graph differed (likely the batch's rows
#            not being batch-invariant). Each run logs Inductor's run-time autotuning: autotune-RUN.txt (kernels timed
#            at a launch, picks saved) and best-configs-RUN.txt (the saved picks' checksums after it)
source "$(dirname "$0")/lib.sh"
quick=0
if [ "${1:-}" = "--quick" ]; then quick=1; shift; fi
if [ $quick = 1 ]; then
  SHORT=64:1,64,256; LONG=250:64,256; PRECISIONS="tf32"
else
  SHORT=64:1,10,64,128,256; LONG=250:1,64,128,256; PRECISIONS="fp32 tf32 bf16 fp16"
fi

# Inductor's runtime autotuning at DEBUG: "Benchmark all input configs for KERNEL" where a process times a kernel's
# launch configs at its first launch, "Save heuristic tuning result to" where it writes its pick beside the kernel.
INDUCTOR_AUTOTUNE_LOGS="+torch._inductor.runtime.triton_heuristics,+torch._inductor.runtime.autotune_cache"

# autotune_picks LOG: Inductor's launch-config picks in LOG, in order, with the lines where the engine compiled or
# loaded its graph.
autotune_picks() {
  grep -oE -e 'Best config for [A-Za-z0-9_]+: XBLOCK: [0-9]+, num_warps: [0-9]+' \
    -e '[A-Za-z0-9_]+: launches its saved pick.*' \
    -e 'Compiling a graph for compile range.*' -e 'Directly load the compiled graph.*' "$1" | cut -c1-160
}

# autotune_evidence RUN CACHE: how many kernels RUN timed and saved, and the picks on disk after it (a process that
# loads the compiled artifact writes the compile-time picks there).
autotune_evidence() {
  local run=$1 cache=$2
  {
    echo "benchmarked: $(grep -c 'Benchmark all input configs for' "$R/$run.log")"
    echo "saved: $(grep -c 'Save heuristic tuning result to' "$R/$run.log")"
    grep -o 'Benchmark all input configs for [A-Za-z0-9_]*' "$R/$run.log" | sort | uniq -c | sort -rn | head -n 40
    # Each pick in order, around the compile's own line: a kernel picked once while compiling and again at its first
    # launch runs the later pick here, while an engine loading the artifact runs the earlier one (forty-seventh set).
    echo "picks, in order:"
    autotune_picks "$R/$run.log"
  } > "$R/autotune-$run.txt"
  find "$cache" -name '*.best_config' -print0 | sort -z | xargs -0 -r md5sum > "$R/best-configs-$run.txt"
  echo "[$run] $(head -n 2 "$R/autotune-$run.txt" | tr '\n' ' ')best_config files: $(wc -l < "$R/best-configs-$run.txt")"
}

# serve_env LABEL "KEY=VALUE ..." YAML LIMIT_S [OPTION...]: YAML served (AB_SWEEPS, default 250 frames at 64 and 256
# streams) with those variables in every server process (none: as shipped) and serve_sweeps.py's OPTIONs, then audio
# vs frames. SERVE_FLAT=1 serves the flattened checkpoint instead of the parallel-head one (4 tokens a frame).
serve_env() {
  local label=$1 env=$2 yaml=$3 limit=$4 ckpt=$CK/par tokens=1
  shift 4
  [ "${SERVE_FLAT:-0}" = 1 ] && ckpt=$CK/flat tokens=4
  (
    for kv in $env; do export "${kv?}"; done
    # shellcheck disable=SC2086
    serve_sweeps 0 "$label" "$ckpt" "$yaml" "$limit" ${AB_SWEEPS:-250:64,256} "$@"
  )
  cleanup
  frames_check "$label" "$tokens"
}

# mps_start / mps_stop: an MPS control daemon for the servers started in between (their processes' kernels then share
# the GPU at once instead of time-slicing between contexts); its log lands in $R/mps-log. mps_start fails, saying so,
# where the machine has no nvidia-cuda-mps-control.
mps_start() {
  command -v nvidia-cuda-mps-control > /dev/null || {
    echo "no nvidia-cuda-mps-control on this machine" | tee "$R/mps-missing.txt"
    return 1
  }
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  nvidia-cuda-mps-control -d && echo "MPS daemon started"
}

mps_stop() {
  echo quit | nvidia-cuda-mps-control
  sleep 2
  mkdir -p "$R/mps-log" && cp -r "$CUDA_MPS_LOG_DIRECTORY"/. "$R/mps-log/" 2>/dev/null
  unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
  echo "MPS daemon stopped"
}

# served_env LABEL "KEY=VALUE ..." LIMIT_S: serve_env, then step rates; packed as LABEL.
served_env() {
  checkpoints
  serve_env "$1" "$2" stage_configs/kani_tts.yaml "$3"
  step_rates
  pack "$1"
}

# async_served SIDES SWEEP...: the shipped file with Stage 0's async scheduling on (sched), off (sync), or on with
# vLLM-Omni's deferred output building as well (output; the kani_async_omni_output switch), served at each SWEEP,
# audio vs frames each.
async_served() {
  local sides=$1 side
  shift
  checkpoints
  for side in $sides; do
    case $side in
      output) variant kani_tts_async_output stages.0.async_scheduling=true \
                stages.0.additional_config.kani_async_omni_output=true ;;
      sched) variant kani_tts_async_sched stages.0.async_scheduling=true ;;
      sync) variant kani_tts_async_sync stages.0.async_scheduling=false ;;
      *) echo "unknown async side $side (output, sched, sync)"; return 2 ;;
    esac
    serve_sweeps 0 "async-$side" "$CK/par" "stage_configs/kani_tts_async_$side.yaml" 540 "$@"
    cleanup
    frames_check "async-$side"
  done
}

# codec_cuda_tests: the codec's CUDA-only tests (the CPU CI skips them) into cuda-tests.log.
codec_cuda_tests() {
  step cuda-tests 300 python3 -m pytest -q -p no:cacheprovider tests/test_codec_streaming.py \
    tests/test_codec_graphs.py tests/test_codec_fused.py tests/test_codec_stage.py tests/test_codec_between_convs.py \
    tests/test_seeded_noise.py tests/test_codec_state_copies.py \
    -k "between or graph or fused or kernel or one_copy or cuda or channels_last"
}

# conv_setting SETTING: how the convengines phase asks cuDNN for an engine, as env_args (environment) and flag (the
# scripts' --cudnn-benchmark); fails for an unknown SETTING.
conv_setting() {
  env_args=() flag=()
  case $1 in
    default) ;;
    autotune) flag=(--cudnn-benchmark) ;;
    v7) env_args=(TORCH_CUDNN_V8_API_DISABLED=1) ;;
    modeB) env_args=(TORCH_CUDNN_USE_HEURISTIC_MODE_B=1) ;;
    *) echo "unknown CONV_SETTINGS entry $1"; return 1 ;;
  esac
}

# served_variant PACK LABEL LIMIT_S CHANGE...: the shipped file with each CHANGE (dotted.key=value, see lib.sh's
# variant) written as stage_configs/kani_tts_LABEL.yaml (dashes as underscores) and served (250 frames at 64 and 256
# streams), then audio vs frames and step rates; packed as PACK.
served_variant() {
  local pack=$1 label=$2 limit=$3 yaml
  shift 3
  yaml="kani_tts_${label//-/_}"
  checkpoints
  variant "$yaml" "$@"
  serve_sweeps 0 "$label" "$CK/par" "stage_configs/$yaml.yaml" "$limit" 250:64,256
  cleanup
  frames_check "$label"
  step_rates
  pack "$pack"
}

# ab_patch PACK PATCH LABEL TEST...: one Stage-0 sampler patch alternating with vLLM's path in 2-s windows
# (AB_PERIOD_S) on top of the default patches (KANI_SAMPLER_AB_PATCHES; a patch taken only where named is named with
# them): its CUDA tests, then served (AB_SWEEPS, default 64 and 256 streams of 250 frames) as LABEL-ab, the served step
# per side (ab_windows over AB_WINDOW_BATCHES, default 64,256, ab-LABEL.json), every request's audio against its frames,
# and the step rates; packed as PACK.
ab_patch() {
  local pack=$1 name=$2 label=$3
  shift 3
  checkpoints
  step "$label-tests" 180 python3 -m pytest -q -p no:cacheprovider "$@"
  KANI_STAGE0_SAMPLER_PATCHES=$(with_default_patches "$name")
  export KANI_STAGE0_SAMPLER_PATCHES
  export KANI_SAMPLER_AB_PATCHES=$name KANI_SAMPLER_AB_PERIOD_S=${AB_PERIOD_S:-2}
  # shellcheck disable=SC2086
  serve_sweeps 0 "$label-ab" "$CK/par" stage_configs/kani_tts.yaml 450 ${AB_SWEEPS:-250:64,256}
  unset KANI_STAGE0_SAMPLER_PATCHES KANI_SAMPLER_AB_PATCHES KANI_SAMPLER_AB_PERIOD_S
  cleanup
  frames_check "$label-ab"
  python3 benchmarks/ab_windows.py "$R/serve-$label-ab.log" --batches "${AB_WINDOW_BATCHES:-64,256}" --min-share 0.7 \
    --json "$R/ab-$label.json" | tee "$R/ab-$label.md"
  step_rates
  pack "$pack"
}

for phase in "$@"; do
  case $phase in
    codec)
      device_info
      checkpoints
      # shellcheck disable=SC2086
      step codec-streaming 420 python3 benchmarks/bench_codec_streaming.py --device cuda --batches 64 128 256 \
        --chunks 16 64 --precisions $PRECISIONS --out "$R"
      codec_cuda_tests
      pack codec ;;
    shipped)
      checkpoints
      serve_sweeps 0 shipped "$CK/par" stage_configs/kani_tts.yaml 540 $SHORT $LONG
      cleanup
      frames_check shipped
      pack shipped ;;
    flat)
      checkpoints
      serve_sweeps 0 flattened "$CK/flat" stage_configs/kani_tts.yaml 420 $SHORT $LONG
      cleanup
      stage0_steps
      stage0_async_steps
      pack flat ;;
    stage0)
      checkpoints
      stage0_steps
      stage0_async_steps
      pack stage0 ;;
    v2)
      checkpoints
      [ -f "$CK/v2/config.json" ] || python3 -m vllm_omni_kani.tools.make_checkpoint "$CK/v2" --preset 350m \
        --variant v2 --force > "$R/ckpt-v2.log" 2>&1
      serve_sweeps 0 v2 "$CK/v2" stage_configs/kani_tts.yaml 290 $SHORT
      cleanup
      serve_sweeps 0 flattened-v1 "$CK/flat" stage_configs/kani_tts.yaml 270 $SHORT
      cleanup
      pack v2 ;;
    replicas1)
      checkpoints
      # Two codec engines on the one GPU: kani_tts_codec_replicas.yaml with every device 0 (written next to it, so
      # its base_config resolves).
      sed -e 's/devices: "0,1"/devices: "0,0"/' -e 's/gpu_memory_utilization: 0.3/gpu_memory_utilization: 0.15/' \
        stage_configs/kani_tts_codec_replicas.yaml > stage_configs/kani_tts_codec_replicas_1gpu.yaml
      serve_sweeps 0 codec-replicas-1gpu "$CK/par" stage_configs/kani_tts_codec_replicas_1gpu.yaml 330 250:64,256
      cleanup
      pack replicas1 ;;
    async)
      async_served output $SHORT $LONG
      pack async ;;
    asyncsched)
      async_served sched $SHORT $LONG
      pack asyncsched ;;
    asyncserved)
      # The host step overlapping its GPU time now that it is the wall: 250-frame requests at 64 and 256 streams.
      async_served "${ASYNC_SIDES:-output sched}" 250:64,256
      step_rates
      pack asyncserved ;;
    profile)
      checkpoints
      yaml=${PROFILE_YAML:-stage_configs/kani_tts.yaml}
      # shellcheck disable=SC2086
      [ -z "${PROFILE_CHANGES:-}" ] || { variant kani_tts_profile $PROFILE_CHANGES; yaml=stage_configs/kani_tts_profile.yaml; }
      step profile "${PROFILE_LIMIT_S:-420}" python3 benchmarks/gpu/profile_served.py --ckpt "$CK/par" \
        --deploy-config "$yaml" --out "$R/profile-${PROFILE_STREAMS:-256}" --frames "${PROFILE_FRAMES:-250}" \
        --streams "${PROFILE_STREAMS:-256}"
      cleanup
      pack profile ;;
    stepprofile)
      checkpoints
      spy_step stock-step vllm "$CK/flat"
      spy_step stage0-step omni "$CK/par"
      step sampling-host 120 python3 benchmarks/sampling_host.py --device cuda --out "$R"
      cleanup
      pack stepprofile ;;
    sampledprofile)
      checkpoints
      spy_step stage0-sampled omni "$CK/par" --soak-sampled
      spy_step stock-sampled vllm "$CK/flat" --soak-sampled
      cleanup
      pack sampledprofile ;;
    batch1|batch1spy)
      # The timed and profiled steps are seeded (vLLM's per-request generators), which never take FlashInfer's
      # sampler; only vLLM's start-up warm-up calls it, and on a fresh machine that JIT-compiles it for minutes (the
      # first attempt's engines sat ~150 s after their profiling run until the step's limit cut them).
      export VLLM_USE_FLASHINFER_SAMPLER=0
      checkpoints
      if [ "$phase" = batch1 ]; then
        for side in "stage0-b1 omni par" "flat-b1 omni flat" "stock-b1 vllm flat"; do
          read -r name engine ckpt <<< "$side"
          kernel_tables "$name" "$engine" "$CK/$ckpt" 240 --batches 1,8 --async-scheduling --profile-batch 1
          pack batch1
        done
        continue
      fi
      for side in "stage0-b1-spy par" "flat-b1-spy flat"; do
        read -r name ckpt <<< "$side"
        spy_step "$name" omni "$CK/$ckpt" "--soak-sampled --async-scheduling" 1
        cleanup
        pack batch1spy
      done ;;
    sampler|stockstep)
      checkpoints
      if [ "$phase" = sampler ]; then
        step sampling-host 120 python3 benchmarks/sampling_host.py --device cuda --out "$R"
        sampled_steps stage0 omni "$CK/par"
      else sampled_steps stock vllm "$CK/flat"; fi
      cleanup
      pack "$phase" ;;
    served)
      checkpoints
      serve_sweeps 0 shipped "$CK/par" stage_configs/kani_tts.yaml 450 250:64,256
      cleanup
      frames_check shipped
      step_rates
      pack served ;;
    lmreplicas)
      checkpoints
      yaml=stage_configs/kani_tts.yaml
      tag=lm-replicas-${LM_REPLICAS:=3}
      if [ "$LM_REPLICAS" = 1 ]; then
        yaml=stage_configs/kani_tts_one_lm.yaml
      elif [ "$LM_REPLICAS" != 2 ]; then
        # Written next to the shipped files, so its base_config resolves.
        devs=$(python3 -c "print(','.join(['0'] * ${LM_REPLICAS}))")
        python3 -m vllm_omni_kani.benchmarks.variants $yaml "stage_configs/kani_tts_$tag.yaml" \
          stages.0.num_replicas="$LM_REPLICAS" stages.0.devices="'$devs'" > /dev/null
        yaml="stage_configs/kani_tts_$tag.yaml"
      fi
      serve_sweeps 0 "$tag" "$CK/par" "$yaml" 480 250:64,256
      cleanup
      frames_check "$tag"
      step_rates
      pack "$tag" ;;
    codecl)
      device_info
      for below in default 0 ${EXTRA_BELOW:-}; do
        args=(); [ "$below" = default ] || args=(--channels-last-below "$below")
        step "codec-streaming-cl-$below" 300 python3 benchmarks/bench_codec_streaming.py --device cuda \
          --batches 64 256 --chunks 16 64 --precisions tf32 --activations fused --out "$R" --tag="-cl-$below" "${args[@]}"
        step "codec-sections-cl-$below" 120 python3 benchmarks/codec_layers.py --batch 64 --frames 64 --max-channels 0 \
          --out "$R/codec-layers" --tag="-cl-$below" "${args[@]}"
      done
      # The replay plan alone: 37 and 100 rows of 64-frame chunks (remainders the plans split differently).
      for plan in cheapest round_up; do
        step "codec-streaming-plan-$plan" 240 python3 benchmarks/bench_codec_streaming.py --device cuda \
          --batches 37 100 --chunks 64 --precisions tf32 --activations fused --replay-plan "$plan" \
          --out "$R" --tag="-plan-$plan"
      done
      pack codecl ;;
    codectests)
      codec_cuda_tests
      pack codectests ;;
    betweencodec)
      # The between-conv kernels (nanocodec/between_convs.py): the codec's CUDA-only tests, then the codec alone
      # (350m preset, TF32, fused half-snakes, the shipped replay plan) with the kernels off and on.
      device_info
      codec_cuda_tests
      for side in off on; do
        step "codec-streaming-between-$side" 240 python3 benchmarks/bench_codec_streaming.py --device cuda \
          --batches 64 256 --chunks 16 64 --precisions tf32 --activations fused --replay-plan cheapest \
          --between-convs "$side" --out "$R" --tag="-between-$side"
      done
      pack betweencodec ;;
    nextact)
      # The residual adds writing the next unit's input half-snake (codec_fused_next_activation): the codec's CUDA-only
      # tests, then the codec alone (350m preset, TF32, fused half-snakes, float16 narrow convs) without and with it,
      # NEXTACT_ROUNDS times in alternation (default 2): the codec's own instance drift cancels.
      device_info
      codec_cuda_tests
      for round in $(seq "${NEXTACT_ROUNDS:-2}"); do
        for side in off on; do
          step "codec-streaming-next-$side-$round" 240 python3 benchmarks/bench_codec_streaming.py --device cuda \
            --batches ${NEXTACT_BATCHES:-64 256} --chunks 16 64 --precisions tf32 --activations fused --modes stateful \
            --next-activation "$side" --out "$R" --tag="-next-$side-$round"
        done
      done
      pack nextact ;;
    statecopies)
      # The codec's states into and out of each conv input by one Triton kernel each way (nanocodec/state_copies.py):
      # its CUDA tests, then the codec alone (350m preset, TF32, fused half-snakes, float16 narrow convs) without and
      # with it, STATECOPIES_ROUNDS times in alternation (default 2).
      device_info
      step state-copies-tests 240 python3 -m pytest -q -p no:cacheprovider tests/test_codec_state_copies.py
      for round in $(seq "${STATECOPIES_ROUNDS:-2}"); do
        for side in off on; do
          step "codec-streaming-states-$side-$round" 240 python3 benchmarks/bench_codec_streaming.py --device cuda \
            --batches ${STATECOPIES_BATCHES:-64 256} --chunks 16 64 --precisions tf32 --activations fused \
            --modes stateful --state-copies "$side" --out "$R" --tag="-states-$side-$round"
        done
      done
      pack statecopies ;;
    copiescheck)
      device_info
      step codec-copies-check 240 python3 benchmarks/codec_copies_check.py --out "$R"
      pack copiescheck ;;
    betweenoff)
      # The shipped YAML with the codec's between-conv kernels off (cuDNN's bias adds and transposed convs, PyTorch's
      # residual adds and layout copies): their served A/B; send beside `served`.
      served_variant betweenoff between-off 450 stages.1.additional_config.codec_fused_between_convs=false ;;
    channelmajor)
      served_variant channelmajor channel-major 330 stages.1.additional_config.codec_channels_last_below=0 ;;
    convengines)
      # The channels-last narrow convs' cuDNN kernels (conversions included) under each way of asking cuDNN for an
      # engine (benchmarks/conv_engines.py), then Stage 1 alone (stateful, TF32, fused half-snakes, batch 256) under
      # the same settings. CONV_SETTINGS picks (default: all four); CONV_KERNEL_SETTINGS the conv probes alone ("":
      # none); CONV_CODEC=0 skips the codec runs.
      device_info
      settings=${CONV_SETTINGS:-default autotune v7 modeB}
      for setting in ${CONV_KERNEL_SETTINGS-$settings}; do
        conv_setting "$setting" || continue
        step "conv-engines-$setting" 150 env "${env_args[@]}" python3 benchmarks/conv_engines.py --batch 64 \
          --frames "${CONV_FRAMES:-32}" --out "$R/conv-engines" --tag "$setting" "${flag[@]}"
      done
      if [ "${CONV_CODEC:-1}" = 1 ]; then
        for setting in $settings; do
          conv_setting "$setting" || continue
          step "conv-codec-$setting" 200 env "${env_args[@]}" python3 benchmarks/bench_codec_streaming.py \
            --device cuda --batches 256 --chunks 16 64 --precisions tf32 --activations fused --modes stateful \
            --out "$R/conv-engines" --tag="-$setting" "${flag[@]}"
        done
      fi
      pack convengines ;;
    codeclayers)
      device_info
      for f in ${LAYER_FRAMES:-64}; do
        # shellcheck disable=SC2086
        step "codec-layers-f$f" 300 python3 benchmarks/codec_layers.py --batch 64 --frames "$f" --out "$R/codec-layers" \
          ${LAYER_ARGS:-}
      done
      pack codeclayers ;;
    servedkernels)
      # 2 s of every engine process's GPU activity at once (KANI_KERNEL_TRACE), 256 streams of 250 frames, under the
      # shipped file (two Stage-0 engines) and under one: GPU time per process, the union, the heaviest kernels.
      checkpoints
      for y in ${KERNEL_YAMLS:-kani_tts kani_tts_one_lm}; do
        step "kernels-$y" "${KERNEL_LIMIT_S:-420}" python3 benchmarks/gpu/profile_served.py --ckpt "$CK/par" \
          --deploy-config "stage_configs/$y.yaml" --out "$R/kernels" --label "$y" --frames 250 --streams 256 \
          --delay 10 --seconds 5 --kernel-trace-s "${KERNEL_TRACE_S:-2}"
        cleanup
        python3 benchmarks/kernel_share.py "$R/kernels/kernel-trace-$y" --json "$R/kernels/kernel-share-$y.json" \
          | tee "$R/kernels/kernel-share-$y.md" | head -n 40
        gzip -f "$R/kernels/kernel-trace-$y"/*.json
      done
      pack servedkernels ;;
    stepanatomy)
      # One Stage-0 engine's steps by kind while 64 streams of 64-frame requests are served: ANATOMY_TRACE_S (default
      # 1) of every Stage-0 engine's GPU, torch ops, vLLM's ranges and Python calls (profile_served.py
      # --kernel-trace-host python:stage0), then benchmarks/step_anatomy.py on each: where a step that admits prompts
      # spends its extra time. The raw traces are too large to come back; each engine's anatomy and a slim trace do.
      # ANATOMY_CHANGES (dotted.key=value;...) serves a variant of the shipped file, ANATOMY_ENV ("KEY=VALUE ...") sets
      # the server's environment (KANI_JIT_EVENTS=1: the Triton compiles met in the load's first wave).
      checkpoints
      device_info
      yaml=stage_configs/kani_tts.yaml
      if [ -n "${ANATOMY_CHANGES:-}" ]; then
        IFS=';' read -ra changes <<< "$ANATOMY_CHANGES"
        variant kani_tts_anatomy "${changes[@]}"
        yaml=stage_configs/kani_tts_anatomy.yaml
      fi
      # shellcheck disable=SC2086
      step anatomy "${ANATOMY_LIMIT_S:-420}" env ${ANATOMY_ENV:-} python3 benchmarks/gpu/profile_served.py --ckpt "$CK/par" \
        --deploy-config "$yaml" --out "$R/anatomy" --label shipped --frames "${ANATOMY_FRAMES:-64}" \
        --streams "${ANATOMY_STREAMS:-64}" --delay "${ANATOMY_DELAY_S:-12}" --seconds 6 \
        --kernel-trace-s "${ANATOMY_TRACE_S:-1}" --kernel-trace-host python:stage0
      cleanup
      for t in "$R"/anatomy/kernel-trace-shipped/stage0-*.json; do
        [ -f "$t" ] || continue
        step "anatomy-$(basename "${t%.json}")" 240 python3 benchmarks/step_anatomy.py "$t" --json "${t%.json}-anatomy.json" \
          --slim "${t%.json}-slim.json.gz" --keep 2
        cp "$R/anatomy-$(basename "${t%.json}").log" "${t%.json}-anatomy.md"
        rm -f "$t"  # the raw trace only: too large to come back (the anatomy's JSON beside it does)
      done
      pack stepanatomy ;;
    servedgil)
      checkpoints
      export KANI_GIL_SWITCH_INTERVAL_MS=${GIL_MS:-0.5}
      serve_sweeps 0 "shipped-gil$KANI_GIL_SWITCH_INTERVAL_MS" "$CK/par" stage_configs/kani_tts.yaml 450 250:64,256
      unset KANI_GIL_SWITCH_INTERVAL_MS
      cleanup
      step_rates
      pack servedgil ;;
    servedtables)
      checkpoints
      # vLLM-Omni's five stats tables per finished request instead of one [KaniRequestStats] line: their served A/B
      # (loop stalls, "admitted -> handler"); send beside `served`.
      KANI_REQUEST_TABLES=1 serve_sweeps 0 shipped-tables "$CK/par" stage_configs/kani_tts.yaml 450 250:64,256
      cleanup
      frames_check shipped-tables
      step_rates
      pack servedtables ;;
    samplergil)
      checkpoints
      KANI_GIL_SWITCH_INTERVAL_MS=${GIL_MS:-0.5} sampled_steps "stage0-gil${GIL_MS:-0.5}" omni "$CK/par"
      cleanup
      pack samplergil ;;
    servedsampler)
      # SAMPLER (default 0: none) names the patches, as KANI_STAGE0_SAMPLER_PATCHES does.
      checkpoints
      tag=shipped-sampler-$(echo "${SAMPLER:-0}" | tr ',_' '--')
      export KANI_STAGE0_SAMPLER_PATCHES=${SAMPLER:-0}
      serve_sweeps 0 "$tag" "$CK/par" stage_configs/kani_tts.yaml 450 250:64,256
      unset KANI_STAGE0_SAMPLER_PATCHES
      cleanup
      frames_check "$tag"
      step_rates
      pack "servedsampler-${SAMPLER:-0}" ;;
    abstep)
      checkpoints
      step cuda-sampling-tests 180 python3 -m pytest -q -p no:cacheprovider \
        tests/test_seeded_noise.py tests/test_code_sampler.py tests/test_penalty_counts.py
      ab_steps ab-penalty-counts 1
      cleanup
      pack abstep ;;
    abrace)
      # The code heads sampled in one kernel (code_race_kernel, up to 16 requests a step) A/B'd alone on top of the
      # default patches: the sampled step held at batches 1, 4 and 16 with async scheduling (Stage 0 as served; above
      # code_race.MAX_ROWS both sides are vLLM's path), then its CUDA tests. Seeded steps never take FlashInfer's
      # sampler (see batch1). The A/B comes first (a fresh engine starts in ~200 s); the interpreted test is CI's.
      export VLLM_USE_FLASHINFER_SAMPLER=0
      checkpoints
      KANI_SAMPLER_AB_PATCHES=code_race_kernel AB_BATCHES=${AB_BATCHES:-1,4,16} ab_steps ab-code-race \
        "$(with_default_patches code_race_kernel)" --async-scheduling
      cleanup
      pack abrace
      step race-tests 240 python3 -m pytest -q -p no:cacheprovider -k "not interpreter" tests/test_code_race.py \
        tests/test_code_sampler.py
      pack abrace ;;
    abracesrv)
      # code_race_kernel A/B'd alone in the served engine at one stream (the RTF target). Seeded requests
      # never take FlashInfer's sampler, which a fresh machine compiles for ~2 minutes at start (see batch1).
      export VLLM_USE_FLASHINFER_SAMPLER=0
      AB_SWEEPS=${AB_SWEEPS:-250:1} AB_WINDOW_BATCHES=${AB_WINDOW_BATCHES:-1} \
        ab_patch abracesrv code_race_kernel code-race -k "not interpreter" tests/test_code_race.py ;;
    abserved)
      checkpoints
      export KANI_STAGE0_SAMPLER_PATCHES=1 KANI_SAMPLER_AB_PERIOD_S=${AB_PERIOD_S:-2}
      serve_sweeps 0 shipped-ab "$CK/par" stage_configs/kani_tts.yaml 450 250:64,256
      unset KANI_STAGE0_SAMPLER_PATCHES KANI_SAMPLER_AB_PERIOD_S
      cleanup
      frames_check shipped-ab
      python3 benchmarks/ab_windows.py "$R/serve-shipped-ab.log" --batches 64,256 --min-share 0.7 \
        --json "$R/ab-served.json" | tee "$R/ab-served.md"
      pack abserved ;;
    abcodebook1)
      # The seeded codebook-1 noise (codebook1_noise) A/B'd alone (the patch once lost frames to noise of exactly 0).
      ab_patch abcodebook1 codebook1_noise codebook1 tests/test_codebook1_noise.py ;;
    abtopk)
      # Top-k/top-p over the columns the speech mask can leave open (top_k_open_columns): its device time against
      # vLLM's kernel on whole rows (benchmarks/bench_top_k.py), then A/B'd alone in the served engine.
      device_info
      step bench-top-k 120 python3 benchmarks/bench_top_k.py --rows 64 256 --out "$R"
      ab_patch abtopk top_k_open_columns top-k-open tests/test_open_columns.py tests/test_code_sampler.py ;;
    samplertests)
      # Stage 0's CUDA-only tests (the CPU CI skips them), the load-time warm-ups included (the interpreted test of
      # the one-kernel sampler is CI's).
      step sampler-tests 240 python3 -m pytest -q -p no:cacheprovider -k "not interpreter" tests/test_open_columns.py \
        tests/test_code_sampler.py tests/test_codebook1_noise.py tests/test_step_payload.py tests/test_code_race.py
      pack samplertests ;;
    lazy)
      checkpoints
      KANI_LAZY_SUBMIT=1 serve_sweeps 0 lazy-submit "$CK/par" stage_configs/kani_tts.yaml 450 250:64,256
      cleanup
      frames_check lazy-submit
      step_rates
      pack lazy ;;
    convwarmuptests)
      # The short-conv Triton warm-up's CUDA tests: a stock LFM2 engine's first mixed steps compile none of the warmed
      # kernels, and without the warm-up some do (tests/test_short_conv_warmup.py; the kernels compiled per side).
      step convwarmup-tests 480 python3 -m pytest -q -s -p no:cacheprovider -rs tests/test_short_conv_warmup.py ;;
    leantests)
      # LeanShortConv on CUDA: an engine in piecewise graphs split at the lean op gives the reference model's greedy
      # codes across steps that mix prefill chunks and decodes (tests/test_lean_short_conv.py).
      step lean-tests 420 python3 -m pytest -q -p no:cacheprovider -rs tests/test_lean_short_conv.py ;;
    earlytests)
      step early-tests 120 python3 -m pytest -q -p no:cacheprovider tests/test_early_start.py ;;
    servedoff)
      # The same with the API server's two patches off (numpy PCM, summaries off the loop): their effect.
      checkpoints
      export KANI_DISABLE_PATCHES=encode_pcm_with_numpy,log_request_summaries_off_the_event_loop
      serve_sweeps 0 shipped-unpatched "$CK/par" stage_configs/kani_tts.yaml 450 250:64,256
      unset KANI_DISABLE_PATCHES
      cleanup
      pack servedoff ;;
    kernels|stockkernels)
      checkpoints
      if [ "$phase" = kernels ]; then kernel_tables stage0-kernels omni "$CK/par" 540
      else kernel_tables stock-kernels vllm "$CK/flat" 540; fi
      cleanup
      pack "$phase" ;;
    mps)
      checkpoints
      if mps_start; then
        if [ -n "${MPS_YAML:-}" ]; then
          serve_sweeps 0 "mps-$(basename "$MPS_YAML" .yaml)" "$CK/par" "$MPS_YAML" 480 250:64,256
          frames_check "mps-$(basename "$MPS_YAML" .yaml)"
        else
          serve_sweeps 0 mps "$CK/par" stage_configs/kani_tts.yaml 420 64:256 250:64,256
        fi
        cleanup
        mps_stop
      fi
      pack mps ;;
    memory)
      memory_steps
      pack memory ;;
    roundup)
      served_variant roundup round-up 330 stages.1.additional_config.codec_replay_plan=round_up ;;
    servedalt)
      checkpoints
      alt_root || exit 2
      alt_sweeps 0 alt "$CK/par" stage_configs/kani_tts.yaml 450 250:64,256
      cleanup
      frames_check alt
      step_rates
      pack servedalt ;;
    servedtrace)
      checkpoints
      KANI_TRACE_CHUNKS=1 serve_sweeps 0 traced "$CK/par" stage_configs/kani_tts.yaml 450 250:64,256
      cleanup
      python3 benchmarks/chunk_waits.py "$R/serve-traced.log" --json "$R/chunk-waits-traced.json" \
        > "$R/chunk-waits-traced.md" 2>&1; head -n 40 "$R/chunk-waits-traced.md"
      gzip -kf "$R/serve-traced.log"
      pack servedtrace ;;
    stepbound)
      tag=step-max-${STEP_MAX_FRAMES:-1024}
      served_variant "$tag" "$tag" 330 stages.1.additional_config.codec_step_max_frames="${STEP_MAX_FRAMES:-1024}" ;;
    alone)
      served_variant alone alone "${ALONE_LIMIT_S:-330}" \
        "stages.1.additional_config.codec_first_chunks_alone=${ALONE:-false}" ;;
    servedenv)
      # `served` with SERVED_ENV (space-separated KEY=VALUE, e.g. KANI_FAST_DECODE_SLOTS=0) in every server process:
      # a same-instance A/B of a switch; labelled SERVED_ENV_LABEL (default env).
      served_env "${SERVED_ENV_LABEL:-env}" "${SERVED_ENV:?SERVED_ENV=KEY=VALUE...}" "${SERVED_ENV_LIMIT_S:-330}" ;;
    abenv)
      checkpoints
      [ -f "$R/device.txt" ] || device_info
      i=$(find "$R" -maxdepth 1 -name 'serve-*-[0-9]*.log' | wc -l)
      case " ${AB_ORDER:-env shipped env} " in
        *" env "*) [ -n "${SERVED_ENV:-}${SERVED_YAML:-}${SERVED_CHANGES:-}" ] \
          || { echo "abenv's env side needs SERVED_ENV, SERVED_YAML or SERVED_CHANGES"; exit 2; } ;;
      esac
      if [ -n "${SERVED_CHANGES:-}" ]; then
        IFS=';' read -ra changes <<< "$SERVED_CHANGES"
        variant kani_tts_abenv "${changes[@]}"
        SERVED_YAML=stage_configs/kani_tts_abenv.yaml
      fi
      for side in ${AB_ORDER:-env shipped env}; do
        i=$((i + 1))
        label="${AB_BASE_LABEL:-shipped}-$i" vars="" yaml="${AB_YAML:-stage_configs/kani_tts.yaml}"
        if [ "$side" = env ]; then
          label="${SERVED_ENV_LABEL:-env}-$i" vars="${SERVED_ENV:-}" yaml="${SERVED_YAML:-$yaml}"
        elif [ "$side" = mps ]; then
          label="mps-$i"
          mps_start || continue
        elif [ "$side" = flat ]; then
          label="flat-$i"
          export SERVE_FLAT=1
        fi
        # AB_FRESH=1: each side compiles afresh in a compile cache of its own, as on a machine's first start.
        [ "${AB_FRESH:-0}" = 1 ] && export SERVE_CACHE_ROOT="/tmp/vc-fresh-$i"
        if [ "$side" = env ] && [ -n "${AB_TRITON_WITHOUT:-}" ]; then
          vars="$vars TRITON_CACHE_DIR=$(triton_cache_without "/tmp/triton-without-$i" $AB_TRITON_WITHOUT)"
        fi
        # shellcheck disable=SC2086
        serve_env "$label" "$vars" "$yaml" "${SERVED_ENV_LIMIT_S:-330}" ${AB_WAVES:+--waves $AB_WAVES}
        unset SERVE_CACHE_ROOT SERVE_FLAT
        [ "$side" = mps ] && mps_stop
        pack abenv  # after every side: a call cut in a later side still returns the finished ones
      done
      step_rates
      pack abenv ;;
    threads)
      # Every process of the server (API server, both engine cores) with OMP_NUM_THREADS=THREADS: torch's intra-op
      # pool at that size instead of one thread per core (vLLM's multiproc executor does the same for its workers;
      # a one-GPU stage runs its worker in the engine core, which keeps the full pool).
      served_env "threads-${THREADS:-1}" "OMP_NUM_THREADS=${THREADS:-1}" "${THREADS_LIMIT_S:-330}" ;;
    capture)
      checkpoints
      max=${CAPTURE_MAX:-512}
      if [ "$max" -le 512 ]; then
        variant kani_tts_capture "stages.0.compilation_config={max_cudagraph_capture_size: $max}"
      else
        # The shipped file's sizes up to CAPTURE_MAX (it lists them to 2,048).
        sizes=$(python3 -c "import sys, yaml; m = int(sys.argv[1])
stage0 = yaml.safe_load(open('stage_configs/kani_tts.yaml'))['stages'][0]
print(','.join(str(s) for s in stage0['compilation_config']['cudagraph_capture_sizes'] if s <= m))" "$max")
        variant kani_tts_capture "stages.0.compilation_config.cudagraph_capture_sizes=[$sizes]"
      fi
      serve_sweeps 0 capture "$CK/par" stage_configs/kani_tts_capture.yaml "${CAPTURE_LIMIT_S:-470}" 250:64,256
      cleanup
      grep -ohE "'max_cudagraph_capture_size': [0-9]+|PIECEWISE\): +0%\|[^|]*\| 0/[0-9]+|Graph capturing finished.*" \
        "$R/serve-capture.log" | sort -u > "$R/capture-sizes.txt" || true
      frames_check capture
      step_rates
      pack capture ;;
    stagger)
      checkpoints
      variant kani_tts_alone "stages.1.additional_config.codec_first_chunks_alone=${ALONE:-false}"
      runs="250:64:${STAGGER64_S:-2.5} 250:256:${STAGGER256_S:-7}"
      for side in ${STAGGER_SIDES:-shipped alone}; do
        label=staggered yaml=stage_configs/kani_tts.yaml
        [ "$side" = alone ] && label=staggered-alone yaml=stage_configs/kani_tts_alone.yaml
        # shellcheck disable=SC2086
        serve_sweeps 0 "$label" "$CK/par" "$yaml" "${STAGGER_LIMIT_S:-330}" $runs
        cleanup
        frames_check "$label"
      done
      step_rates
      pack stagger ;;
    ramp)
      checkpoints
      tag=ramp-${INITIAL:-1}-${CHUNK:-2}
      variant "kani_tts_$tag" connectors.shm.extra.initial_codec_chunk_frames="${INITIAL:-1}" \
        connectors.shm.extra.codec_chunk_frames="${CHUNK:-2}"
      serve_sweeps 0 "$tag" "$CK/par" "stage_configs/kani_tts_$tag.yaml" 330 250:64,256
      cleanup
      frames_check "$tag"
      step_rates
      pack "$tag" ;;
    chunk32)
      checkpoints
      variant kani_tts_chunk32 connectors.shm.extra.max_codec_chunk_frames=32
      serve_sweeps 0 chunk32 "$CK/par" stage_configs/kani_tts_chunk32.yaml 330 250:64,256
      cleanup
      frames_check chunk32
      step_rates
      pack chunk32 ;;
    budget)
      checkpoints
      variant kani_tts_codec_budget64 stages.1.max_num_seqs=64 stages.1.additional_config.codec_state_slots=1024
      serve_sweeps 0 codec-budget64 "$CK/par" stage_configs/kani_tts_codec_budget64.yaml 420 64:256 250:256
      cleanup
      pack budget ;;
    detcompile)
      # A fresh machine's two Stage-0 engines disagreed twice on a greedy request (forty-fifth set): does the
      # deterministic mode hold two fresh compiles together, and what does its step cost?
      checkpoints
      [ -f "$R/device.txt" ] || device_info
      det_yaml="$R/kani_tts_lm_det.yaml"
      python3 -m vllm_omni_kani.benchmarks.variants benchmarks/configs/kani_tts_lm.yaml "$det_yaml" \
        "stages.0.compilation_config.inductor_compile_config={deterministic: true, combo_kernels: true, benchmark_combo_kernel: false}" \
        > /dev/null
      runs=${DET_RUNS:-det-a det-a2 det-b default-a default-a2 default-b}
      for run in $runs; do
        yaml=benchmarks/configs/kani_tts_lm.yaml picks=0
        case $run in det-*) yaml=$det_yaml ;; picks-*) picks=1 ;; esac
        cache="/tmp/vc-${run%2}"  # X-a2 loads what X-a compiled
        [ "$cache" = "/tmp/vc-$run" ] && rm -rf "$cache"
        # Inductor's runtime autotuning logged: which run benchmarks a kernel's launch configs at its first launch
        # (docs/BENCHMARKS.md, forty-sixth set, "Which engine times which kernels").
        step "$run" "${DET_LIMIT_S:-360}" env VLLM_CACHE_ROOT="$cache" TORCH_LOGS="$INDUCTOR_AUTOTUNE_LOGS" \
          KANI_INDUCTOR_SAVED_PICKS=$picks python3 -m \
          vllm_omni_kani.benchmarks.step_time "$CK/par" --engine omni --deploy-config "$yaml" --batches 1,64,256 \
          --codes-alone --label "$run" --out "$R"
        autotune_evidence "$run" "$cache"
        cleanup
        pack detcompile
      done
      # Each compile/load pair that ran (X-a/X-a2, X-c/X-c2, ...), each further fresh compile against X-a (X-b, X-c),
      # then the two modes.
      pairs=()
      for run in $runs; do
        case $run in
          *2) pairs+=("${run%2} $run") ;;
          *-b|*-c) pairs+=("${run%-?}-a $run") ;;
        esac
      done
      for pair in "${pairs[@]}" "det-a default-a"; do
        read -r a b <<< "$pair"
        [ -f "$R/$a.json" ] && [ -f "$R/$b.json" ] && step "agreement-$a-$b" 60 python3 -m \
          vllm_omni_kani.benchmarks.step_time --compare "$R/$a.json" "$R/$b.json" --label "agreement-$a-$b" --out "$R"
      done
      pack detcompile ;;
    warmups)
      # A fresh machine's first Stage-0 engine spent 81-127 s loading its model, mostly the load-time Triton warm-ups
      # one after another (forty-sixth set): each run loads Stage 0 with an empty Triton cache of its own, the warm-ups
      # one after another (seq) or at once (conc, KANI_CONCURRENT_WARM_UPS=1), alternating; its "Model loading took"
      # line says what the load cost. Then the CUDA test that no sampled step compiles after either kind of warm-up.
      checkpoints
      n=0
      for side in ${WARMUP_SIDES:-seq conc seq conc}; do
        n=$((n + 1))
        flag=0
        [ "$side" = conc ] && flag=1
        rm -rf "/tmp/triton-warmups-$n"
        step "warmups-$side-$n" 280 env TRITON_CACHE_DIR="/tmp/triton-warmups-$n" KANI_CONCURRENT_WARM_UPS=$flag \
          VLLM_CACHE_ROOT=/tmp/vc-warmups python3 -m vllm_omni_kani.benchmarks.step_time "$CK/par" --engine omni \
          --batches 1 --label "warmups-$side-$n" --out "$R"
        grep -ho "Model loading took.*\|Loading weights took.*" "$R/warmups-$side-$n.log" | tail -n 2
        cleanup
      done
      step warmup-tests 300 python3 -m pytest -q -p no:cacheprovider tests/test_code_sampler.py -k "no_sampled_step"
      pack warmups ;;
    int4)
      checkpoints
      for v in par flat; do
        [ -f "$CK/$v-w4a16/config.json" ] || python3 -m vllm_omni_kani.tools.quantize_w4a16 "$CK/$v" "$CK/$v-w4a16" \
          --group-size 128 --backend rtn > "$R/quantize-$v.log" 2>&1
      done
      # bf16 references: those of an earlier stage0 phase in this call sequence when present.
      [ -f "$R/stock.json" ] || step stock 200 python3 -m vllm_omni_kani.benchmarks.step_time "$CK/flat" \
        --engine vllm --label stock --out "$R"
      step stock-w4a16 200 python3 -m vllm_omni_kani.benchmarks.step_time "$CK/flat-w4a16" --engine vllm \
        --label stock-w4a16 --out "$R"
      [ -f "$R/stage0.json" ] || step stage0 240 python3 -m vllm_omni_kani.benchmarks.step_time "$CK/par" \
        --engine omni --label stage0 --out "$R" --codes
      step stage0-w4a16 240 python3 -m vllm_omni_kani.benchmarks.step_time "$CK/par-w4a16" --engine omni \
        --label stage0-w4a16 --out "$R" --codes
      step agreement 60 python3 -m vllm_omni_kani.benchmarks.step_time --compare "$R/stage0.json" \
        "$R/stage0-w4a16.json" --label agreement-w4a16 --out "$R"
      pack int4 ;;
    *) echo "unknown phase $phase (see the list at the top)"; exit 2 ;;
  esac
done
