"""``vllm-omni-kani bench``: load a running server through the OpenAI speech API with streaming clients.

Every request asks ``/v1/audio/speech`` for raw PCM16 (``stream_format=audio``, ``response_format=pcm``) and
records when its first audio byte arrives (TTFA) and when its last one does. A *level* keeps ``concurrency``
requests in flight until ``requests`` have finished; per level it reports TTFA p50/p90/p95, per-request RTF
(generation time / audio seconds) p50/p95, the aggregate real-time factor (audio seconds per wall second),
frames/s, errors, and how a player started at each request's first byte would have stalled (``playback.py``: the
share of requests that ran dry, stall p50/p95/max). Results go to ``DIR/<label>.json`` and are rendered with every
other result in DIR into ``DIR/report.md`` and ``DIR/report.png`` (``report.py``).

With ``--trace`` each request is sent with its own ``X-Request-Id`` and ``X-Kani-Trace: 1``, and the level's row
keeps, per request, its id and the client's ``time.perf_counter()`` at sending, first byte and end, and its stalls
(``trace``): ``benchmarks/ttfa_breakdown.py`` places them among the server's ``[KaniTTFA]`` points.

With ``--stagger-s S`` stream ``k`` of ``N`` sends its first request ``k·S/N`` seconds into the level, so that
requests arrive one by one instead of in waves (S near one request's duration spreads them evenly); each stream then
sends 4 requests by default, and the row adds ``ttfa_ms_p50_later`` / ``ttfa_ms_p95_later`` over every request but
each stream's first, which arrived while the level was still filling.

With random-weight checkpoints the audio length is set by ``max_new_tokens`` (frames × tokens per frame),
so every level moves the same audio per request and levels compare like with like.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from vllm_omni_kani.benchmarks import report
from vllm_omni_kani.benchmarks.playback import Playback
from vllm_omni_kani.entrypoints.openai.cancellation import REQUEST_ID_HEADER
from vllm_omni_kani.entrypoints.openai.speech_guard import TRACE_HEADER
from vllm_omni_kani.gc_pauses import GcPauses, as_row, freeze_heap
from vllm_omni_kani.model_executor.models.kani_tts.configuration import FRAME_RATE, SAMPLE_RATE

PCM_BYTES_PER_SAMPLE = 2  # response_format=pcm is 16-bit mono
SAMPLES_PER_FRAME = round(SAMPLE_RATE / FRAME_RATE)
DEFAULT_CONCURRENCY = (1, 10, 50, 100, 256)
# 64 frames = 5.1 s of audio at 12.5 frames/s: the "at least 5 s" per request.
DEFAULT_MAX_NEW_FRAMES = 64

# Fixed prompt set (100-300 characters each); request i speaks PROMPTS[i % len(PROMPTS)].
PROMPTS: tuple[str, ...] = (
    "The quick brown fox jumps over the lazy dog, then stops to look back and wonders why it ever bothered "
    "to jump at all.",
    "Our train to the coast leaves at half past seven tomorrow morning, so please pack tonight and leave "
    "your umbrella by the door.",
    "Scientists have found that short walks after meals can lower blood sugar, and the effect shows up within "
    "about fifteen minutes of moving.",
    "Welcome back! Your order has shipped and should arrive on Thursday. You can follow the package from the "
    "link in your confirmation email.",
    "In the winter of that year the river froze so hard that the whole village walked across it to the "
    "market, carrying bread, cheese and candles.",
    "To reset your password, open the settings page, choose security, and follow the steps. The code we send "
    "you expires after ten minutes.",
    "She tuned the old piano for an hour before the concert, and when the first chord rang out, the hall fell "
    "completely silent.",
    "Traffic on the northern bridge is moving slowly because of roadworks; drivers heading downtown should take "
    "the river road instead this evening.",
    "Every great library smells a little of dust and glue and coffee, and every reader who stays long enough "
    "learns to love that smell.",
    "The forecast says light rain in the morning, clearing by noon, with a gentle breeze from the west and "
    "temperatures near eighteen degrees.",
    "Thank you for calling. All of our agents are helping other customers right now; please stay on the line "
    "and we will answer as soon as we can.",
    "He planted tomatoes, beans and a row of sunflowers along the fence, and by August the garden was taller "
    "than the children who played in it.",
    "Remember to drink water, stretch your shoulders and look away from the screen every twenty minutes; your "
    "eyes and back will thank you later.",
    "The museum opens a new exhibition on ancient navigation this weekend, with star charts, wooden compasses "
    "and a full-size replica of a trading ship.",
    "If you hear a beeping sound from the smoke alarm, the battery is probably low. Replace it soon, and test "
    "the alarm once a month after that.",
    "At the end of the match both teams shook hands, the crowd cheered for a long time, and the rain finally "
    "began to fall on the empty pitch.",
)


@dataclass
class RequestResult:
    """One streamed request. Times are seconds from sending it; ``audio_s`` counts the PCM received."""

    ok: bool
    ttfa_s: float | None
    total_s: float
    audio_s: float
    error: str | None = None
    # With ``ClientConfig.trace``: the request id, the client's perf_counter() at sending, first byte and end, stalls.
    trace: dict[str, Any] | None = None
    connected: bool = False  # it opened a TCP connection (False: it reused its stream's kept-alive one)
    first_of_stream: bool = False  # its stream's first request of the level
    # A player started at the first audio byte: how long it stood with an empty buffer, in how many gaps (playback.py).
    stall_s: float = 0.0
    stalls: int = 0


@dataclass
class ClientConfig:
    base_url: str
    model: str
    max_new_frames: int = DEFAULT_MAX_NEW_FRAMES
    tokens_per_frame: int = 1
    seed: int = 0
    timeout_s: float = 600.0
    # Sent as request fields on top of the checkpoint's sampling defaults (e.g. {"temperature": 0.0}).
    extra: dict[str, Any] = field(default_factory=dict)
    trace: bool = False  # name each request and ask the server to log its TTFA points
    # Open every stream's connection before the level's clock starts, as a kept-alive client has after its first
    # request: otherwise the first wave's TTFA carries the client opening all its connections at once.
    preconnect: bool = True


async def speech_request(client: httpx.AsyncClient, cfg: ClientConfig, text: str, seed: int) -> RequestResult:
    """Stream one request as raw PCM; TTFA is the arrival of the first non-empty body chunk."""
    payload = {
        "model": cfg.model,
        "input": text,
        "stream_format": "audio",
        "response_format": "pcm",
        "max_new_tokens": cfg.max_new_frames * cfg.tokens_per_frame,
        "seed": seed,
        **cfg.extra,
    }
    headers, trace, connected = {}, None, False
    if cfg.trace:
        trace = {"id": f"bench-{seed}-{uuid.uuid4().hex[:12]}"}
        headers = {REQUEST_ID_HEADER: trace["id"], TRACE_HEADER: "1"}

    async def on_event(name: str, info: dict[str, Any]) -> None:
        nonlocal connected
        if name == "connection.connect_tcp.complete":
            connected = True
        # When the client starts writing the request to its socket: the client's own work (connection,
        # serialization, its event loop) is before it. The server admits a request once its headers are in, so
        # the end of the write could come after the server's first point; its start cannot.
        elif trace is not None and name == "http11.send_request_headers.started":
            trace["writing"] = time.perf_counter()

    extensions = {"trace": on_event}
    start = time.perf_counter()
    first: float | None = None
    received = 0
    player = Playback()

    def result(ok: bool, ttfa: float | None, audio_s: float, error: str | None = None) -> RequestResult:
        total = time.perf_counter() - start
        stalls = {"stall_s": player.stall_s, "stalls": player.stalls}
        if trace is not None:
            trace.update(sent=start, first_byte=None if ttfa is None else start + ttfa, end=start + total, **stalls)
            trace["first_stall_at_s"] = player.first_stall_at_s
        return RequestResult(ok, ttfa, total, audio_s, error, trace, connected, **stalls)

    try:
        url = f"{cfg.base_url}/v1/audio/speech"
        async with client.stream("POST", url, json=payload, headers=headers, extensions=extensions) as response:
            if response.status_code != 200:
                body = (await response.aread()).decode(errors="replace")[:300]
                return result(False, None, 0.0, f"HTTP {response.status_code}: {body}")
            async for chunk in response.aiter_bytes():
                if not chunk:
                    continue
                now = time.perf_counter()
                if first is None:
                    first = now - start
                player.arrive(now, len(chunk) / PCM_BYTES_PER_SAMPLE / SAMPLE_RATE)
                received += len(chunk)
    except (httpx.HTTPError, OSError) as exc:
        return result(False, first, 0.0, f"{type(exc).__name__}: {exc}")
    if received == 0:
        return result(False, None, 0.0, "HTTP 200 with no audio")
    return result(True, first, received / PCM_BYTES_PER_SAMPLE / SAMPLE_RATE)


async def open_connection(client: httpx.AsyncClient, cfg: ClientConfig) -> int:
    """Open ``client``'s connection with a ``GET /health`` (any answer keeps an HTTP/1.1 connection open); 1 if it
    did. A server without the route still opens it; one that fails here leaves the first request to connect."""
    try:
        await client.get(f"{cfg.base_url}/health")
    except (httpx.HTTPError, OSError):  # as speech_request: the level then records the requests' own errors
        return 0
    return 1


async def sleep_until(deadline: float) -> None:
    """Sleep until ``time.perf_counter()`` reaches ``deadline``: the event loop may wake a timer early by its clock's
    resolution, and a stream's stagger is a lower bound on when it sends."""
    while (left := deadline - time.perf_counter()) > 0:
        await asyncio.sleep(left)


