# Sourced by the per-machine GPU suites (h200.sh, h200x2.sh) on the offline GPU machine, after
# ../shared/device/stage.sh unpacked the stack into /tmp/site. Results collect in $R and travel back as one tarball
# under $OUT after every phase, so a call cut short still returns what it finished.
set -u
# Run the package as committed: the transferred working tree can hold unfinished edits of other work. A call that
# carries .devsrc/src.tar (`git archive HEAD vllm_omni_kani stage_configs benchmarks -o .devsrc/src.tar`) uses it.
if [ -f .devsrc/src.tar ]; then
  rm -rf vllm_omni_kani && tar -xf .devsrc/src.tar && echo "package: $(cat .devsrc/commit 2>/dev/null)"
fi
# Wheels the image lacks (pytest for the CUDA-only tests, py-spy for the profile phase), carried in .whl/, made here:
#   python3 -m pip download -d .whl --only-binary :all: --platform manylinux2014_x86_64 --python-version 3.12 \
#     pytest==8.4.2 py-spy==0.4.1
if ls .whl/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/whl .whl/*.whl
fi
export PYTHONPATH=$PWD:/tmp/kani-dist:/tmp/site:/tmp/whl
export PATH=/tmp/whl/bin:$PATH  # py-spy, when its wheel is carried
# Stage 0 logs its step rate every 5 s (step_meter.py): the served step period, beside step_time's.
export KANI_STEP_STATS_S=${KANI_STEP_STATS_S:-5}
# ... and each stage's scheduler its requests' first outputs (core/sched/first_outputs.py; benchmarks/first_outputs.py
# splits the engines' part of a traced first audio with them).
export KANI_TRACE_FIRST_OUTPUTS=${KANI_TRACE_FIRST_OUTPUTS:-1}
# ... and Stage 0's scheduler each freed request's output tokens (core/sched/finished_tokens.py): audio_vs_frames.py
# checks the requests whose last Stage-0 output the orchestrator dropped with them.
export KANI_LOG_STAGE0_FINISHED=${KANI_LOG_STAGE0_FINISHED:-1}
# ... and the API server its event-loop lag (entrypoints/loop_lag.py): do new requests wait behind a blocked loop?
export KANI_LOOP_LAG_S=${KANI_LOOP_LAG_S:-5}
# ... with the stacks its loop thread stood in while the loop did not tick for 50 ms (entrypoints/loop_stalls.py)
export KANI_LOOP_STALL_MS=${KANI_LOOP_STALL_MS:-50}
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false VLLM_LOGGING_COLOR=0
# JIT caches. On a fresh machine Stage 0 spent 97 s between its profiling run and its KV-cache line (11-14 s once the
# machine had compiled them: eighth set), so a served phase needs 4 minutes to start. pack returns Triton's cache
# and vLLM's compile caches (VLLM_CACHE_ROOT=/tmp/vcN) as $OUT/jit-cache.tgz; carried back as .devjit/jit-cache.tgz
# (its own carry path, in a call after the staging ones), they are restored here once per machine.
export TRITON_CACHE_DIR=/tmp/jit-triton
if [ -f .devjit/jit-cache.tgz ] && [ ! -e /tmp/jit-restored ]; then
  tar -C /tmp -xzf .devjit/jit-cache.tgz && touch /tmp/jit-restored && echo "JIT caches restored"
  # A cache made on one GPU serves the others of the same kind (a server per GPU: VLLM_CACHE_ROOT=/tmp/vcN).
  for n in 1 2 3; do [ -d /tmp/vc0 ] && [ ! -e /tmp/vc$n ] && cp -r /tmp/vc0 /tmp/vc$n; done
fi
R=/tmp/kani-results
CK=/tmp/ck
Y=/tmp/kani-yaml
mkdir -p "$R" "$CK" "$Y"

# The repo is on PYTHONPATH but not installed: give it a dist-info so vLLM finds its plugin entry points
# (models, pipelines, adapter) in every process it starts.
python3 - <<'PY'
import pathlib, tomllib
meta = tomllib.loads(pathlib.Path("pyproject.toml").read_text())["project"]
d = pathlib.Path("/tmp/kani-dist") / f"vllm_omni_kani-{meta['version']}.dist-info"
d.mkdir(parents=True, exist_ok=True)
(d / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm-omni-kani\nVersion: {meta['version']}\n")
eps = [f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in entries.items())
       for group, entries in meta.get("entry-points", {}).items()]
(d / "entry_points.txt").write_text("\n".join(eps))
PY

# step NAME LIMIT_S CMD...: CMD under `timeout -k` (no watchdog left sleeping: the call ends when the work does),
# logged to $R/NAME.log. Steps run side by side on different GPUs, so a step kills nothing but its own command;
# serve_sweeps.py stops its server on SIGTERM, and `cleanup` ends a phase.
step() {
  local name=$1 limit=$2; shift 2
  local start=$SECONDS rc
  timeout -k 20 "$limit" "$@" > "$R/$name.log" 2>&1
  rc=$?
  echo "[$name] rc=$rc in $((SECONDS - start)) s"
  grep -E "^(c=|warm-up|e2e|wrote|\||[a-z0-9]+: streamed SNR)|Error|error:|passed|failed" "$R/$name.log" | tail -n 14
  [ "$rc" = 0 ] || { echo "[$name] last lines:"; tail -n 12 "$R/$name.log" | cut -c1-300; }
}

# cleanup: nothing of a phase may hold GPU memory into the next one. Servers are found by command line, sparing this
# shell and its ancestors: a device call's own command that names them (`pkill -f "bin/vllm serve"; ... h200.sh`)
# was killed with them, which ended the call after its first side. CLEANUP_PATTERN (pgrep's) is for the test.
cleanup() {
  local keep=" " pid=$$ p
  while [ "${pid:-1}" -gt 1 ]; do keep+="$pid "; pid=$(ps -o ppid= -p "$pid" 2> /dev/null | tr -d ' '); done
  for p in $(pgrep -f "${CLEANUP_PATTERN:-vllm serve|vllm_omni}"); do
    case "$keep" in *" $p "*) ;; *) kill -9 "$p" 2> /dev/null ;; esac
  done
  sleep 2
}

# pack TAG: everything gathered so far, as one file back. Each archive is written beside its name and renamed into
# place, so a call cut by its time limit mid-pack keeps the previous whole archive instead of a truncated one.
pack() {
  python3 -m vllm_omni_kani.cli bench --report-only --out "$R" > /dev/null 2>&1 || true
  tar -C /tmp -czf "$OUT/.results-$1.tgz.part" kani-results && mv -f "$OUT/.results-$1.tgz.part" "$OUT/results-$1.tgz"
  local caches=""
  # PACK_JIT_CACHE=0: a call that will not carry the caches back skips their tarball (tens of seconds a pack).
  [ "${PACK_JIT_CACHE:-1}" = 1 ] && caches=$(cd /tmp && ls -d jit-triton vc[0-9]* 2> /dev/null)
  if [ -n "$caches" ]; then
    # shellcheck disable=SC2086
    tar -C /tmp -czf "$OUT/.jit-cache.tgz.part" $caches && mv -f "$OUT/.jit-cache.tgz.part" "$OUT/jit-cache.tgz"
    # Whether it can come back (a returned file's limit) to be carried as .devjit/jit-cache.tgz.
    echo "jit-cache.tgz: $(du -m "$OUT/jit-cache.tgz" | cut -f1) MiB"
  fi
  rm -f "$OUT"/.*.part
}

# triton_cache_without DIR KERNEL...: DIR as a copy of Triton's cache ($TRITON_CACHE_DIR) less every entry that holds
# one of the kernels, so a server given it compiles those on first use and reads the rest back. Prints DIR.
triton_cache_without() {
  local dir=$1 entry kernel; shift
  rm -rf "$dir"; mkdir -p "$dir"
  [ -d "$TRITON_CACHE_DIR" ] && cp -r "$TRITON_CACHE_DIR"/. "$dir"/
  for entry in "$dir"/*/; do
    [ -d "$entry" ] || continue
    for kernel in "$@"; do
      if compgen -G "$entry$kernel.*" > /dev/null; then rm -rf "$entry"; break; fi
    done
  done
  echo "$dir"
}

