"""The benchmark's player: a stream that keeps ahead plays through; a late chunk stalls it for exactly its lateness."""

from __future__ import annotations

import pytest

from vllm_omni_kani.benchmarks.playback import STALL_MIN_S, Playback


def play(arrivals: list[tuple[float, float]]) -> Playback:
    player = Playback()
    for at, audio_s in arrivals:
        player.arrive(at, audio_s)
    return player


def test_a_stream_that_keeps_ahead_never_stalls():
    # 240 ms first, the next 1.28 s of audio 200 ms later, the rest long before the buffer runs out.
    player = play([(10.0, 0.24), (10.2, 1.28), (10.5, 2.56), (11.0, 1.04)])
    assert (player.stall_s, player.stalls, player.first_stall_at_s) == (0.0, 0, None)
    assert player.audio_s == pytest.approx(5.12)
    assert player.started_at == 10.0


def test_a_chunk_after_the_buffer_ran_out_stalls_for_its_lateness():
    # 80 ms of audio, then the next chunk 300 ms in: 220 ms of silence; the third is in time (due at 0.3 + 1.28).
    player = play([(0.0, 0.08), (0.3, 1.28), (1.5, 1.0)])
    assert player.stall_s == pytest.approx(0.22)
    assert player.stalls == 1
    assert player.first_stall_at_s == pytest.approx(0.08)  # the first chunk ran dry
    # The stall pushes the rest of the playback back: everything so far (2.36 s) plays out at 0.22 + 2.36 = 2.58.
    player.arrive(2.68, 0.5)
    assert player.stall_s == pytest.approx(0.22 + 0.1)
    assert player.stalls == 2


def test_a_chunk_split_over_reads_is_one_arrival_and_gaps_under_the_floor_are_timed_not_counted():
    # One server chunk read in three pieces, the first 50 ms late: one stall.
    player = play([(0.0, 0.08), (0.13, 0.4), (0.1300001, 0.4), (0.1300002, 0.48)])
    assert player.stall_s == pytest.approx(0.05)
    assert player.stalls == 1
    jitter = play([(0.0, 0.08), (0.08 + STALL_MIN_S / 2, 0.08)])
    assert jitter.stall_s == pytest.approx(STALL_MIN_S / 2)
    assert (jitter.stalls, jitter.first_stall_at_s) == (0, None)


def test_empty_reads_neither_start_nor_stall_the_player():
    player = play([(0.0, 0.0), (1.0, 0.08), (1.05, 0.0), (1.08, 0.08)])
    assert player.started_at == 1.0
    assert (player.stall_s, player.stalls) == (0.0, 0)
