"""Stage 0's step meter (``KANI_STEP_STATS_S``) and the GIL switch interval (``KANI_GIL_SWITCH_INTERVAL_MS``):
what they compute and how they read the environment. Both are checked in a real server in
``test_serving.test_flattened_checkpoint_serves_speech_four_tokens_per_frame``."""

from __future__ import annotations

import pytest

from tests.conftest import run_python
from vllm_omni_kani.model_executor.models.kani_tts.step_meter import StepMeter


def test_a_window_reports_the_step_period_rows_and_mean_batch():
    meter = StepMeter(interval_s=1.0)
    assert meter.tick(256, now=10.0) is None  # opens the window
    lines = [meter.tick(rows, now=10.0 + 0.025 * (i + 1)) for i, rows in enumerate([256] * 39 + [128])]
    assert lines[:-1] == [None] * 39
    # 40 periods of 25 ms in 1.0 s; rows of the 40 steps after the opening one.
    assert lines[-1] == (
        "kani stage0 steps: 40.0 steps/s, 25.00 ms per step, 10112 rows/s, mean batch 252.8 over 1.0 s"
    )


def test_a_pause_longer_than_the_interval_drops_the_open_window():
    meter = StepMeter(interval_s=1.0)
    meter.tick(8, now=0.0)
    meter.tick(8, now=0.5)
    # Idle for 5 s: the window restarts at the next step, so the idle time is not reported as one long step.
    assert meter.tick(8, now=5.5) is None
    line = meter.tick(4, now=6.5)
    assert line.startswith("kani stage0 steps: 1.0 steps/s, 1000.00 ms per step, 4 rows/s, mean batch 4.0")


def test_off_by_default(monkeypatch):
    monkeypatch.delenv("KANI_STEP_STATS_S", raising=False)
    meter = StepMeter()
    assert not meter.enabled
    assert all(meter.tick(1, now=float(t)) is None for t in range(100))


@pytest.mark.parametrize("value", ["abc", "1x"])
def test_a_bad_step_stats_value_names_the_variable(monkeypatch, value):
    monkeypatch.setenv("KANI_STEP_STATS_S", value)
    with pytest.raises(ValueError, match="KANI_STEP_STATS_S"):
        StepMeter()


def test_the_switch_interval_is_set_by_register_in_each_process():
    out = run_python(
        "import sys, vllm_omni_kani; vllm_omni_kani.register(); print(sys.getswitchinterval())",
        env={"KANI_GIL_SWITCH_INTERVAL_MS": "0.5"},
    )
    assert float(out.stdout.split()[-1]) == pytest.approx(0.0005)
    default = run_python("import sys, vllm_omni_kani; vllm_omni_kani.register(); print(sys.getswitchinterval())")
    assert float(default.stdout.split()[-1]) == pytest.approx(0.005)  # CPython's own, left alone when unset


@pytest.mark.parametrize("value", ["0", "-1", "fast"])
def test_a_bad_switch_interval_fails_the_process_start_with_the_variable_named(value):
    from vllm_omni_kani.gil_switch import apply_switch_interval

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KANI_GIL_SWITCH_INTERVAL_MS", value)
        with pytest.raises(ValueError, match="KANI_GIL_SWITCH_INTERVAL_MS"):
            apply_switch_interval()