device_info() {
  nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader | tee "$R/device.txt"
  python3 -c "import torch, vllm, vllm_omni, transformers; print('torch', torch.__version__, 'vllm', vllm.__version__, \
'vllm_omni', vllm_omni.__version__, 'transformers', transformers.__version__, 'gpus', torch.cuda.device_count())" \
    2>&1 | tail -1 | tee -a "$R/device.txt"
  # The host's CPU: instances of one kind differ in it, and the API server's Python runs on it.
  lscpu | grep -E "^(CPU\(s\)|Model name):" | tee -a "$R/device.txt"
}

checkpoints() {
  [ -f "$CK/par/config.json" ] || python3 -m vllm_omni_kani.tools.make_checkpoint "$CK/par" --preset 350m \
    --variant parallel --force > "$R/ckpt-par.log" 2>&1 &
  [ -f "$CK/flat/config.json" ] || python3 -m vllm_omni_kani.tools.make_checkpoint "$CK/flat" --preset 350m \
    --variant flattened --force > "$R/ckpt-flat.log" 2>&1 &
  # vLLM's model-info cache, once a machine, beside the factory rather than in the first server's start (79 s there on
  # a fresh H200: modelinfo_warm.py).
  [ -n "$(ls /tmp/vc0/modelinfos 2> /dev/null)" ] \
    || VLLM_CACHE_ROOT=/tmp/vc0 python3 benchmarks/gpu/modelinfo_warm.py > "$R/modelinfo-warm.log" 2>&1 &
  wait
  # A server on GPU N keeps its caches in /tmp/vcN; the same model info serves each.
  for n in $(seq 1 $(($(nvidia-smi -L | wc -l) - 1))); do
    mkdir -p "/tmp/vc$n/modelinfos" && cp -n /tmp/vc0/modelinfos/*.json "/tmp/vc$n/modelinfos/" 2> /dev/null || true
  done
  ls "$CK/par" "$CK/flat" | tr '\n' ' '; echo
}

# serve_sweeps GPU LABEL CKPT YAML LIMIT_S RUN...: one server on GPU, then one `bench --url` per RUN, each
# "FRAMES:CONCURRENCY_LIST" (e.g. 64:1,64,256), labelled LABEL-fFRAMES; the first run also does the e2e check.
# The GPU's utilisation and memory every 500 ms ride along in $R/gpu-util-LABEL.csv (wall-clock timestamps, as the
# server log's): is the GPU saturated while the load runs? vLLM's compile caches live in /tmp/vcGPU, or in
# SERVE_CACHE_ROOT where set (an empty one compiles afresh, as a machine's first server does).
serve_sweeps() {
  local gpu=$1 label=$2 ckpt=$3 yaml=$4 limit=$5 smi; shift 5
  nvidia-smi -i "$gpu" --query-gpu=timestamp,index,utilization.gpu,memory.used --format=csv,noheader -lms 500 \
    > "$R/gpu-util-$label.csv" 2> /dev/null &
  smi=$!
  step "$label" "$limit" env CUDA_VISIBLE_DEVICES="$gpu" VLLM_CACHE_ROOT="${SERVE_CACHE_ROOT:-/tmp/vc$gpu}" \
    python3 benchmarks/gpu/serve_sweeps.py --ckpt "$ckpt" --deploy-config "$yaml" --label "$label" --out "$R" "$@"
  kill "$smi" 2> /dev/null; wait "$smi" 2> /dev/null
}

# alt_root: /tmp/alt-repo, the tree's benchmarks and YAMLs beside the package of a carried .devsrc/alt.tar
# (.devsrc/alt-commit says what it is, e.g. HEAD with a change reverted), for a code A/B. A server runs the package of
# the repo root it starts in (that root comes first on sys.path), so the alt side starts there: alt_sweeps.
alt_root() {
  [ -f .devsrc/alt.tar ] || { echo "no .devsrc/alt.tar carried"; return 1; }
  rm -rf /tmp/alt-repo && mkdir -p /tmp/alt-repo \
    && tar -c --exclude=benchmarks/results benchmarks stage_configs pyproject.toml | tar -C /tmp/alt-repo -x \
    && tar -C /tmp/alt-repo -xf .devsrc/alt.tar
  cp .devsrc/alt-commit "$R/alt-commit.txt" 2> /dev/null
  diff -rq vllm_omni_kani /tmp/alt-repo/vllm_omni_kani -x __pycache__ | tee -a "$R/alt-commit.txt"
}

# alt_sweeps GPU LABEL CKPT YAML LIMIT_S RUN...: serve_sweeps with the alt_root package.
alt_sweeps() { (cd /tmp/alt-repo && PYTHONPATH=/tmp/alt-repo:$PYTHONPATH serve_sweeps "$@"); }

# frames_check LABEL: does every request's audio equal its Stage-0 frames? Read from serve_sweeps LABEL's server log.
# frames_check LABEL [TOKENS_PER_FRAME]: every request's audio against its Stage-0 frames (4 tokens a frame for a
# flattened checkpoint; default 1, the parallel heads).
frames_check() {
  step "audio-vs-frames-$1" 60 python3 benchmarks/audio_vs_frames.py "$R/serve-$1.log" --tokens-per-frame "${2:-1}" \
    --json "$R/audio-vs-frames-$1.json"
}

# step_rates: Stage 0's step-meter lines of every served log so far (steps/s, ms per step, rows/s, mean batch), and the
# API server's event-loop lag lines.
step_rates() {
  for f in "$R"/serve-*.log; do
    [ -f "$f" ] && grep -oE "kani (stage0 steps|stage0 step kinds|api loop lag): .*" "$f" | sed "s|^|$(basename "$f" .log): |" \
      | tee "$R/step-rates-$(basename "$f" .log).txt" | tail -n 30
  done
}

# The Stage-0 step, ours vs stock vLLM on the same backbone (sampled, with our greedy codes for --compare).
stage0_steps() {
  step stock 200 python3 -m vllm_omni_kani.benchmarks.step_time "$CK/flat" --engine vllm --label stock \
    --out "$R" --sampled
  step stage0 240 python3 -m vllm_omni_kani.benchmarks.step_time "$CK/par" --engine omni --label stage0 \
    --out "$R" --sampled --codes
}

# sampled_steps LABEL ENGINE CKPT: the step at batches 64 and 256, greedy then sampled (an engine start is ~90 s on
# the one-GPU machine, hence one engine per call).
sampled_steps() {
  step "$1" 280 python3 -m vllm_omni_kani.benchmarks.step_time "$3" --engine "$2" --label "$1" --out "$R" \
    --batches 64,256 --sampled
}

# with_default_patches NAME: the default Stage-0 sampler patches (envs.DEFAULT_SAMPLER_PATCHES) and NAME (once), as
# KANI_STAGE0_SAMPLER_PATCHES takes them: a switch off by default, on top of the defaults.
with_default_patches() {
  python3 -c "import sys; from vllm_omni_kani.envs import DEFAULT_SAMPLER_PATCHES as d
print(','.join(dict.fromkeys((*d, sys.argv[1]))))" "$1"
}

# ab_steps LABEL PATCHES [STEP_TIME_OPTION...]: the sampled Stage-0 step held at each of AB_BATCHES (64,256) in turn
# (step_time soaks, AB_SOAK_S s each) with KANI_STAGE0_SAMPLER_PATCHES=PATCHES taken in even AB_PERIOD_S-s windows and
# vLLM's path in odd ones (KANI_SAMPLER_AB_PATCHES, where set, names the ones that alternate), in one engine;
# benchmarks/ab_windows.py pairs neighbouring windows of the step meter.
ab_steps() {
  local name=$1 patches=$2 batches=${AB_BATCHES:-64,256}
  shift 2
  KANI_STAGE0_SAMPLER_PATCHES=$patches KANI_SAMPLER_AB_PERIOD_S=${AB_PERIOD_S:-2} step "$name" 420 \
    python3 -m vllm_omni_kani.benchmarks.step_time "$CK/par" --engine omni --label "$name" --out "$R" \
    --batches "$batches" --soak-seconds "${AB_SOAK_S:-40}" --soak-batches "$batches" --soak-sampled "$@"
  python3 benchmarks/ab_windows.py "$R/$name.log" --batches "$batches" --json "$R/ab-$name.json" | tee "$R/ab-$name.md"
}

# kernel_tables NAME ENGINE CKPT LIMIT_S [OPTION...]: the step at batch 256, greedy and sampled, under vLLM's torch
# profiler (step_time --torch-profile; OPTIONs are step_time's, after these, e.g. --batches 1,8 --profile-batch 1); the
# top of each kernel table is printed, the tables travel in $R/NAME-profile/.
kernel_tables() {
  local name=$1 engine=$2 ckpt=$3 limit=$4
  shift 4
  step "$name" "$limit" python3 -m vllm_omni_kani.benchmarks.step_time "$ckpt" --engine "$engine" --label "$name" \
    --out "$R" --batches 256 --sampled --torch-profile "/tmp/kani-prof/$name" "$@"
  for t in "$R/$name-profile"/*/*; do [ -f "$t" ] && { echo "== $t"; head -c 2500 "$t"; echo; }; done
}