async def run_level(
    cfg: ClientConfig,
    concurrency: int,
    requests: int,
    seed_base: int = 0,
    shared_pool: bool = False,
    stagger_s: float = 0.0,
) -> dict[str, Any]:
    """Keep ``concurrency`` requests in flight until ``requests`` finished; returns the level's summary.

    Each stream sends its requests over a client of its own, one kept-alive connection. One pool shared by every
    stream costs the client CPU quadratic in its size whenever many requests end and start at once (httpcore
    scans the pool's connections for every queued request): at 256 streams it held back the sending of a wave by
    ~6 s (docs/BENCHMARKS.md, sixteenth set). ``shared_pool`` keeps that one pool, for
    ``benchmarks/client_pool.py``'s comparison. ``stagger_s``: stream ``k`` starts ``k * stagger_s / streams`` in.
    With ``cfg.preconnect`` the connections are open before the clock starts (``preconnected``: how many; the
    row's ``connections`` counts them with those the requests opened)."""
    streams = min(concurrency, requests)
    timeout = httpx.Timeout(cfg.timeout_s, connect=30.0)
    ssl_context = httpx.create_ssl_context()  # one for every client: each would load the CA bundle again
    if shared_pool:
        limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4)
    else:
        limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    clients = [
        httpx.AsyncClient(limits=limits, timeout=timeout, verify=ssl_context)
        for _ in range(1 if shared_pool else streams)
    ]
    queue = list(range(requests))
    results: list[RequestResult] = []

    async def worker(k: int, client: httpx.AsyncClient) -> None:
        # Stream 0 does not sleep at all: a zero sleep yields, and its first request would then be sent after
        # stream 1 had started counting its stagger (CI once saw the two 0.4999 s apart for a 0.5 s stagger).
        if k > 0 and stagger_s > 0:
            await sleep_until(time.perf_counter() + k * stagger_s / streams)
        first = True
        while queue:
            i = queue.pop(0)
            text = PROMPTS[(seed_base + i) % len(PROMPTS)]
            result = await speech_request(client, cfg, text, cfg.seed + seed_base + i)
            result.first_of_stream, first = first, False
            if result.trace is not None:
                result.trace["first_of_stream"] = result.first_of_stream
            results.append(result)

    async with contextlib.AsyncExitStack() as stack:
        for client in clients:
            await stack.enter_async_context(client)
        preconnected = 0
        if cfg.preconnect:
            opened = await asyncio.gather(*(open_connection(clients[k % len(clients)], cfg) for k in range(streams)))
            preconnected = sum(opened)
        # The client's own full collections would stop every stream at once, and they fell into the first wave's
        # sending (docs/BENCHMARKS.md, forty-third set): the heap so far is frozen, and the level's pauses kept.
        freeze_heap()
        pauses = GcPauses()
        pauses.install()
        start, cpu = time.perf_counter(), time.process_time()
        try:
            await asyncio.gather(*(worker(k, clients[k % len(clients)]) for k in range(streams)))
        finally:
            pauses.uninstall()
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    row = summarize(results, concurrency, wall, client_cpu_s=cpu, client_gc=as_row(pauses.take()))
    row |= {"preconnected": preconnected, "connections": row["connections"] + preconnected}
    if stagger_s > 0:
        later = [r.ttfa_s * 1000.0 for r in results if r.ok and r.ttfa_s is not None and not r.first_of_stream]
        row |= {"stagger_s": stagger_s, "ttfa_ms_p50_later": percentile(later, 50)}
        row |= {"ttfa_ms_p95_later": percentile(later, 95), "requests_later": len(later)}
    return row


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def summarize(
    results: list[RequestResult],
    concurrency: int,
    wall_s: float,
    client_cpu_s: float | None = None,
    client_gc: list[dict[str, float]] | None = None,
) -> dict[str, Any]:
    """One level's row: latencies in ms, RTF = generation time / audio time, throughput over the level's wall time.

    ``client_cpu_share``: the client's CPU time over the wall time (near 1: the client's one event loop was busy
    the whole level, and its own timings include waiting for it). ``client_gc``: the client's garbage collections
    over the level, per generation (``gc_pauses.as_row``): one stops every stream's timing at once."""
    good = [r for r in results if r.ok]
    ttfa = [r.ttfa_s * 1000.0 for r in good if r.ttfa_s is not None]
    rtf = [r.total_s / r.audio_s for r in good if r.audio_s > 0]
    audio = sum(r.audio_s for r in good)
    stall = [r.stall_s * 1000.0 for r in good]
    errors = [r.error for r in results if not r.ok]
    traces = [r.trace for r in results if r.trace is not None]
    return {
        "concurrency": concurrency,
        "requests": len(results),
        "ok": len(good),
        "errors": len(errors),
        "error_examples": sorted(set(e or "" for e in errors))[:3],
        "connections": sum(r.connected for r in results),
        "wall_s": wall_s,
        "ttfa_ms_p50": percentile(ttfa, 50),
        "ttfa_ms_p90": percentile(ttfa, 90),
        "ttfa_ms_p95": percentile(ttfa, 95),
        "rtf_p50": percentile(rtf, 50),
        "rtf_p95": percentile(rtf, 95),
        "audio_s_per_request": audio / len(good) if good else 0.0,
        "audio_s_total": audio,
        "realtime_x": audio / wall_s if wall_s > 0 else 0.0,
        "frames_per_s": audio * FRAME_RATE / wall_s if wall_s > 0 else 0.0,
        # Playback from the first byte (playback.py): the share of requests that ran dry, and for how long.
        "stalled_share": sum(r.stalls > 0 for r in good) / len(good) if good else None,
        "stall_ms_p50": percentile(stall, 50),
        "stall_ms_p95": percentile(stall, 95),
        "stall_ms_max": max(stall, default=None),
        **({"client_cpu_share": client_cpu_s / wall_s} if client_cpu_s is not None and wall_s > 0 else {}),
        **({"client_gc": client_gc} if client_gc is not None else {}),
        **({"trace": traces} if traces else {}),
    }


