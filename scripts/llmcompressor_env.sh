#!/usr/bin/env bash
# Create (or reuse) the environment in which `python -m vllm_omni_kani.tools.quantize_w4a16` runs llm-compressor.
# llm-compressor pins a newer compressed-tensors (0.19) than vLLM 0.26 does (0.17), so it gets a venv of its own;
# transformers 5.17 there loads LFM2. Prints the venv's python. ~1 minute from uv's cache.
#   bash scripts/llmcompressor_env.sh                       # creates or reuses .llmc-venv/
#   KANI_LLMC_VENV=/path/to/venv bash scripts/llmcompressor_env.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/side_venv.sh
side_venv "${KANI_LLMC_VENV:-.llmc-venv}" .llmc-ready \
  "llmcompressor==0.14.0.1 compressed-tensors==0.19.0 transformers==5.17.0 torch==2.11.0 safetensors"
