"""Kani TTS through the official ``openai`` client: the same calls that work against OpenAI's speech API.

Three ways to get speech into a file:

* non-streaming (default): the whole file in the chosen ``--format`` (wav, pcm, flac, mp3, opus);
* ``--stream``: raw ``wav``/``pcm`` bytes written as they are generated (``stream_format="audio"``);
* ``--stream --stream-format sse``: OpenAI ``speech.audio.delta`` events (base64 PCM) decoded into the file.

Kani's own knobs (sampling, ``seed``, ``max_new_tokens``, ``sample_rate``) go in ``extra_body``; OpenAI voice names
(alloy, nova, ...) are accepted and use the checkpoint's default speaker, ``--list-voices`` shows its own speakers.

Usage::

    python speech_client.py --text "Hello from Kani." --voice katie --output hello.wav
    python speech_client.py --text "Hello from Kani." --format mp3 --output hello.mp3
    python speech_client.py --text "Hello from Kani." --stream --output hello.wav
    python speech_client.py --list-voices
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
import time
from typing import Any

from openai import APIConnectionError, APIStatusError, OpenAI

NATIVE_SAMPLE_RATE = 22050
WAV_HEADER_BYTES = 44


def kani_options(args: argparse.Namespace) -> dict[str, Any]:
    """Fields the OpenAI SDK has no parameter for; sent as-is in the JSON body."""
    names = ("temperature", "top_p", "top_k", "repetition_penalty", "seed", "max_new_tokens", "sample_rate")
    return {name: getattr(args, name) for name in names if getattr(args, name) is not None}


def model_name(client: OpenAI, requested: str | None) -> str:
    """The served model: ``--model`` or the server's first (a Kani server serves one)."""
    return requested or client.models.list().data[0].id


def list_voices(client: OpenAI) -> list[str]:
    # Not part of the SDK's typed surface; its generic GET keeps the same base URL, key and retries.
    return list(client.get("/audio/voices", cast_to=object).get("voices", []))


def fix_streamed_wav_header(path: str) -> None:
    """A streamed WAV header cannot know its sizes (the server writes 0xFFFFFFFF); write the real ones."""
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        header = f.read(WAV_HEADER_BYTES)
        if header[:4] != b"RIFF" or header[36:40] != b"data":
            return
        f.seek(4)
        f.write((size - 8).to_bytes(4, "little"))
        f.seek(40)
        f.write((size - WAV_HEADER_BYTES).to_bytes(4, "little"))


def speak(client: OpenAI, args: argparse.Namespace) -> int:
    """Write the speech for ``args.text`` to ``args.output``; returns the bytes written."""
    request = {
        "model": model_name(client, args.model),
        "input": args.text,
        "voice": args.voice,
        "response_format": args.format,
        "extra_body": kani_options(args),
    }
    start = time.perf_counter()
    first: float | None = None
    written = 0
    if not args.stream:
        response = client.audio.speech.create(**request)
        response.write_to_file(args.output)
        written = os.path.getsize(args.output)
    elif args.stream_format == "audio":
        with (
            client.audio.speech.with_streaming_response.create(**request, stream_format="audio") as response,
            open(args.output, "wb") as out,
        ):
            for chunk in response.iter_bytes():
                first = first if first is not None else time.perf_counter() - start
                written += out.write(chunk)
        if args.format == "wav":
            fix_streamed_wav_header(args.output)
    else:  # SSE: one JSON event per chunk, audio base64-encoded; response_format must be pcm (or wav)
        with (
            client.audio.speech.with_streaming_response.create(**request, stream_format="sse") as response,
            open(args.output, "wb") as out,
        ):
            for line in response.iter_lines():
                if not line.startswith("data:"):
                    continue
                event = json.loads(line[len("data:") :])
                if event.get("type") == "speech.audio.delta":
                    first = first if first is not None else time.perf_counter() - start
                    written += out.write(base64.b64decode(event["audio"]))
                elif event.get("type") == "speech.audio.error":
                    raise RuntimeError(f"server error mid-stream: {event.get('error')}")
    elapsed = time.perf_counter() - start
    if first is not None:
        print(f"TTFA: {first:.3f} s")
    print(f"Saved {args.output} ({written} bytes, {args.format}) in {elapsed:.2f} s")
    return written


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Kani TTS with the openai client.")
    parser.add_argument("--api-base", default=os.environ.get("KANI_API_BASE", "http://127.0.0.1:8091"))
    parser.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY", "EMPTY"), help="the server's --api-key")
    parser.add_argument("--model", default=None, help="served model name (default: the server's only model)")
    parser.add_argument("--text", default="Hello! This is Kani text to speech, served by vLLM-Omni.")
    parser.add_argument("--voice", default="default", help="a name from --list-voices, or an OpenAI voice name")
    parser.add_argument("--format", default="wav", choices=["wav", "pcm", "flac", "mp3", "opus"])
    parser.add_argument("--output", "-o", default=None, help="default: kani_speech.<format>")
    parser.add_argument("--stream", action="store_true", help="write audio while it is generated (wav or pcm)")
    parser.add_argument("--stream-format", default="audio", choices=["audio", "sse"])
    parser.add_argument("--list-voices", action="store_true", help="print the server's voices and exit")
    sampling = parser.add_argument_group("Kani options (server defaults come from the checkpoint)")
    sampling.add_argument("--temperature", type=float)
    sampling.add_argument("--top-p", type=float)
    sampling.add_argument("--top-k", type=int)
    sampling.add_argument("--repetition-penalty", type=float)
    sampling.add_argument("--seed", type=int)
    sampling.add_argument("--max-new-tokens", type=int, help="cap on generated tokens (1 per frame, 12.5 frames/s)")
    sampling.add_argument("--sample-rate", type=int, help="output rate (default 22050; opus defaults to 24000)")
    args = parser.parse_args(argv)
    if args.stream and args.format not in ("wav", "pcm"):
        parser.error("--stream needs --format wav or pcm (compressed formats are encoded once, at the end)")
    args.output = args.output or f"kani_speech.{args.format}"
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    client = OpenAI(base_url=f"{args.api_base.rstrip('/')}/v1", api_key=args.api_key, max_retries=2)
    try:
        if args.list_voices:
            print("\n".join(list_voices(client)))
            return
        speak(client, args)
    except APIConnectionError as exc:
        sys.exit(f"cannot reach {args.api_base}: {exc}. Is the server running (run_server.sh)?")
    except APIStatusError as exc:
        message = exc.body.get("message", exc.body) if isinstance(exc.body, dict) else exc.message
        sys.exit(f"server answered {exc.status_code}: {message}")


if __name__ == "__main__":
    main()
