"""Gradio demo for Kani TTS served by ``vllm serve --omni``: speech plays while it is still being generated.

Why it is built this way:

* **Playback starts with the first chunk.** The browser fetches raw PCM from a same-origin proxy route of this app
  (``/kani/stream/{job}``), which forwards to the server's ``/v1/audio/speech`` with ``stream_format=audio``. A small
  Web Audio player schedules each chunk right behind the previous one, so audio starts after the first codec chunk
  (three frames, ~240 ms of speech) and plays without gaps. The proxy keeps the browser away from the server's origin
  (no CORS, the server need not be reachable from the browser) and keeps a copy of the audio for the download.
* **Gradio does the rest**: the controls, input checks, the voice list from ``GET /v1/audio/voices`` and the final
  result (a WAV file with a download button), which Python writes from the very bytes that were played.
* **Errors say what to do**: an unreachable server, empty text and every 4xx answer of the server (unknown voice,
  ``max_new_tokens`` over the limit, ...) appear in the status box and as a toast, worded by the server where it has
  the words.

Usage (start the server first, see ``run_server.sh``)::

    python gradio_demo.py --api-base http://127.0.0.1:8091 --port 7860
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import html
import json
import logging
import os
import tempfile
import time
import uuid
import wave
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

try:
    import gradio as gr
except ImportError:  # pragma: no cover - a clear message instead of a bare ImportError
    raise SystemExit("gradio is needed for this demo: pip install gradio (the project's dev extra has it)") from None
import httpx
import uvicorn
from fastapi import FastAPI
from fastapi.responses import JSONResponse, StreamingResponse

logger = logging.getLogger("kani_tts_demo")

# The NanoCodec decoder's rate; the demo asks for native-rate audio, so the player never resamples in Python.
SAMPLE_RATE = 22050
# Stage 0 emits 12.5 frames/s; a parallel-head checkpoint spends one token per frame (a flattened one, four).
FRAMES_PER_SECOND = 12.5
# How long the result step waits for the browser to open the stream before it gives up on the job.
STREAM_START_TIMEOUT_S = 30.0
# Jobs (payload and audio copy) left behind by a closed tab are dropped after this long.
JOB_TTL_S = 600.0

EXAMPLE_TEXT = "Hello! This is Kani, speaking through vLLM-Omni. The first words play while the rest is generated."


@dataclass
class Job:
    """One click on "Speak": the request for the server and the audio the browser was sent, for the download."""

    payload: dict[str, Any]
    created: float = field(default_factory=time.monotonic)
    pcm: bytearray = field(default_factory=bytearray)
    error: str | None = None
    stopped: bool = False
    started: asyncio.Event = field(default_factory=asyncio.Event)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    ttfa_s: float | None = None
    elapsed_s: float | None = None


class JobStore:
    """Jobs by id. Everything runs on the server's event loop, so a dict is enough."""

    def __init__(self) -> None:
        self._jobs: dict[str, Job] = {}

    def add(self, payload: dict[str, Any]) -> str:
        self._expire()
        job_id = uuid.uuid4().hex
        self._jobs[job_id] = Job(payload)
        return job_id

    def get(self, job_id: str) -> Job | None:
        return self._jobs.get(job_id)

    def pop(self, job_id: str) -> Job | None:
        return self._jobs.pop(job_id, None)

    def _expire(self) -> None:
        now = time.monotonic()
        for job_id in [k for k, job in self._jobs.items() if now - job.created > JOB_TTL_S]:
            self._jobs.pop(job_id, None)


def error_message(response: httpx.Response, body: bytes) -> str:
    """The server's own words for a failed request (OpenAI error JSON), else the status line."""
    with contextlib.suppress(ValueError, AttributeError, TypeError):
        data = json.loads(body)
        message = data.get("error", {}).get("message") if isinstance(data.get("error"), dict) else data.get("detail")
        if message:
            return f"{message} (HTTP {response.status_code})"
    return f"HTTP {response.status_code}: {body[:300].decode(errors='replace') or response.reason_phrase}"


def unreachable_message(api_base: str, exc: Exception) -> str:
    return (
        f"Cannot reach the Kani TTS server at {api_base} ({type(exc).__name__}: {exc or 'no answer'}). "
        "Is it running? Start it with examples/online_serving/text_to_speech/kani_tts/run_server.sh."
    )


