"""Garbage-collection pauses per generation, as the meters log them (``gc_pauses``)."""

from __future__ import annotations

import gc

from vllm_omni_kani.gc_pauses import GcPauses, describe


def test_collections_are_counted_per_generation_and_a_take_starts_anew():
    pauses = GcPauses()
    pauses.install()
    pauses.install()  # once
    try:
        gc.collect(2)
        gc.collect(2)
        window = pauses.take()
        assert window[2].count == 2  # the two full collections (one hook, not two)
        assert 0 < window[2].max_s <= window[2].total_s
        line = describe(window, 1.0)
        assert "gen2 2x total" in line and line.endswith("of 1.0 s")
        assert pauses.take()[2].count == 0
    finally:
        pauses.uninstall()
    gc.collect(2)
    assert pauses.take()[2].count == 0


def test_a_dropped_meter_unhooks_itself():
    before = len(gc.callbacks)
    pauses = GcPauses()
    pauses.install()
    assert len(gc.callbacks) == before + 1
    del pauses
    gc.collect()  # the hook finds its meter gone and removes itself
    assert len(gc.callbacks) == before
