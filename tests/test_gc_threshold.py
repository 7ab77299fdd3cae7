"""``KANI_MAIN_GC_THRESHOLD``: parsed strictly, applied in the main process only (a served check is in
``test_serving.py``'s flattened server)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from vllm_omni_kani.envs import KANI_MAIN_GC_THRESHOLD, main_gc_threshold


@pytest.mark.parametrize(
    ("raw", "expected"),
    [("", None), ("  ", None), ("20000", (20000,)), ("20000, 5,5", (20000, 5, 5)), ("700,10", (700, 10))],
)
def test_the_variable_reads_gc_set_thresholds_arguments(monkeypatch, raw, expected):
    monkeypatch.setenv(KANI_MAIN_GC_THRESHOLD, raw)
    assert main_gc_threshold() == expected


@pytest.mark.parametrize("raw", ["0", "-700", "0,10,10", "20000,-1", "1,2,3,4", "many", "20000,,10", "2e4"])
def test_a_bad_value_is_refused_with_the_variables_name(monkeypatch, raw):
    monkeypatch.setenv(KANI_MAIN_GC_THRESHOLD, raw)
    with pytest.raises(ValueError, match=KANI_MAIN_GC_THRESHOLD):
        main_gc_threshold()


# Run in a fresh interpreter so this test process's own collector is left alone: the main process takes the
# thresholds, a child that multiprocessing spawns (as vLLM starts engine cores) keeps CPython's.
SCRIPT = """
import gc, json, multiprocessing, sys
from vllm_omni_kani.gc_threshold import apply_gc_threshold

def child(queue):
    queue.put([apply_gc_threshold(), gc.get_threshold()])

if __name__ == "__main__":
    default = gc.get_threshold()
    applied = apply_gc_threshold()
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=child, args=(queue,))
    proc.start()
    in_child = queue.get(timeout=120)
    proc.join(timeout=120)
    print(json.dumps({"default": default, "applied": applied, "now": gc.get_threshold(), "child": in_child}))
"""


def test_the_main_process_takes_the_thresholds_and_a_spawned_child_does_not(tmp_path):
    script = tmp_path / "apply.py"
    script.write_text(SCRIPT)
    env = {**os.environ, KANI_MAIN_GC_THRESHOLD: "20000,7"}
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    default = seen["default"]
    # The fields left out keep their value; the spawned child keeps the interpreter's defaults and reports nothing.
    assert seen["applied"] == seen["now"] == [20000, 7, default[2]]
    assert seen["child"] == [None, default]
