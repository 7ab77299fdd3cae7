"""What a listener who starts a stream at its first audio hears: the stalls while the player's buffer is empty.

TTFA says when audio starts, not whether it then plays through. A streamed answer runs dry when a chunk arrives after
the audio before it has played: a small first chunk starts the sound early, and the next chunk, which waits for more
Stage-0 steps and a codec step, can come after it has played out. A player that starts at the first audio byte and
plays everything as soon as it has it stalls, at each arrival, for as long as that arrival came after its buffer ran
out; the request's stall is the sum. The benchmark keeps it per request (``bench_tts``), so a chunk schedule that buys
an earlier first audio shows what it costs in gaps.
"""

from __future__ import annotations

# A gap this short is counted in the stall time but not as a stall of its own (a client event loop's jitter).
STALL_MIN_S = 0.001


class Playback:
    """A stream's player, fed each arrival's time and audio length (seconds, any one clock)."""

    def __init__(self) -> None:
        self.started_at: float | None = None
        self.audio_s = 0.0  # audio received so far
        self.stall_s = 0.0  # time the player stood with an empty buffer
        self.stalls = 0  # gaps of at least STALL_MIN_S
        # Audio received (seconds) when the first such gap began: 0.24 is a first chunk of 3 frames run dry.
        self.first_stall_at_s: float | None = None

    def arrive(self, at: float, audio_s: float) -> None:
        """``audio_s`` more seconds of audio arrived at ``at``."""
        if audio_s <= 0:
            return
        if self.started_at is None:
            self.started_at = at
        else:
            # The buffer runs out when everything so far has played, stalls included.
            runs_out = self.started_at + self.audio_s + self.stall_s
            if at > runs_out:
                gap = at - runs_out
                self.stall_s += gap
                if gap >= STALL_MIN_S:
                    self.stalls += 1
                    if self.first_stall_at_s is None:
                        self.first_stall_at_s = self.audio_s
        self.audio_s += audio_s
