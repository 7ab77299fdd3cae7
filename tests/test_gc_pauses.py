"""Garbage-collection pauses per generation, as the meters log them (``gc_pauses``)."""

from __future__ import annotations

import asyncio
import gc
import sys

from vllm_omni_kani.gc_pauses import Census, GcPauses, as_row, census, describe, freeze_heap


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


def test_a_frozen_heap_is_left_out_of_later_full_collections():
    """``freeze_heap`` (the bench client's, before every level): what lived before is no longer walked by a full
    collection, what is allocated after still is, and the rows say per generation what the level's pauses were."""
    held = [[i] for i in range(1000)]  # tracked containers
    try:
        freeze_heap()
        assert gc.get_freeze_count() >= len(held)
        later = [[i] for i in range(10)]
        gc.collect(2)
        walked = {id(o) for o in gc.get_objects(generation=2)}
        assert not any(id(o) in walked for o in held)
        assert all(id(o) in walked for o in later)
    finally:
        gc.unfreeze()
    assert any(id(o) in {id(x) for x in gc.get_objects(generation=2)} for o in held)

    pauses = GcPauses()
    pauses.install()
    try:
        gc.collect(2)
    finally:
        pauses.uninstall()
    row = as_row(pauses.take())
    assert len(row) == 3 and row[2]["count"] == 1
    assert 0 < row[2]["max_ms"] <= row[2]["total_ms"]


class _Kept:
    """A type only this test makes: its count in the census is exactly what the test keeps alive."""


def test_the_census_counts_what_a_full_collection_would_walk():
    gc.collect()
    kept = [_Kept() for _ in range(500)]
    gc.collect()  # survivors move to the oldest generation
    gc.disable()  # no collection between the calls below may move objects into the oldest generation
    # Nor may another thread of this process (a served test's log reader) free one of its objects between them: the
    # interpreter does not hand it the GIL before the switch interval, here longer than the calls take.
    interval = sys.getswitchinterval()
    sys.setswitchinterval(60.0)
    try:
        count, commonest, _ = census(top=1000)
        walked = len(gc.get_objects(2))
        top3 = census(top=3).commonest
    finally:
        sys.setswitchinterval(interval)
        gc.enable()
    by_name = dict(commonest)
    assert by_name[f"{__name__}._Kept"] == len(kept)
    assert count >= len(kept) and count == walked
    assert top3 == commonest[:3]
    try:
        freeze_heap()
        assert f"{__name__}._Kept" not in dict(census(top=1000).commonest)  # a frozen heap is not walked
    finally:
        gc.unfreeze()


async def _parked(event: asyncio.Event) -> None:
    await event.wait()


def _numbers():
    yield 1


def test_the_census_names_the_suspended_frames_by_their_code():
    """Coroutines and generators kept alive are counted by their code's qualified name and file, so a census under
    load says whose state the in-flight requests keep, not only "coroutine"."""

    async def park_all() -> Census:
        event = asyncio.Event()
        tasks = [asyncio.create_task(_parked(event)) for _ in range(30)]
        await asyncio.sleep(0)  # each coroutine now waits in _parked
        gens = [_numbers() for _ in range(20)]
        gc.collect()  # the survivors move to the oldest generation
        gc.disable()
        try:
            found = census(top=1000)
        finally:
            gc.enable()
        event.set()
        await asyncio.gather(*tasks)
        del gens
        return found

    found = asyncio.run(park_all())
    frames = dict(found.suspended)
    assert frames["_parked (test_gc_pauses.py)"] == 30
    assert frames["_numbers (test_gc_pauses.py)"] == 20
    assert dict(found.commonest).get("coroutine", 0) >= 30
