#!/usr/bin/env bash
# Re-resolve the pinned environments after changing requirements/*.in or pyproject.toml dependencies.
set -euo pipefail
cd "$(dirname "$0")/.."
plat=(--python-platform x86_64-manylinux_2_28)
uv pip compile -q requirements/cpu.in pyproject.toml --extra dev --override requirements/overrides-cpu.txt \
  --python-version 3.11 "${plat[@]}" -o requirements/cpu-py311.lock
uv pip compile -q requirements/gpu.in pyproject.toml --extra dev --python-version 3.12 "${plat[@]}" \
  -o requirements/gpu-py312.lock
echo "locks updated: requirements/cpu-py311.lock requirements/gpu-py312.lock"
