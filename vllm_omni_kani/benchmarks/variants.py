"""Derive a deploy-YAML variant for a before/after measurement: one knob changed, everything else as shipped.

    python -m vllm_omni_kani.benchmarks.variants stage_configs/kani_tts.yaml OUT.yaml \\
        stages.0.async_scheduling=false connectors.shm.extra.codec_chunk_frames=32

Keys are dotted paths (list items by index); values are YAML (``false``, ``8``, ``[]``, ``fp8``). A comment at
the top of the written file names the base and the changes, so a result can always be traced to its config.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml


def set_path(config: Any, dotted: str, value: Any) -> None:
    """Set ``config[a][b]…`` for ``a.b…``; integer parts index lists, missing mapping keys are created."""
    *parents, last = dotted.split(".")
    node = config
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node.setdefault(part, {})
    if isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value


def derive(base: Path, out: Path, changes: list[str]) -> Path:
    config = yaml.safe_load(Path(base).read_text())
    for change in changes:
        key, _, raw = change.partition("=")
        set_path(config, key, yaml.safe_load(raw))
    header = f"# Variant of {base}: {', '.join(changes) or 'unchanged'}\n"
    Path(out).write_text(header + yaml.safe_dump(config, sort_keys=False))
    return Path(out)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    print(derive(Path(args[0]), Path(args[1]), args[2:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
