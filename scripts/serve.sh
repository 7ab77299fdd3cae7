#!/usr/bin/env bash
# Serve Kani TTS at http://HOST:PORT/v1/audio/speech (sets up .venv first; fast when already done).
#   bash scripts/serve.sh                 # default checkpoint (random-weight factory model, made on first run)
#   bash scripts/serve.sh /path/to/ckpt   # a Kani checkpoint directory (parallel-head or flattened Kani-TTS)
# The deploy YAML is stage_configs/kani_tts.yaml with an NVIDIA GPU, kani_tts_cpu.yaml without;
# override with KANI_DEPLOY_CONFIG=... . Extra arguments after the checkpoint go to `vllm serve`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
py=.venv/bin/python
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then ckpt=$1; shift; else
  ckpt=$($py -c 'from vllm_omni_kani.deploy import default_checkpoint; print(default_checkpoint())' | tail -1)
fi
deploy=${KANI_DEPLOY_CONFIG:-$($py -c 'from vllm_omni_kani.deploy import default_deploy_config; print(default_deploy_config())' | tail -1)}
host=${HOST:-127.0.0.1}; port=${PORT:-8091}
cat <<MSG
Serving $ckpt with $deploy on http://$host:$port ; once it is up:
  curl -s http://$host:$port/v1/audio/speech -H 'Content-Type: application/json' \\
       -d '{"input": "Hello from Kani.", "voice": "alloy"}' -o hello.wav
MSG
exec .venv/bin/vllm serve "$ckpt" --omni --deploy-config "$deploy" --host "$host" --port "$port" "$@"
