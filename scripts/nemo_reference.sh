#!/usr/bin/env bash
# Regenerate tests/data/nanocodec/ (NeMo's own decode of factory codecs; the parity tests compare with it).
# NeMo never enters .venv — its pins fight vLLM's — so it gets its own venv, made on first use (~3 min,
# ~6 GB). `uv venv` writes a .gitignore into the venv, so git leaves it alone.
#   bash scripts/nemo_reference.sh                 # creates or reuses .nemo-venv/
#   NEMO_VENV=/path/to/venv bash scripts/nemo_reference.sh
set -euo pipefail
cd "$(dirname "$0")/.."
NEMO_VENV="${NEMO_VENV:-.nemo-venv}"
if [ ! -x "$NEMO_VENV/bin/python" ]; then
  command -v uv >/dev/null || python3 -m pip install --quiet uv
  uv venv -p 3.11 "$NEMO_VENV"
  uv pip install -p "$NEMO_VENV/bin/python" "torch==2.11.0" "nemo_toolkit[tts]==3.0.0"
fi
exec .venv/bin/python scripts/nemo_reference.py --nemo-python "$NEMO_VENV/bin/python" "$@"