def tokens_per_frame_of(model: str) -> int:
    """1 for a parallel-head checkpoint, 4 for a flattened one (read from a local config.json; 1 if unknown)."""
    config = Path(model) / "config.json"
    if not config.is_file():
        return 1
    from vllm_omni_kani.model_executor.models.kani_tts.configuration import KaniTTSSettings

    class _Cfg:  # the settings reader wants attribute access, like an HF config
        def __init__(self, d: dict[str, Any]) -> None:
            self.__dict__.update(d)

    try:
        return KaniTTSSettings.from_hf_config(_Cfg(json.loads(config.read_text()))).tokens_per_frame
    except ValueError:
        return 1


def requests_per_level(concurrency: int, requests: int | None, waves: int, stagger_s: float) -> int:
    """``requests`` if given, else ``waves`` per stream, else 2 per stream (4 when staggered) and at least 8."""
    if requests:
        return requests
    if waves:
        return waves * concurrency
    return max((4 if stagger_s > 0 else 2) * concurrency, 8)


async def run_levels(
    cfg: ClientConfig,
    concurrency: list[int],
    requests: int | None,
    warmup: int,
    log: Any = print,
    on_level: Any = None,
    stagger_s: float = 0.0,
    waves: int = 0,
) -> list[dict[str, Any]]:
    """Warm up, then one level per concurrency; ``on_level(levels so far)`` after each (partial results survive)."""
    if warmup:
        # All warm-up requests at once (up to the largest level): vLLM compiles some kernels on first use per
        # batch shape, which must not land in the first measured level.
        row = await run_level(cfg, min(warmup, max(concurrency, default=1)), warmup, seed_base=10_000)
        log(f"warm-up: {row['ok']}/{row['requests']} ok, TTFA p50 {_fmt(row['ttfa_ms_p50'])} ms")
    levels = []
    for c in concurrency:
        n = requests_per_level(c, requests, waves, stagger_s)
        row = await run_level(cfg, c, n, stagger_s=stagger_s)
        later = ""
        if stagger_s > 0:
            later = f" (after each stream's first: p50 {_fmt(row['ttfa_ms_p50_later'])} p95 "
            later += f"{_fmt(row['ttfa_ms_p95_later'])} ms, streams staggered over {stagger_s:g} s)"
        log(
            f"c={c:>4} n={n:>4}: TTFA p50 {_fmt(row['ttfa_ms_p50'])} p95 {_fmt(row['ttfa_ms_p95'])} ms{later}, "
            f"RTF p50 {_fmt(row['rtf_p50'], 3)}, {row['realtime_x']:.1f}x real time, "
            f"{row['frames_per_s']:.0f} frames/s, errors {row['errors']}, "
            f"stalled {report.percent(row['stalled_share'])} (stall p95 {_fmt(row['stall_ms_p95'])} ms)"
        )
        levels.append(row)
        if on_level is not None:
            on_level(levels)
    return levels


