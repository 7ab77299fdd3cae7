#!/usr/bin/env bash
# Create (or reuse) the environment that runs the official Kani-TTS model code, the reference the v2 tests compare
# with. The official packages pin transformers 4.56 (this project runs 5.x) and import NeMo at package import, so they
# get their own venv, and only their model.py files are used (loaded by path; NeMo is never installed). Prints the
# venv's python. ~1 minute from uv's cache.
# torchaudio is the official speaker embedder's resampler.
#   bash scripts/kani_reference_env.sh                       # creates or reuses .kani-ref-venv/
#   KANI_REF_VENV=/path/to/venv bash scripts/kani_reference_env.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/side_venv.sh

official_models() {
  # --no-deps: their requirements pull NeMo (and its pins); the model files need torch and transformers only.
  # Both ship a top-level `kani_tts` package: v2 goes into the venv, v1 into a folder of its own.
  uv pip install -q -p "$1/bin/python" --no-deps "kani-tts-2==0.0.5" >&2
  uv pip install -q -p "$1/bin/python" --no-deps --target "$1/kani-tts-v1" "kani-tts==1.0.1" >&2
}

side_venv "${KANI_REF_VENV:-.kani-ref-venv}" .kani-ref-ready \
  "torch==2.11.0 torchaudio==2.11.0 transformers==4.56.0 safetensors numpy<2.3" official_models
