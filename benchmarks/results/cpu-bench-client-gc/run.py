"""`benchmarks/gpu/serve_sweeps.py` (of the current directory's tree) with every collection of the client process
timed: ``pauses.json`` gets (perf_counter at its start, generation, ms) per collection.

    python run.py PAUSES_JSON SERVE_SWEEPS_ARGS...
"""

import gc
import json
import os
import runpy
import sys
import time
from pathlib import Path

pauses: list[tuple[float, int, float]] = []
started: list[float | None] = [None]


def hook(phase: str, info: dict[str, int]) -> None:
    if phase == "start":
        started[0] = time.perf_counter()
    elif started[0] is not None:
        pauses.append((started[0], info["generation"], 1e3 * (time.perf_counter() - started[0])))


gc.callbacks.append(hook)
out = Path(sys.argv[1])
sys.argv = ["serve_sweeps.py", *sys.argv[2:]]
try:
    runpy.run_path(os.path.join(os.getcwd(), "benchmarks/gpu/serve_sweeps.py"), run_name="__main__")
finally:
    out.write_text(json.dumps(pauses))