def _fmt(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def run_serve_bench(args: argparse.Namespace, url: str, model: str, label: str, startup_s: float | None = None) -> Path:
    """Sweep the concurrency levels against one server and write ``<out>/<label>.json``."""
    tpf = args.tokens_per_frame or tokens_per_frame_of(model)
    if getattr(args, "e2e", False):
        from vllm_omni_kani.benchmarks import e2e_check

        e2e_check.run(url, model, Path(args.out), label, tpf)
    cfg = ClientConfig(
        base_url=url.rstrip("/"),
        model=model,
        max_new_frames=args.max_new_frames,
        tokens_per_frame=tpf,
        seed=args.seed,
        timeout_s=args.timeout,
        extra=json.loads(args.request_extra) if args.request_extra else {},
        trace=getattr(args, "trace", False),
        preconnect=not getattr(args, "no_preconnect", False),
    )
    result = {
        "kind": "serve",
        "label": label,
        "meta": report.environment(),
        "config": {**asdict(cfg), "tokens_per_frame": tpf, "deploy_config": args.deploy_config_note},
        "server_startup_s": startup_s,
        "levels": [],
    }

    def save(levels: list[dict[str, Any]]) -> None:
        result["levels"] = levels
        report.write_result(Path(args.out), label, result)

    stagger = getattr(args, "stagger_s", 0.0)
    levels = run_levels(
        cfg, args.concurrency, args.requests, args.warmup, on_level=save, stagger_s=stagger, waves=args.waves
    )
    save(asyncio.run(levels))
    return Path(args.out) / f"{label}.json"


def parse_int_list(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", help="base URL of a running `vllm serve --omni` server (e.g. http://127.0.0.1:8000)")
    parser.add_argument("--model", help="model name the server serves (its checkpoint path)")
    parser.add_argument("--serve", metavar="CKPT", help="start `vllm serve CKPT --omni --deploy-config ...` itself")
    parser.add_argument("--label", default="parallel", help="name of this run in the report (file <out>/<label>.json)")
    parser.add_argument("--concurrency", type=parse_int_list, default=list(DEFAULT_CONCURRENCY), help="e.g. 1,10,50")
    parser.add_argument(
        "--requests", type=int, default=0, help="requests per level (0: max(2 x concurrency, 8); 4 x with a stagger)"
    )
    parser.add_argument(
        "--waves",
        type=int,
        default=0,
        help="with --requests 0: this many requests per stream (waves x concurrency per level), for a longer level",
    )
    parser.add_argument(
        "--stagger-s",
        type=float,
        default=0.0,
        help="spread the streams' first requests over this many seconds (requests one by one, not in waves)",
    )
    parser.add_argument("--max-new-frames", type=int, default=DEFAULT_MAX_NEW_FRAMES, help="audio frames per request")
    parser.add_argument("--tokens-per-frame", type=int, default=0, help="0: read from the checkpoint (1 or 4)")
    parser.add_argument("--warmup", type=int, default=16, help="requests sent at once before the first level")
    parser.add_argument("--seed", type=int, default=0, help="request i uses seed + i")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per request")
    parser.add_argument("--request-extra", default="", help='JSON merged into every request ({"temperature": 0})')
    parser.add_argument("--deploy-config-note", default="", help="recorded in the result (which YAML the server ran)")
    parser.add_argument("--out", default="benchmarks/results", help="directory for <label>.json and the report")
    parser.add_argument(
        "--baselines",
        default="",
        help="comma list of naive,flattened,stock,stage0 (see vllm_omni_kani/benchmarks/baselines.py)",
    )
    parser.add_argument("--ckpt", help="parallel-head checkpoint for the naive baseline and stage0 (default: --model)")
    parser.add_argument("--flattened-ckpt", help="flattened checkpoint of the same backbone (flattened, stock)")
    parser.add_argument("--deploy-config", help="deploy YAML for servers this command starts (--serve, flattened)")
    parser.add_argument("--naive-requests", type=int, default=8, help="requests for the naive baseline (sequential)")
    parser.add_argument("--step-batches", type=parse_int_list, default=[1, 8, 32, 64, 128, 256])
    parser.add_argument("--e2e", action="store_true", help="first check one request: streamed PCM == WAV")
    parser.add_argument("--trace", action="store_true", help="keep per-request times; the server logs [KaniTTFA]")
    parser.add_argument(
        "--no-preconnect",
        action="store_true",
        help="let each stream's first request open its connection inside the level's clock (as before the 62nd set)",
    )
    parser.add_argument("--report-only", action="store_true", help="only re-render report.md/png from <out>/*.json")


def run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    if args.report_only:
        print(report.render(out))
        return 0
    if args.serve:
        from vllm_omni_kani.benchmarks.baselines import served

        print(f"wrote {served(args, args.serve, args.label)}")
    elif args.url:
        if not args.model:
            raise SystemExit("bench: --model is required with --url")
        path = run_serve_bench(args, args.url, args.model, args.label)
        print(f"wrote {path}")
    if args.baselines:
        from vllm_omni_kani.benchmarks import baselines

        for name in [b.strip() for b in args.baselines.split(",") if b.strip()]:
            path = baselines.run_baseline(name, args)
            print(f"wrote {path}")
    if not (args.url or args.serve or args.baselines):
        raise SystemExit("bench: give --url (and --model) for a server, --baselines, or --report-only")
    print(report.render(out))
    return 0