def build_payload(
    text: str,
    voice: str | None,
    temperature: float,
    top_p: float,
    top_k: float | None,
    repetition_penalty: float,
    max_new_tokens: float | None,
    seed: float | None,
) -> dict[str, Any]:
    """The ``/v1/audio/speech`` body for raw native-rate PCM streaming.

    ``top_k`` 0, ``max_new_tokens`` 0 and a negative ``seed`` leave those fields out, so the checkpoint's defaults
    (``config.json`` ``kani_tts.sampling``) apply.
    """
    payload: dict[str, Any] = {
        "input": text,
        "response_format": "pcm",
        "stream": True,
        "stream_format": "audio",
        "temperature": float(temperature),
        "top_p": float(top_p),
        "repetition_penalty": float(repetition_penalty),
    }
    if voice:
        payload["voice"] = voice
    if top_k not in (None, 0):
        payload["top_k"] = int(top_k)
    if max_new_tokens:
        payload["max_new_tokens"] = int(max_new_tokens)
    if seed is not None and seed >= 0:
        payload["seed"] = int(seed)
    return payload


def write_wav(path: Path, pcm: bytes, sample_rate: int = SAMPLE_RATE) -> Path:
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(sample_rate)
        out.writeframes(pcm[: len(pcm) - len(pcm) % 2])
    return path


def status_html(message: str, kind: str = "info") -> str:
    """The status box: plain words, red for errors (the test and a person both read it)."""
    color = {"error": "#c62828", "ok": "#2e7d32", "info": "#455a64"}[kind]
    label = {"error": "Error", "ok": "Done", "info": "Status"}[kind]
    return (
        f'<div class="kani-status kani-status-{kind}" style="color:{color};font-weight:500">'
        f"<b>{label}:</b> {html.escape(message)}</div>"
    )


# Web Audio player, loaded once into the page's <head>. Each PCM chunk becomes an AudioBuffer scheduled right after
# the previous one (gapless while the stream keeps ahead of playback). When the stream ends the same bytes become a
# WAV blob in an <audio> element for replay. window.kaniLast exposes the numbers the test and the metrics box show.
PLAYER_JS = r"""
<script>
(() => {
  let ctx = null, controller = null, sources = [];
  const $ = (id) => document.getElementById(id);
  const show = (msg, color) => {
    const s = $('kani-live-status');
    if (s) { s.textContent = msg; s.style.color = color || ''; }
  };
  const metric = (id, text) => { const e = $(id); if (e) e.textContent = text; };
  function wavBlob(chunks, samples, sr) {
    const header = new DataView(new ArrayBuffer(44));
    const w = (o, s) => { for (let i = 0; i < s.length; i++) header.setUint8(o + i, s.charCodeAt(i)); };
    w(0, 'RIFF'); header.setUint32(4, 36 + samples * 2, true); w(8, 'WAVE'); w(12, 'fmt ');
    header.setUint32(16, 16, true); header.setUint16(20, 1, true); header.setUint16(22, 1, true);
    header.setUint32(24, sr, true); header.setUint32(28, sr * 2, true); header.setUint16(32, 2, true);
    header.setUint16(34, 16, true); w(36, 'data'); header.setUint32(40, samples * 2, true);
    return new Blob([header, ...chunks], { type: 'audio/wav' });
  }
  // Creating an AudioContext can take a second; do it on the click itself (a user gesture, so it may play), while
  // the Speak request makes its round trip, instead of after the stream has started.
  const warm = () => {
    try {
      ctx = ctx || new AudioContext();
      if (ctx.state === 'suspended') ctx.resume();
    } catch (e) { ctx = null; }
  };
  document.addEventListener('pointerdown', (e) => { if (e.target.closest('#kani-speak')) warm(); }, true);
  window.kaniStop = () => {
    if (controller) controller.abort();
    sources.forEach((s) => { try { s.stop(); } catch (e) {} });
    sources = [];
    show('Stopped', '#777');
  };
  window.kaniPlay = async (jobId) => {
    if (!jobId) return jobId;
    window.kaniStop();
    const st = { jobId, t0: performance.now(), ttfaMs: null, doneMs: null, chunks: 0, samples: 0, arrivalsMs: [],
                 error: null };
    window.kaniLast = st;
    ['kani-m-ttfa', 'kani-m-audio', 'kani-m-rtf', 'kani-m-chunks'].forEach((id) => metric(id, '—'));
    const replay = $('kani-live-audio'); if (replay) { replay.removeAttribute('src'); replay.load(); }
    controller = new AbortController();
    show('Connecting…', '#1565c0');
    // The request goes out first; the audio output starts up while the server generates.
    const pending = fetch(new URL('kani/stream/' + jobId, window.location.href), { signal: controller.signal });
    warm();
    const chunks = [];
    let carry = new Uint8Array(0), next = 0, sr = 22050;
    try {
      const resp = await pending;
      if (!resp.ok) {
        let msg = 'HTTP ' + resp.status;
        try { msg = (await resp.json()).error || msg; } catch (e) {}
        throw new Error(msg);
      }
      sr = parseInt(resp.headers.get('X-Sample-Rate') || '22050', 10);
      show('Streaming…', '#1565c0');
      const reader = resp.body.getReader();
      for (;;) {
        const { done, value } = await reader.read();
        if (done) break;
        const bytes = new Uint8Array(carry.length + value.length);
        bytes.set(carry); bytes.set(value, carry.length);
        const usable = bytes.length - (bytes.length % 2);
        carry = bytes.slice(usable);
        if (usable === 0) continue;
        const pcm = new Int16Array(bytes.buffer.slice(0, usable));
        chunks.push(pcm);
        st.chunks += 1; st.samples += pcm.length; st.arrivalsMs.push(performance.now() - st.t0);
        if (st.ttfaMs === null) {
          st.ttfaMs = performance.now() - st.t0;
          metric('kani-m-ttfa', Math.round(st.ttfaMs) + ' ms');
        }
        metric('kani-m-chunks', String(st.chunks));
        metric('kani-m-audio', (st.samples / sr).toFixed(2) + ' s');
        if (ctx) {
          const buf = ctx.createBuffer(1, pcm.length, sr);
          const f32 = buf.getChannelData(0);
          for (let i = 0; i < pcm.length; i++) f32[i] = pcm[i] / 32768;
          const src = ctx.createBufferSource();
          src.buffer = buf; src.connect(ctx.destination);
          const at = Math.max(next, ctx.currentTime + 0.05);
          src.start(at); next = at + buf.duration; sources.push(src);
          show('Playing while generating…', '#2e7d32');
        }
      }
      st.doneMs = performance.now() - st.t0;
      const audioS = st.samples / sr;
      if (audioS > 0) metric('kani-m-rtf', (st.doneMs / 1000 / audioS).toFixed(2));
      if (replay && st.samples > 0) replay.src = URL.createObjectURL(wavBlob(chunks, st.samples, sr));
      show(st.samples > 0 ? 'Generation finished' : 'No audio received', st.samples > 0 ? '#2e7d32' : '#777');
    } catch (e) {
      st.doneMs = performance.now() - st.t0;
      if (e.name !== 'AbortError') { st.error = e.message; show('Error: ' + e.message, '#c62828'); }
    }
    return jobId;
  };
})();
</script>
"""

