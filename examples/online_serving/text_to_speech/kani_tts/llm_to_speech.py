"""Voice-agent pattern: speak text while it is still being written, sentence by sentence.

A chat model streams its answer a few characters at a time; waiting for the whole answer before speaking adds its
full generation time to the agent's response time. This script instead:

1. reads a streamed text source: an OpenAI-compatible chat stream (``--chat-base-url``) or a file read slowly
   (``--text-file``, ``--chars-per-second``), which stands in for one;
2. cuts it into sentences as soon as each one is complete (``SentenceSplitter``);
3. sends every sentence to Kani TTS as a streaming request the moment it is complete, up to ``--max-in-flight``
   at once, so sentence N+1 is synthesized while sentence N is still playing (overlap);
4. plays / writes the audio strictly in sentence order, each sentence's chunks as they arrive.

So audio starts right after the first sentence, not after the last. Each request has a connect timeout, a read timeout
(longest silence between chunks) and an overall timeout, and is retried with exponential backoff and jitter on
connection errors, timeouts and 429/5xx answers, but only before its first audio byte: a retry after that would
repeat audio. A 4xx answer is not retried (the same request would fail again), and a sentence that fails for good is
reported and skipped so the agent keeps talking.

Usage::

    python llm_to_speech.py --text-file answer.txt --chars-per-second 40 --output answer.wav
    python llm_to_speech.py --chat-base-url http://127.0.0.1:8000/v1 --chat-model Qwen/Qwen3-0.6B \\
        --prompt "Explain streaming speech in three sentences." --play
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import random
import re
import sys
import time
import wave
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx

logger = logging.getLogger("llm_to_speech")

NATIVE_SAMPLE_RATE = 22050
BYTES_PER_SAMPLE = 2
T = TypeVar("T")

# A sentence ends at terminal punctuation (optionally closed by quotes/brackets) followed by whitespace; CJK
# terminators need no space. The whitespace must have arrived, so "3.14" or "e.g.x" never cut mid-stream.
_SENTENCE_END = re.compile(r"[.!?…][\"'”’)\]]*\s+|[。！？]")
_CLAUSE_END = re.compile(r"[,;:—]\s+")


def server_message(body: bytes) -> str:
    """The message of the server's OpenAI-style error JSON, else the body as text."""
    text = body.decode(errors="replace")
    try:
        return str(json.loads(text)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return text


# -- text sources ----------------------------------------------------------------------------------------------------
async def file_source(path: str, chars_per_second: float) -> AsyncIterator[str]:
    """The file's text, word by word, at about ``chars_per_second`` (``-`` reads stdin); stands in for an LLM."""
    text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    for piece in re.findall(r"\S+\s*|\s+", text):
        if chars_per_second > 0:
            await asyncio.sleep(len(piece) / chars_per_second)
        yield piece


async def chat_source(base_url: str, model: str, prompt: str, api_key: str, system: str | None) -> AsyncIterator[str]:
    """The content deltas of an OpenAI-compatible ``/chat/completions`` stream."""
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=3, timeout=60.0)
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
    stream = await client.chat.completions.create(model=model, messages=messages, stream=True)
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            yield chunk.choices[0].delta.content
    await client.close()


# -- sentences -------------------------------------------------------------------------------------------------------
class SentenceSplitter:
    """Incremental sentence segmentation of streamed text.

    A sentence shorter than ``min_chars`` waits for the next one (a lone "Sure." makes a choppy first request); text
    longer than ``max_chars`` without an end is cut at a clause or a space, so a run-on answer still starts early.
    """

    def __init__(self, min_chars: int = 12, max_chars: int = 300) -> None:
        self.min_chars, self.max_chars = min_chars, max_chars
        self._buffer = ""

    def feed(self, text: str) -> list[str]:
        """Add streamed text; return the sentences it completed."""
        self._buffer += text
        out: list[str] = []
        start = 0
        for match in _SENTENCE_END.finditer(self._buffer):
            candidate = self._buffer[start : match.end()]
            if len(candidate.strip()) >= self.min_chars:
                out.append(" ".join(candidate.split()))
                start = match.end()
        self._buffer = self._buffer[start:]
        while len(self._buffer) > self.max_chars:
            cut = self._cut_point(self._buffer[: self.max_chars])
            out.append(" ".join(self._buffer[:cut].split()))
            self._buffer = self._buffer[cut:]
        return [s for s in out if s]

    def flush(self) -> list[str]:
        """The rest, once the source has ended."""
        rest, self._buffer = " ".join(self._buffer.split()), ""
        return [rest] if rest else []

    @staticmethod
    def _cut_point(text: str) -> int:
        clauses = list(_CLAUSE_END.finditer(text))
        if clauses:
            return clauses[-1].end()
        space = text.rfind(" ")
        return space + 1 if space > 0 else len(text)


