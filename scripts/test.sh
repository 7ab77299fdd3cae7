#!/usr/bin/env bash
# Set up the pinned environment (fast when already done) and run the test suite.
# Extra arguments go to pytest, e.g.  bash scripts/test.sh -k codec
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
exec .venv/bin/python -m pytest -q -rs "$@"