PLAYER_HTML = """
<div id="kani-player">
  <div style="font-size:0.8em;color:#888">LIVE STREAM</div>
  <div id="kani-live-status" style="font-weight:600">Ready</div>
  <div style="display:grid;grid-template-columns:repeat(4,1fr);gap:8px;margin:8px 0;text-align:center">
    <div><div style="font-size:0.75em;color:#888">FIRST AUDIO</div><div id="kani-m-ttfa">—</div></div>
    <div><div style="font-size:0.75em;color:#888">AUDIO</div><div id="kani-m-audio">—</div></div>
    <div><div style="font-size:0.75em;color:#888">RTF</div><div id="kani-m-rtf">—</div></div>
    <div><div style="font-size:0.75em;color:#888">CHUNKS</div><div id="kani-m-chunks">—</div></div>
  </div>
  <audio id="kani-live-audio" controls style="width:100%"></audio>
</div>
"""


class KaniDemo:
    """The demo's server side: talks to the TTS server, holds jobs, builds the Gradio page."""

    def __init__(self, api_base: str, request_timeout_s: float = 300.0) -> None:
        self.api_base = api_base.rstrip("/")
        self.jobs = JobStore()
        self.timeout = httpx.Timeout(request_timeout_s, connect=5.0)
        self.out_dir = Path(tempfile.mkdtemp(prefix="kani-tts-demo-"))

    # -- talking to the server ---------------------------------------------------------------------------------
    async def voices(self) -> list[str]:
        async with httpx.AsyncClient(timeout=httpx.Timeout(10.0, connect=3.0)) as client:
            response = await client.get(f"{self.api_base}/v1/audio/voices")
            if response.status_code != 200:
                raise RuntimeError(error_message(response, response.content))
            return list(response.json().get("voices") or [])

    async def load_voices(self) -> tuple[Any, str]:
        """Fill the voice dropdown from the server (on page load and on "Refresh")."""
        try:
            voices = await self.voices()
        except (httpx.HTTPError, RuntimeError) as exc:
            message = unreachable_message(self.api_base, exc) if isinstance(exc, httpx.HTTPError) else str(exc)
            return gr.update(choices=["default"], value="default"), status_html(message, "error")
        choices = voices or ["default"]
        return gr.update(choices=choices, value=choices[0]), status_html(
            f"Connected to {self.api_base}: {len(voices)} voices", "info"
        )

    async def stream(self, job_id: str) -> Any:
        """``GET /kani/stream/{job}``: the server's PCM, passed through as it arrives and copied into the job."""
        job = self.jobs.get(job_id)
        if job is None or job.started.is_set():
            return JSONResponse({"error": "Unknown or already played request; click Speak again."}, status_code=404)
        job.started.set()
        start = time.monotonic()
        client = httpx.AsyncClient(timeout=self.timeout)
        try:
            request = client.build_request("POST", f"{self.api_base}/v1/audio/speech", json=job.payload)
            response = await client.send(request, stream=True)
        except httpx.HTTPError as exc:
            await client.aclose()
            return self._fail(job, unreachable_message(self.api_base, exc), 502)
        if response.status_code != 200:
            body = await response.aread()
            await response.aclose()
            await client.aclose()
            return self._fail(job, error_message(response, body), response.status_code)

        async def relay() -> AsyncIterator[bytes]:
            try:
                async for chunk in response.aiter_raw():
                    if job.ttfa_s is None:
                        job.ttfa_s = time.monotonic() - start
                    job.pcm.extend(chunk)
                    yield chunk
            except httpx.HTTPError as exc:
                job.error = f"The stream broke off: {type(exc).__name__}: {exc}"
            except asyncio.CancelledError:
                job.stopped = True  # the browser went away (Stop): closing the upstream aborts generation
                raise
            finally:
                job.elapsed_s = time.monotonic() - start
                await response.aclose()
                await client.aclose()
                job.done.set()

        return StreamingResponse(
            relay(), media_type="audio/pcm", headers={"X-Sample-Rate": str(SAMPLE_RATE), "Cache-Control": "no-store"}
        )

    @staticmethod
    def _fail(job: Job, message: str, status: int) -> JSONResponse:
        job.error = message
        job.done.set()
        return JSONResponse({"error": message}, status_code=status)

    # -- Gradio callbacks ----------------------------------------------------------------------------------------
    async def start(
        self,
        text: str,
        voice: str | None,
        temperature: float,
        top_p: float,
        top_k: float | None,
        repetition_penalty: float,
        max_new_tokens: float | None,
        seed: float | None,
    ) -> tuple[str, str, Any, Any]:
        """Check the input and the server, then queue the job the browser will stream; errors go to the status."""
        clear = (gr.update(value=None), gr.update(value=None, visible=False))
        if not text or not text.strip():
            gr.Warning("Type some text to speak first.")
            return "", status_html("Type some text to speak first.", "error"), *clear
        try:
            async with httpx.AsyncClient(timeout=httpx.Timeout(5.0, connect=3.0)) as client:
                (await client.get(f"{self.api_base}/health")).raise_for_status()
        except httpx.HTTPError as exc:
            message = unreachable_message(self.api_base, exc)
            gr.Warning(message)
            return "", status_html(message, "error"), *clear
        payload = build_payload(
            text.strip(), voice, temperature, top_p, top_k, repetition_penalty, max_new_tokens, seed
        )
        job_id = self.jobs.add(payload)
        return job_id, status_html("Generating… audio plays as soon as the first chunk arrives.", "info"), *clear

    async def finish(self, job_id: str) -> tuple[Any, Any, str]:
        """After the stream: the WAV of exactly what was played, with a download button, or the error."""
        job = self.jobs.get(job_id) if job_id else None
        if job is None:
            return gr.skip(), gr.skip(), gr.skip()
        try:
            await asyncio.wait_for(job.started.wait(), STREAM_START_TIMEOUT_S)
            await job.done.wait()
        except TimeoutError:
            job.error = job.error or "The browser never opened the audio stream (is JavaScript enabled?)."
        finally:
            self.jobs.pop(job_id)
        if job.error:
            gr.Warning(job.error)
            return gr.update(value=None), gr.update(visible=False), status_html(job.error, "error")
        if not job.pcm:
            message = "Stopped before any audio." if job.stopped else "The server sent no audio."
            return gr.update(value=None), gr.update(visible=False), status_html(message, "error")
        path = write_wav(self.out_dir / f"kani-tts-{job_id[:8]}.wav", bytes(job.pcm))
        seconds = len(job.pcm) / 2 / SAMPLE_RATE
        summary = f"{seconds:.2f} s of audio"
        if job.ttfa_s is not None and job.elapsed_s:
            summary += f", first audio after {job.ttfa_s * 1000:.0f} ms, RTF {job.elapsed_s / seconds:.2f}"
        if job.stopped:
            summary += " (stopped early)"
        return (
            gr.update(value=str(path)),
            gr.update(value=str(path), visible=True),
            status_html(summary, "ok"),
        )

    # -- the page ------------------------------------------------------------------------------------------------
    def blocks(self) -> gr.Blocks:
        with gr.Blocks(title="Kani TTS — vLLM-Omni streaming demo") as demo:
            gr.Markdown(
                "## Kani TTS on vLLM-Omni\n"
                f"Stage 0 (LFM2, audio frames) → async_chunk → Stage 1 (NanoCodec, {SAMPLE_RATE:,} Hz), served at "
                f"`{self.api_base}`. Audio starts playing after the first chunk, before generation ends."
            )
            with gr.Row():
                with gr.Column(scale=3):
                    text = gr.Textbox(label="Text", value=EXAMPLE_TEXT, lines=4, elem_id="kani-text")
                    with gr.Row():
                        voice = gr.Dropdown(
                            label="Voice", choices=["default"], value="default", elem_id="kani-voice", scale=4
                        )
                        refresh = gr.Button("↻ Voices", scale=1, size="sm")
                    with gr.Accordion("Sampling", open=True):
                        with gr.Row():
                            temperature = gr.Slider(
                                0.0, 1.5, value=0.6, step=0.05, label="Temperature", elem_id="kani-temperature"
                            )
                            top_p = gr.Slider(0.05, 1.0, value=0.95, step=0.05, label="Top-p")
                        with gr.Row():
                            top_k = gr.Number(value=-1, precision=0, label="Top-k (-1 = off)")
                            repetition_penalty = gr.Slider(1.0, 2.0, value=1.1, step=0.05, label="Repetition penalty")
                        with gr.Row():
                            max_new_tokens = gr.Number(
                                value=0,
                                precision=0,
                                minimum=0,
                                label="Max new tokens (0 = model default)",
                                info=f"parallel-head: 1 token = 1 frame = {1000 / FRAMES_PER_SECOND:.0f} ms",
                                elem_id="kani-max-new-tokens",
                            )
                            seed = gr.Number(value=-1, precision=0, minimum=-1, label="Seed (-1 = random)")
                    with gr.Row():
                        speak = gr.Button("Speak", variant="primary", elem_id="kani-speak")
                        stop = gr.Button("Stop", variant="stop")
                with gr.Column(scale=2):
                    gr.HTML(PLAYER_HTML, label="Live")
                    result = gr.Audio(label="Result", type="filepath", interactive=False, elem_id="kani-result")
                    download = gr.DownloadButton("Download WAV", visible=False, elem_id="kani-download")
                    status = gr.HTML(status_html("Loading voices…"), elem_id="kani-status")
            job_id = gr.Textbox(visible=False)

            inputs = [text, voice, temperature, top_p, top_k, repetition_penalty, max_new_tokens, seed]
            demo.load(self.load_voices, outputs=[voice, status])
            refresh.click(self.load_voices, outputs=[voice, status])
            speak.click(self.start, inputs, [job_id, status, result, download]).then(
                None, [job_id], [job_id], js="(id) => window.kaniPlay(id)"
            ).then(self.finish, [job_id], [result, download, status])
            stop.click(None, js="() => window.kaniStop()")
        return demo

    def app(self) -> FastAPI:
        """FastAPI app: the stream proxy route plus the Gradio page at ``/``."""
        app = FastAPI(title="Kani TTS demo")
        app.add_api_route("/kani/stream/{job_id}", self.stream, methods=["GET"])
        return gr.mount_gradio_app(app, self.blocks(), path="/", head=PLAYER_JS, allowed_paths=[str(self.out_dir)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--api-base",
        default=os.environ.get("KANI_API_BASE", "http://127.0.0.1:8091"),
        help="the vllm serve --omni server (default: $KANI_API_BASE or http://127.0.0.1:8091)",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to serve the demo on (0.0.0.0 to share it)")
    parser.add_argument("--port", type=int, default=7860)
    parser.add_argument("--request-timeout", type=float, default=300.0, help="seconds to wait for the server")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    demo = KaniDemo(args.api_base, args.request_timeout)
    print(f"Kani TTS demo on http://{args.host}:{args.port} (server: {demo.api_base})", flush=True)
    uvicorn.run(demo.app(), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