# stage0_async_steps: the Stage-0 step with async scheduling and vLLM-Omni's deferred output building, and its
# greedy codes compared with those of stage0_steps.
stage0_async_steps() {
  step stage0-async 240 python3 -m vllm_omni_kani.benchmarks.step_time "$CK/par" --engine omni \
    --label stage0-async --out "$R" --sampled --codes --async-output
  step agreement-async 60 python3 -m vllm_omni_kani.benchmarks.step_time --compare "$R/stage0.json" \
    "$R/stage0-async.json" --label agreement-async --out "$R"
}

# spy_step NAME ENGINE CKPT [--soak-sampled] [BATCH]: the Stage-0 step at batch BATCH (256) held steady (step_time
# --soak-seconds, greedy unless told) while py-spy samples its engine-core process for 15 s: where the host time of
# a step goes.
spy_step() {
  local name=$1 engine=$2 ckpt=$3 core
  mkdir -p "$R/profile"
  timeout -k 20 300 python3 -m vllm_omni_kani.benchmarks.step_time "$ckpt" --engine "$engine" --label "$name" \
    --out "$R/profile" --batches "${5:-256}" --soak-seconds 25 ${4:-} > "$R/profile/$name.log" 2>&1 &
  local job=$!
  for _ in $(seq 1 240); do grep -q "soak: start" "$R/profile/$name.log" && break; sleep 1; done
  sleep 3
  # The engine core under this job (another phase's server may run on the other GPU).
  core=$(python3 -c "import psutil, sys
print(next((p.pid for p in psutil.Process(int(sys.argv[1])).children(recursive=True)
            if 'EngineCore' in ' '.join(p.cmdline()) + p.name()), ''))" "$job")
  [ -n "$core" ] && timeout 60 py-spy record --nonblocking -r 200 -d 15 -f raw -p "$core" \
    -o "$R/profile/spy-step-$name.txt" > "$R/profile/spy-step-$name.log" 2>&1
  wait $job
  echo "[$name] $(grep -E '^batch|^soak: end' "$R/profile/$name.log" | tr '\n' ' ')"
}

# memory_steps: the codec's graphs captured under vLLM's load-time allocator limit (max_split_size_mb 20), as the
# codec stage's capture runs inside vLLM's model load, without and with the limit lifted around the capture.
memory_steps() {
  step graph-memory-split20 150 python3 benchmarks/codec_graph_memory.py --max-split-mb 20 --out "$R"
  step graph-memory-split20-lifted 150 python3 benchmarks/codec_graph_memory.py --max-split-mb 20 \
    --split-during-capture --out "$R"
}

# dp4_variant NAME KEY=VALUE...: stage_configs/NAME.yaml, kani_tts_dp.yaml with Stage 0's num_replicas 4 on devices
# 0,1,0,1 (two Stage-0 engines and a codec on each of two GPUs) and the changes. Replica r of Stage 0 is on GPU r mod 2:
# vLLM-Omni hands requests to each stage's replicas in turn, so request n meets Stage-0 replica n mod 4 and codec
# replica n mod 2, both on GPU n mod 2.
dp4_variant() {
  local name=$1; shift
  python3 -m vllm_omni_kani.benchmarks.variants stage_configs/kani_tts_dp.yaml "stage_configs/$name.yaml" \
    stages.0.num_replicas=4 stages.0.devices=0,1,0,1 "$@" > /dev/null
}

# variant NAME KEY=VALUE...: stage_configs/NAME.yaml, the shipped kani_tts.yaml with the changes (dotted paths,
# benchmarks/variants.py), e.g. stages.0.async_scheduling=true.
variant() {
  local name=$1; shift
  python3 -m vllm_omni_kani.benchmarks.variants stage_configs/kani_tts.yaml "stage_configs/$name.yaml" "$@" > /dev/null
}
