"""Stream raw PCM from Kani TTS and use every chunk the moment it arrives; report TTFA and RTF.

The server's async_chunk pipeline sends the first codec chunk (three frames, ~240 ms of speech) while Stage 0 is still
generating, so the time to first audio (TTFA) is far below the time of the whole utterance. This client shows that with
plain ``httpx`` (no SDK): it writes each chunk to the output file as it comes (a ``.wav`` gets a proper header, a
``.pcm`` stays raw 16-bit mono), optionally pipes it into a local player, and prints one line per chunk and a summary:

    TTFA: 0.214 s
    RTF: 0.41 (2.10 s of audio in 0.86 s)

Usage::

    python streaming_speech_client.py --text "Hello from Kani." --output hello.wav
    python streaming_speech_client.py --text "Hello from Kani." --play     # ffplay, aplay or sox's play
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
import wave
from typing import IO, Any

import httpx

# The NanoCodec decoder's rate: what the server sends unless the request asks for another ``sample_rate``.
NATIVE_SAMPLE_RATE = 22050
BYTES_PER_SAMPLE = 2  # 16-bit signed little-endian mono


def server_message(body: bytes) -> str:
    """The message of the server's OpenAI-style error JSON, else the body as text."""
    text = body.decode(errors="replace")
    try:
        return str(json.loads(text)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return text


def build_payload(args: argparse.Namespace) -> dict[str, Any]:
    """``/v1/audio/speech`` body: raw PCM bytes as they are generated (``stream_format=audio``)."""
    payload: dict[str, Any] = {
        "input": args.text,
        "voice": args.voice,
        "response_format": "pcm",
        "stream": True,
        "stream_format": "audio",
    }
    if args.model:
        payload["model"] = args.model
    for name in ("temperature", "top_p", "top_k", "repetition_penalty", "seed", "max_new_tokens", "sample_rate"):
        value = getattr(args, name)
        if value is not None:
            payload[name] = value
    return payload


def start_player(sample_rate: int) -> subprocess.Popen[bytes] | None:
    """A local player reading raw PCM on stdin, if one is installed (ffplay, aplay, sox's play)."""
    rate = str(sample_rate)
    commands = [
        ["ffplay", "-nodisp", "-autoexit", "-loglevel", "quiet", "-f", "s16le", "-ar", rate, "-ch_layout", "mono", "-"],
        ["aplay", "-q", "-f", "S16_LE", "-c", "1", "-r", rate],
        ["play", "-q", "-t", "raw", "-r", rate, "-e", "signed", "-b", "16", "-c", "1", "-"],
    ]
    for command in commands:
        if shutil.which(command[0]):
            return subprocess.Popen(command, stdin=subprocess.PIPE)
    print("--play: no ffplay, aplay or play found; writing the file only", file=sys.stderr)
    return None


class PcmSink:
    """Where chunks go as they arrive: a WAV or raw file (flushed per chunk) and an optional player."""

    def __init__(self, path: str | None, sample_rate: int, player: subprocess.Popen[bytes] | None) -> None:
        self.player = player
        self.raw: IO[bytes] | None = None
        self.wav: wave.Wave_write | None = None
        if path and path.endswith(".wav"):
            # wave writes the header now and fixes its sizes on close, so the file grows chunk by chunk.
            self.wav = wave.open(path, "wb")  # noqa: SIM115 - closed in close()
            self.wav.setnchannels(1)
            self.wav.setsampwidth(BYTES_PER_SAMPLE)
            self.wav.setframerate(sample_rate)
        elif path:
            self.raw = open(path, "wb")  # noqa: SIM115 - closed in close()
        self._odd = b""

    def write(self, chunk: bytes) -> None:
        data = self._odd + chunk  # a network chunk may split a sample
        cut = len(data) - len(data) % BYTES_PER_SAMPLE
        data, self._odd = data[:cut], data[cut:]
        if self.wav is not None:
            self.wav.writeframes(data)
        if self.raw is not None:
            self.raw.write(data)
            self.raw.flush()
        if self.player is not None and self.player.stdin is not None:
            try:
                self.player.stdin.write(data)
                self.player.stdin.flush()
            except BrokenPipeError:
                self.player = None  # the player was closed; keep writing the file

    def close(self) -> None:
        if self.wav is not None:
            self.wav.close()
        if self.raw is not None:
            self.raw.close()
        if self.player is not None and self.player.stdin is not None:
            self.player.stdin.close()
            self.player.wait()


def stream_speech(args: argparse.Namespace) -> dict[str, float]:
    """Run one streaming request; returns the measured numbers (seconds)."""
    sample_rate = args.sample_rate or NATIVE_SAMPLE_RATE
    sink = PcmSink(args.output, sample_rate, start_player(sample_rate) if args.play else None)
    received = 0
    ttfa: float | None = None
    timeout = httpx.Timeout(args.timeout, connect=5.0)
    start = time.perf_counter()
    try:
        with (
            httpx.Client(timeout=timeout) as client,
            client.stream("POST", f"{args.api_base}/v1/audio/speech", json=build_payload(args)) as response,
        ):
            if response.status_code != 200:
                body = server_message(response.read())
                raise SystemExit(f"server answered {response.status_code}: {body}")
            for chunk in response.iter_raw():
                now = time.perf_counter() - start
                if ttfa is None:
                    ttfa = now
                    print(f"TTFA: {ttfa:.3f} s", flush=True)
                received += len(chunk)
                sink.write(chunk)
                if args.verbose:
                    print(f"  {now:7.3f} s  +{len(chunk) / BYTES_PER_SAMPLE / sample_rate:.3f} s of audio", flush=True)
    except httpx.ConnectError as exc:
        raise SystemExit(f"cannot reach {args.api_base}: {exc}. Is the server running (run_server.sh)?") from exc
    finally:
        sink.close()
    elapsed = time.perf_counter() - start
    audio_s = received / BYTES_PER_SAMPLE / sample_rate
    if ttfa is None or audio_s == 0:
        raise SystemExit("the server sent no audio")
    rtf = elapsed / audio_s
    print(f"RTF: {rtf:.2f} ({audio_s:.2f} s of audio in {elapsed:.2f} s)")
    if args.output:
        print(f"Saved {args.output} ({sample_rate} Hz, 16-bit mono)")
    return {"ttfa_s": ttfa, "elapsed_s": elapsed, "audio_s": audio_s, "rtf": rtf}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Stream Kani TTS audio as raw PCM; print TTFA and RTF.")
    parser.add_argument("--api-base", default=os.environ.get("KANI_API_BASE", "http://127.0.0.1:8091"))
    parser.add_argument("--model", default=None, help="served model name (default: the server's only model)")
    parser.add_argument("--text", default="Hello! This sentence is streamed to you while it is being generated.")
    parser.add_argument("--voice", default="default", help="a name from GET /v1/audio/voices, or an OpenAI voice")
    parser.add_argument("--output", "-o", default="kani_stream.wav", help=".wav (with header) or raw .pcm; '' = none")
    parser.add_argument("--play", action="store_true", help="also play the chunks as they arrive")
    parser.add_argument("--verbose", "-v", action="store_true", help="print one line per chunk")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds to wait between bytes")
    sampling = parser.add_argument_group("sampling (server defaults come from the checkpoint)")
    sampling.add_argument("--temperature", type=float)
    sampling.add_argument("--top-p", type=float)
    sampling.add_argument("--top-k", type=int)
    sampling.add_argument("--repetition-penalty", type=float)
    sampling.add_argument("--seed", type=int)
    sampling.add_argument("--max-new-tokens", type=int, help="cap on generated tokens (1 per frame, 12.5 frames/s)")
    sampling.add_argument("--sample-rate", type=int, help="resample on the server (default: 22050, native)")
    args = parser.parse_args(argv)
    args.api_base = args.api_base.rstrip("/")
    return args


def main(argv: list[str] | None = None) -> None:
    stream_speech(parse_args(argv))


if __name__ == "__main__":
    main()