# -- retries ---------------------------------------------------------------------------------------------------------
class RetryableError(RuntimeError):
    """A failure worth another try (connection, timeout, 429, 5xx)."""


class RequestError(RuntimeError):
    """A failure another try would repeat (4xx), or one after audio was already delivered."""


def backoff_delay(attempt: int, base: float, cap: float, rng: random.Random | None = None) -> float:
    """Exponential backoff with "equal jitter": between half and all of ``min(cap, base * 2**attempt)``."""
    ceiling = min(cap, base * (2**attempt))
    return ceiling / 2 + (rng or random).random() * ceiling / 2


async def with_retries(
    call: Callable[[int], Awaitable[T]],
    *,
    retries: int,
    base_delay: float,
    max_delay: float,
    what: str = "request",
    sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
) -> T:
    """``await call(attempt)`` until it succeeds, retrying :class:`RetryableError` up to ``retries`` times."""
    for attempt in range(retries + 1):
        try:
            return await call(attempt)
        except RetryableError as exc:
            if attempt == retries:
                raise RequestError(f"{what} failed after {retries + 1} attempts: {exc}") from exc
            delay = backoff_delay(attempt, base_delay, max_delay)
            logger.warning("%s: %s; retrying in %.2f s (attempt %d of %d)", what, exc, delay, attempt + 2, retries + 1)
            await sleep(delay)
    raise AssertionError("unreachable")


# -- speech ----------------------------------------------------------------------------------------------------------
@dataclass
class Sentence:
    index: int
    text: str
    text_ready_s: float  # when the sentence was complete, from the start of the run
    first_audio_s: float | None = None  # when its first audio byte arrived
    audio_bytes: int = 0
    attempts: int = 0
    error: str | None = None
    audio: asyncio.Queue[bytes | None] = field(default_factory=asyncio.Queue, repr=False)

    @property
    def audio_s(self) -> float:
        return self.audio_bytes / BYTES_PER_SAMPLE / NATIVE_SAMPLE_RATE


class Speaker:
    """Streams each sentence from Kani TTS into that sentence's queue; retries as described above."""

    def __init__(self, args: argparse.Namespace, client: httpx.AsyncClient, start: float) -> None:
        self.args, self.client, self.start = args, client, start
        self.url = f"{args.api_base}/v1/audio/speech"

    def payload(self, text: str) -> dict[str, Any]:
        body: dict[str, Any] = {
            "input": text,
            "voice": self.args.voice,
            "response_format": "pcm",
            "stream": True,
            "stream_format": "audio",
        }
        for name in ("temperature", "top_p", "top_k", "repetition_penalty", "seed", "max_new_tokens"):
            if getattr(self.args, name) is not None:
                body[name] = getattr(self.args, name)
        return body

    async def _attempt(self, sentence: Sentence, attempt: int) -> None:
        sentence.attempts = attempt + 1
        try:
            async with (
                asyncio.timeout(self.args.sentence_timeout),
                self.client.stream("POST", self.url, json=self.payload(sentence.text)) as response,
            ):
                if response.status_code != 200:
                    body = server_message(await response.aread())
                    message = f"HTTP {response.status_code}: {body}"
                    if response.status_code == 429 or response.status_code >= 500:
                        raise RetryableError(message)
                    raise RequestError(message)
                async for chunk in response.aiter_raw():
                    if sentence.first_audio_s is None:
                        sentence.first_audio_s = time.monotonic() - self.start
                    sentence.audio_bytes += len(chunk)
                    await sentence.audio.put(chunk)
        except (httpx.TransportError, TimeoutError) as exc:
            message = f"{type(exc).__name__}: {exc}".rstrip(": ")
            if sentence.audio_bytes:
                raise RequestError(f"stream broke off after {sentence.audio_s:.2f} s of audio ({message})") from exc
            raise RetryableError(message) from exc

    async def speak(self, sentence: Sentence, slots: asyncio.Semaphore) -> None:
        """Fill ``sentence.audio`` (then ``None``); a final failure is recorded, never raised."""
        try:
            async with slots:
                await with_retries(
                    lambda attempt: self._attempt(sentence, attempt),
                    retries=self.args.retries,
                    base_delay=self.args.backoff,
                    max_delay=self.args.max_backoff,
                    what=f"sentence {sentence.index}",
                )
        except RequestError as exc:
            sentence.error = str(exc)
            logger.error("sentence %d not spoken: %s", sentence.index, exc)
        finally:
            await sentence.audio.put(None)


