"""Stage 0's step meter (``KANI_STEP_STATS_S``), its A/B windows (``KANI_SAMPLER_AB_PERIOD_S``) and their summary
(``benchmarks/ab_windows.py``), and the GIL switch interval (``KANI_GIL_SWITCH_INTERVAL_MS``): what they compute and
how they read the environment. The meter and the interval are checked in a real server in
``test_serving.test_flattened_checkpoint_serves_speech_four_tokens_per_frame``."""

from __future__ import annotations

import pytest

from benchmarks import ab_windows
from tests.conftest import run_python
from vllm_omni_kani import sampler_ab
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


_MAIN_AND_CHILD = """
import multiprocessing, sys, vllm_omni_kani

def child(queue):
    vllm_omni_kani.register()
    queue.put(sys.getswitchinterval())

if __name__ == "__main__":
    vllm_omni_kani.register()
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=child, args=(queue,))
    proc.start()
    print(sys.getswitchinterval(), queue.get(timeout=120))
    proc.join()
"""


def test_the_main_process_interval_applies_to_the_main_process_alone(tmp_path):
    script = tmp_path / "main_and_child.py"
    script.write_text(_MAIN_AND_CHILD)
    both = run_python(
        f"import runpy; runpy.run_path({str(script)!r}, run_name='__main__')",
        env={"KANI_MAIN_GIL_SWITCH_INTERVAL_MS": "1", "KANI_GIL_SWITCH_INTERVAL_MS": "20"},
    )
    main, child = map(float, both.stdout.split()[-2:])
    assert main == pytest.approx(0.001)  # the API server's process
    assert child == pytest.approx(0.020)  # an engine core: every process's variable
    alone = run_python(
        f"import runpy; runpy.run_path({str(script)!r}, run_name='__main__')",
        env={"KANI_MAIN_GIL_SWITCH_INTERVAL_MS": "2"},
    )
    main, child = map(float, alone.stdout.split()[-2:])
    assert (main, child) == (pytest.approx(0.002), pytest.approx(0.005))  # the child keeps CPython's own


@pytest.mark.parametrize("name", ["KANI_GIL_SWITCH_INTERVAL_MS", "KANI_MAIN_GIL_SWITCH_INTERVAL_MS"])
@pytest.mark.parametrize("value", ["0", "-1", "fast"])
def test_a_bad_switch_interval_fails_the_process_start_with_the_variable_named(name, value):
    from vllm_omni_kani.gil_switch import apply_switch_interval

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(name, value)
        with pytest.raises(ValueError, match=name):
            apply_switch_interval()


def ab_lines(period: float, step_ms: list[float], steps_per_window: int, windows: int) -> list[str]:
    """The meter's lines for ``windows`` A/B windows of ``period`` s, window i stepping every ``step_ms[i % 2]``."""
    meter = StepMeter(interval_s=0.0, ab_period_s=period)
    lines = []
    for w in range(windows):
        start = 100 * period + w * period  # window 100 + w; even windows are the patched side
        for k in range(steps_per_window):
            line = meter.tick(64, now=start + 1e-3 + k * step_ms[w % 2] / 1e3)
            lines += [line] if line else []
    return lines


def test_ab_windows_close_at_each_boundary_and_name_their_side():
    lines = ab_lines(period=1.0, step_ms=[20.0, 25.0], steps_per_window=40, windows=4)
    # Three closed windows (the last is still open); 39 periods each, the crossing step left out.
    assert len(lines) == 3
    assert lines[0].endswith("20.00 ms per step, 3200 rows/s, mean batch 64.0 over 0.8 s (sampler patches on)")
    assert lines[1].endswith("25.00 ms per step, 2560 rows/s, mean batch 64.0 over 1.0 s (sampler patches off)")
    assert lines[2].endswith("(sampler patches on)")


def test_the_ab_summary_pairs_neighbouring_windows():
    text = "\n".join(ab_lines(period=1.0, step_ms=[20.0, 25.0], steps_per_window=40, windows=9))
    rows = ab_windows.windows(text)
    assert [patched for _, _, patched in rows] == [True, False] * 4
    summary = ab_windows.summarise(rows, min_share=0.9)
    assert summary["pairs"] == 7 and summary["pairs_patched_faster"] == 7
    assert summary["ratio_median"] == pytest.approx(0.8)
    assert summary["ms_on_median"] == pytest.approx(20.0) and summary["ms_off_median"] == pytest.approx(25.0)


def test_the_patched_side_alternates_and_is_always_taken_without_a_period(monkeypatch):
    monkeypatch.setattr(sampler_ab, "_period", 2.0)
    monkeypatch.setattr(sampler_ab, "_alternating", None)
    monkeypatch.delenv("KANI_SAMPLER_AB_PATCHES", raising=False)
    for name in ("penalty_counts", "codebook1_noise", "top_k_open_columns"):
        assert [sampler_ab.patched_now(name, now=t) for t in (0.5, 2.5, 4.5, 6.5)] == [True, False, True, False]
    monkeypatch.setattr(sampler_ab, "_period", 0.0)
    assert all(sampler_ab.patched_now("penalty_counts", now=t) for t in (0.5, 2.5))


def test_only_the_named_patches_alternate(monkeypatch):
    """``KANI_SAMPLER_AB_PATCHES``: one patch A/B'd on top of the others, which take their path in every window."""
    monkeypatch.setattr(sampler_ab, "_period", 2.0)
    monkeypatch.setattr(sampler_ab, "_alternating", None)
    monkeypatch.setenv("KANI_SAMPLER_AB_PATCHES", "codebook1_noise")
    assert [sampler_ab.patched_now("codebook1_noise", now=t) for t in (0.5, 2.5, 4.5)] == [True, False, True]
    assert all(sampler_ab.patched_now("penalty_counts", now=t) for t in (0.5, 2.5, 4.5))
    monkeypatch.setattr(sampler_ab, "_alternating", None)
    monkeypatch.setenv("KANI_SAMPLER_AB_PATCHES", "codebook1,penalty_counts")
    with pytest.raises(ValueError, match=r"KANI_SAMPLER_AB_PATCHES=.*unknown codebook1; expected .*codebook1_noise"):
        sampler_ab.patched_now("penalty_counts", now=0.5)


@pytest.mark.parametrize(
    ("value", "names"),
    [
        ("", {"penalty_counts", "codebook1_noise", "top_k_open_columns", "code_race_kernel"}),
        ("1", {"penalty_counts", "codebook1_noise", "top_k_open_columns", "code_race_kernel"}),
        ("0", set()),
        ("off", set()),
        ("penalty_counts", {"penalty_counts"}),
        ("codebook1_noise, penalty_counts", {"penalty_counts", "codebook1_noise"}),
        ("penalty_counts,code_race_kernel", {"penalty_counts", "code_race_kernel"}),
    ],
)
def test_the_sampler_patches_are_chosen_by_name(monkeypatch, value, names):
    from vllm_omni_kani.envs import stage0_sampler_patches

    monkeypatch.setenv("KANI_STAGE0_SAMPLER_PATCHES", value)
    assert stage0_sampler_patches() == names


def test_an_unknown_sampler_patch_is_named_with_the_valid_ones(monkeypatch):
    from vllm_omni_kani.envs import stage0_sampler_patches

    monkeypatch.setenv("KANI_STAGE0_SAMPLER_PATCHES", "penalty_counts,penalties")
    expected = r"unknown penalties; expected 1 \(the defaults\), 0 \(none\) .* penalty_counts"
    with pytest.raises(ValueError, match=expected):
        stage0_sampler_patches()
