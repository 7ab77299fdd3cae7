#!/usr/bin/env bash
# Serve Kani TTS on the OpenAI-compatible /v1/audio/speech (plus /v1/audio/voices, /v1/audio/speech/batch, /health,
# /metrics): Stage 0 (LFM2 LM, audio frames) -> async_chunk -> Stage 1 (NanoCodec decoder, 22,050 Hz).
#
#   bash run_server.sh                         # factory checkpoint (made on first use), CPU or GPU YAML by machine
#   bash run_server.sh /path/to/checkpoint     # your checkpoint (parallel-head or flattened Kani layout)
#   bash run_server.sh CKPT --served-model-name kani-tts --api-key secret   # anything after CKPT goes to vllm serve
#   DRY_RUN=1 bash run_server.sh               # print the command instead of running it
#
# Environment (all optional):
#   HOST (127.0.0.1; 0.0.0.0 to accept other machines), PORT (8091),
#   DEPLOY_CONFIG   a deploy YAML; default stage_configs/kani_tts.yaml when an NVIDIA GPU answers nvidia-smi,
#                   otherwise stage_configs/kani_tts_cpu.yaml (one core per stage, sized for a 2-core box),
#   CHECKPOINT_DIR  where the default checkpoint is made (<repo>/checkpoints, git-ignored),
#   PRESET / VARIANT of that checkpoint (350m with a GPU, tiny without | parallel); its weights are random, so its
#                   audio is noise and it never stops by itself: send max_new_tokens with every request,
#   VLLM            the vllm executable (default: the project's .venv/bin/vllm, else vllm on PATH).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../../../.." && pwd)

HOST=${HOST:-127.0.0.1}
PORT=${PORT:-8091}
VLLM=${VLLM:-$([ -x "$root/.venv/bin/vllm" ] && echo "$root/.venv/bin/vllm" || echo vllm)}

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  gpu=1 default_deploy=$root/stage_configs/kani_tts.yaml default_preset=350m
else
  gpu=0 default_deploy=$root/stage_configs/kani_tts_cpu.yaml default_preset=tiny
fi
deploy=${DEPLOY_CONFIG:-$default_deploy}
[ -f "$deploy" ] || { echo "run_server.sh: deploy config $deploy not found (gpu=$gpu; set DEPLOY_CONFIG)" >&2; exit 1; }

if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then
  ckpt=$1
  shift
else
  preset=${PRESET:-$default_preset}
  variant=${VARIANT:-parallel}
  ckpt=${CHECKPOINT_DIR:-$root/checkpoints}/kani-$preset-$variant
  if [ ! -f "$ckpt/config.json" ]; then
    kani_cli=$([ -x "$root/.venv/bin/vllm-omni-kani" ] && echo "$root/.venv/bin/vllm-omni-kani" || echo vllm-omni-kani)
    echo "run_server.sh: no checkpoint given; making a random-weight $preset $variant one in $ckpt" >&2
    "$kani_cli" make-checkpoint "$ckpt" --preset "$preset" --variant "$variant" >&2
  fi
fi

args=(
  serve "$ckpt"
  # vLLM-Omni's multi-stage orchestrator: without it vLLM would serve Stage 0 alone as a text model.
  --omni
  # Stages' capacity (KV budget, max_num_seqs, eager mode, threads) and the async_chunk connector (chunk sizes);
  # the topology itself comes from the checkpoint (vllm_omni_kani/model_executor/models/kani_tts/pipeline.py).
  --deploy-config "$deploy"
  --host "$HOST"
  --port "$PORT"
  # Each stage loads and warms up in its own process; on two CPU cores that is about a minute (docs/CPU.md),
  # and the 350m preset or a first GPU start can exceed vLLM-Omni's 300 s default.
  --stage-init-timeout 900
  # Other useful flags, appended after the checkpoint argument:
  #   --served-model-name kani-tts   clients send model="kani-tts" instead of the checkpoint path
  #   --api-key KEY                  require "Authorization: Bearer KEY" on every request
  #   --allowed-origins '["https://app.example"]'   CORS for browsers calling the server directly
  #   --stage-overrides '{"0": {"max_num_seqs": 16}}'   change one stage's knob without editing the YAML
  #   --enable-log-requests / --uvicorn-log-level warning   more or less logging
)
if [ "${DRY_RUN:-0}" != 0 ]; then
  printf '%q ' "$VLLM" "${args[@]}" "$@"
  echo
  exit 0
fi
exec "$VLLM" "${args[@]}" "$@"