class AudioOut:
    """The spoken audio in order: a WAV file and/or a local player fed through stdin."""

    def __init__(self, path: str | None, play: bool) -> None:
        self.wav: wave.Wave_write | None = None
        if path:
            self.wav = wave.open(path, "wb")  # noqa: SIM115 - closed in close()
            self.wav.setnchannels(1)
            self.wav.setsampwidth(BYTES_PER_SAMPLE)
            self.wav.setframerate(NATIVE_SAMPLE_RATE)
        self.player = _start_player() if play else None
        self._odd = b""

    def write(self, chunk: bytes) -> None:
        data = self._odd + chunk
        cut = len(data) - len(data) % BYTES_PER_SAMPLE
        data, self._odd = data[:cut], data[cut:]
        if self.wav is not None:
            self.wav.writeframes(data)
        if self.player is not None and self.player.stdin is not None:
            self.player.stdin.write(data)  # blocks at real time once the pipe is full: runs in a thread
            self.player.stdin.flush()

    def close(self) -> None:
        if self.wav is not None:
            self.wav.close()
        if self.player is not None and self.player.stdin is not None:
            self.player.stdin.close()
            self.player.wait()


def _start_player() -> Any:
    import shutil
    import subprocess

    rate = str(NATIVE_SAMPLE_RATE)
    for command in (
        ["ffplay", "-nodisp", "-autoexit", "-loglevel", "quiet", "-f", "s16le", "-ar", rate, "-ch_layout", "mono", "-"],
        ["aplay", "-q", "-f", "S16_LE", "-c", "1", "-r", rate],
        ["play", "-q", "-t", "raw", "-r", rate, "-e", "signed", "-b", "16", "-c", "1", "-"],
    ):
        if shutil.which(command[0]):
            return subprocess.Popen(command, stdin=subprocess.PIPE)
    logger.warning("--play: no ffplay, aplay or play found; writing the file only")
    return None


@dataclass
class Summary:
    sentences: list[dict[str, Any]]
    source_done_s: float
    first_audio_s: float | None
    total_s: float
    audio_s: float
    output: str | None


