#!/usr/bin/env bash
# Create (or reuse) the environment that runs the official Kani-TTS model code, the reference the v2 tests compare
# with. The official packages pin transformers 4.56 (this project runs 5.x) and import NeMo at package import, so they
# get their own venv, and only their model.py files are used (loaded by path; NeMo is never installed). Prints the
# venv's python. ~1 minute from uv's cache; `uv venv` writes a .gitignore into the venv, so git leaves it alone.
# torchaudio is the official speaker embedder's resampler.
#   bash scripts/kani_reference_env.sh                       # creates or reuses .kani-ref-venv/
#   KANI_REF_VENV=/path/to/venv bash scripts/kani_reference_env.sh
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${KANI_REF_VENV:-.kani-ref-venv}"
# The stamp names what is installed: an environment made before a package was added gets it on the next call.
packages="torch==2.11.0 torchaudio==2.11.0 transformers==4.56.0 safetensors numpy<2.3"
stamp="$venv/.kani-ref-ready"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$packages" ]; then
  command -v uv >/dev/null || export PATH="$HOME/.local/bin:$PATH"
  command -v uv >/dev/null || python3 -m pip install -q --user "uv==0.13.9"
  [ -x "$venv/bin/python" ] || uv venv -q -p 3.11 "$venv" >&2
  # shellcheck disable=SC2086  # one word per requirement
  uv pip install -q -p "$venv/bin/python" $packages >&2
  # --no-deps: their requirements pull NeMo (and its pins); the model files need torch and transformers only.
  # Both ship a top-level `kani_tts` package: v2 goes into the venv, v1 into a folder of its own.
  uv pip install -q -p "$venv/bin/python" --no-deps "kani-tts-2==0.0.5" >&2
  uv pip install -q -p "$venv/bin/python" --no-deps --target "$venv/kani-tts-v1" "kani-tts==1.0.1" >&2
  echo "$packages" >"$stamp"
fi
echo "$(cd "$venv" && pwd)/bin/python"
