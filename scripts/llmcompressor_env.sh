#!/usr/bin/env bash
# Create (or reuse) the environment in which `python -m vllm_omni_kani.tools.quantize_w4a16` runs llm-compressor.
# llm-compressor pins a newer compressed-tensors (0.19) than vLLM 0.26 does (0.17), so it gets a venv of its own;
# transformers 5.17 there loads LFM2. Prints the venv's python. ~1 minute from uv's cache; `uv venv` writes a
# .gitignore into the venv, so git leaves it alone.
#   bash scripts/llmcompressor_env.sh                       # creates or reuses .llmc-venv/
#   KANI_LLMC_VENV=/path/to/venv bash scripts/llmcompressor_env.sh
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${KANI_LLMC_VENV:-.llmc-venv}"
# The stamp names what is installed: an environment made before a pin changed is updated on the next call.
packages="llmcompressor==0.14.0.1 compressed-tensors==0.19.0 transformers==5.17.0 torch==2.11.0 safetensors"
stamp="$venv/.llmc-ready"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$packages" ]; then
  command -v uv >/dev/null || export PATH="$HOME/.local/bin:$PATH"
  command -v uv >/dev/null || python3 -m pip install -q --user "uv==0.13.9"
  [ -x "$venv/bin/python" ] || uv venv -q -p 3.11 "$venv" >&2
  # shellcheck disable=SC2086  # one word per requirement
  uv pip install -q -p "$venv/bin/python" $packages >&2
  echo "$packages" >"$stamp"
fi
echo "$(cd "$venv" && pwd)/bin/python"