async def speak_text_stream(source: AsyncIterator[str], args: argparse.Namespace) -> Summary:
    """Speak ``source`` sentence by sentence (see the module docstring); returns what happened when."""
    start = time.monotonic()
    splitter = SentenceSplitter(args.min_sentence_chars, args.max_sentence_chars)
    ready: asyncio.Queue[Sentence | None] = asyncio.Queue()
    spoken: list[Sentence] = []
    source_done = 0.0
    slots = asyncio.Semaphore(args.max_in_flight)
    timeout = httpx.Timeout(connect=args.connect_timeout, read=args.read_timeout, write=10.0, pool=None)
    out = AudioOut(args.output, args.play)

    async def read_source() -> None:
        nonlocal source_done
        count = 0

        async def emit(texts: list[str]) -> None:
            nonlocal count
            for text in texts:
                count += 1
                await ready.put(Sentence(count, text, time.monotonic() - start))

        try:
            async for piece in source:
                await emit(splitter.feed(piece))
            await emit(splitter.flush())
        finally:
            source_done = time.monotonic() - start
            await ready.put(None)

    async with httpx.AsyncClient(timeout=timeout) as client, asyncio.TaskGroup() as tasks:
        speaker = Speaker(args, client, start)
        tasks.create_task(read_source())
        order: asyncio.Queue[Sentence | None] = asyncio.Queue()

        async def dispatch() -> None:
            # Start synthesis the moment a sentence is complete; the semaphore bounds the overlap.
            while (sentence := await ready.get()) is not None:
                spoken.append(sentence)
                logger.info("sentence %d ready at %.2f s: %s", sentence.index, sentence.text_ready_s, sentence.text)
                tasks.create_task(speaker.speak(sentence, slots))
                await order.put(sentence)
            await order.put(None)

        tasks.create_task(dispatch())
        # Play in order: all of sentence N's chunks (as they arrive), then sentence N+1's (often already there).
        while (sentence := await order.get()) is not None:
            while (chunk := await sentence.audio.get()) is not None:
                await asyncio.to_thread(out.write, chunk)
            status = f"error: {sentence.error}" if sentence.error else f"{sentence.audio_s:.2f} s of audio"
            first = "-" if sentence.first_audio_s is None else f"{sentence.first_audio_s:.2f} s"
            print(
                f"[{sentence.index}] text ready {sentence.text_ready_s:.2f} s, first audio {first}, "
                f"{status}, {sentence.attempts} attempt(s): {sentence.text!r}",
                flush=True,
            )
    out.close()
    firsts = [s.first_audio_s for s in spoken if s.first_audio_s is not None]
    return Summary(
        sentences=[
            {
                "index": s.index,
                "text": s.text,
                "text_ready_s": s.text_ready_s,
                "first_audio_s": s.first_audio_s,
                "audio_s": s.audio_s,
                "attempts": s.attempts,
                "error": s.error,
            }
            for s in spoken
        ],
        source_done_s=source_done,
        first_audio_s=min(firsts) if firsts else None,
        total_s=time.monotonic() - start,
        audio_s=sum(s.audio_s for s in spoken),
        output=args.output,
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Speak a streamed text source sentence by sentence with Kani TTS.")
    parser.add_argument("--api-base", default=os.environ.get("KANI_API_BASE", "http://127.0.0.1:8091"))
    src = parser.add_argument_group("text source (one of)")
    src.add_argument("--text-file", help="a text file read slowly, like an LLM writing it ('-' = stdin)")
    src.add_argument("--chars-per-second", type=float, default=60.0, help="reading speed of --text-file")
    src.add_argument("--chat-base-url", help="an OpenAI-compatible server, e.g. http://127.0.0.1:8000/v1")
    src.add_argument("--chat-model", help="its model name")
    src.add_argument("--chat-api-key", default=os.environ.get("OPENAI_API_KEY", "EMPTY"))
    src.add_argument("--prompt", default="In three short sentences, say why streaming speech feels fast.")
    src.add_argument("--system", default="Answer in plain spoken sentences, no lists or markdown.")
    tts = parser.add_argument_group("speech")
    tts.add_argument("--voice", default="default")
    tts.add_argument("--output", "-o", default="llm_to_speech.wav", help="WAV of everything spoken ('' = none)")
    tts.add_argument("--play", action="store_true", help="play as it arrives (ffplay, aplay or sox's play)")
    tts.add_argument("--max-in-flight", type=int, default=2, help="sentences synthesized at once (overlap)")
    tts.add_argument("--min-sentence-chars", type=int, default=12)
    tts.add_argument("--max-sentence-chars", type=int, default=300)
    for name, kind in (("temperature", float), ("top-p", float), ("top-k", int), ("repetition-penalty", float)):
        tts.add_argument(f"--{name}", type=kind)
    tts.add_argument("--seed", type=int)
    tts.add_argument("--max-new-tokens", type=int, help="cap per sentence (1 token per 80 ms frame)")
    rel = parser.add_argument_group("timeouts and retries")
    rel.add_argument("--connect-timeout", type=float, default=5.0)
    rel.add_argument("--read-timeout", type=float, default=60.0, help="longest wait for the next chunk")
    rel.add_argument("--sentence-timeout", type=float, default=300.0, help="longest time for one attempt")
    rel.add_argument("--retries", type=int, default=3)
    rel.add_argument("--backoff", type=float, default=0.5, help="first retry delay in seconds, doubled each time")
    rel.add_argument("--max-backoff", type=float, default=8.0)
    parser.add_argument("--summary-json", help="also write the timings as JSON here")
    args = parser.parse_args(argv)
    if bool(args.text_file) == bool(args.chat_base_url):
        parser.error("give exactly one text source: --text-file or --chat-base-url")
    if args.chat_base_url and not args.chat_model:
        parser.error("--chat-base-url needs --chat-model")
    args.api_base = args.api_base.rstrip("/")
    args.output = args.output or None
    return args


async def amain(args: argparse.Namespace) -> Summary:
    if args.text_file:
        source = file_source(args.text_file, args.chars_per_second)
    else:
        source = chat_source(args.chat_base_url, args.chat_model, args.prompt, args.chat_api_key, args.system)
    return await speak_text_stream(source, args)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request drowns the sentence log
    summary = asyncio.run(amain(args))
    spoken = [s for s in summary.sentences if not s["error"]]
    if summary.first_audio_s is not None:
        print(
            f"Time to first audio: {summary.first_audio_s:.2f} s (text source finished at "
            f"{summary.source_done_s:.2f} s, all audio at {summary.total_s:.2f} s)"
        )
    print(f"Spoke {len(spoken)} of {len(summary.sentences)} sentences, {summary.audio_s:.2f} s of audio", end="")
    print(f" -> {summary.output}" if summary.output else "")
    if args.summary_json:
        Path(args.summary_json).write_text(json.dumps(asdict(summary), indent=2))
    if summary.sentences and not spoken:
        sys.exit("no sentence could be spoken")


if __name__ == "__main__":
    main()
