"""What the benchmark client itself costs at high concurrency: one shared httpx pool against a connection per stream.

    .venv/bin/python benchmarks/client_pool.py --streams 256 --waves 3 --request-s 2 [--json OUT]

The client is ``bench``'s own (``bench_tts.run_level`` with ``--trace``); the server is a loopback stand-in for
``/v1/audio/speech`` that answers every request the same way at once: a first chunk of 3 frames, then the rest of
``--frames`` frames of silent PCM in chunks of 16, paced so that a request lasts ``--request-s`` seconds. Its
requests all end together, so each wave of ``--streams`` requests ends and the next starts at one moment, as
equal-length requests do on a GPU server. What the client adds is then all there is to see: per mode, the client's
CPU share, how long each request waited in the client before it started writing (send -> writing), and TTFA.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import multiprocessing
import sys
import time
from pathlib import Path

import httpx

from vllm_omni_kani.benchmarks import bench_tts
from vllm_omni_kani.benchmarks.server import free_port

FIRST_FRAMES, CHUNK_FRAMES = 3, 16
BYTES_PER_FRAME = bench_tts.SAMPLES_PER_FRAME * bench_tts.PCM_BYTES_PER_SAMPLE


def serve(port: int, request_s: float) -> None:
    """The stand-in server (its own process): each request streams its frames as chunks paced over request_s."""
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import StreamingResponse
    from starlette.routing import Route

    async def speech(request: Request) -> StreamingResponse:
        frames = int((await request.json())["max_new_tokens"])
        sizes = [FIRST_FRAMES] + [CHUNK_FRAMES] * math.ceil(max(frames - FIRST_FRAMES, 0) / CHUNK_FRAMES)
        sizes[-1] -= sum(sizes) - frames
        pause = request_s / max(len(sizes) - 1, 1)

        async def body():
            for i, n in enumerate(sizes):
                if i:
                    await asyncio.sleep(pause)
                yield bytes(n * BYTES_PER_FRAME)

        return StreamingResponse(body(), media_type="audio/pcm")

    app = Starlette(routes=[Route("/v1/audio/speech", speech, methods=["POST"])])
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", backlog=4096)


def wait_up(url: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            httpx.post(f"{url}/v1/audio/speech", json={"max_new_tokens": 1}, timeout=2).raise_for_status()
            return
        except httpx.HTTPError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def row(mode: str, level: dict) -> dict:
    """The level's client-side numbers (ms), from its trace."""
    trace = level["trace"]
    waits = [(t["writing"] - t["sent"]) * 1000.0 for t in trace if t.get("writing") is not None]
    return {
        "mode": mode,
        "requests": level["requests"],
        "errors": level["errors"],
        "connections": level["connections"],
        "wall_s": round(level["wall_s"], 2),
        "client_cpu_share": round(level["client_cpu_share"], 3),
        "send_to_writing_ms_p50": round(bench_tts.percentile(waits, 50), 1),
        "send_to_writing_ms_p95": round(bench_tts.percentile(waits, 95), 1),
        "send_to_writing_ms_max": round(max(waits), 1),
        "ttfa_ms_p50": round(level["ttfa_ms_p50"], 1),
        "ttfa_ms_p95": round(level["ttfa_ms_p95"], 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", type=int, default=256)
    parser.add_argument("--waves", type=int, default=3)
    parser.add_argument("--frames", type=int, default=64, help="frames per request")
    parser.add_argument("--request-s", type=float, default=2.0, help="how long the stand-in takes per request")
    parser.add_argument("--rounds", type=int, default=2, help="each mode this many times, alternating")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    port = free_port()
    server = multiprocessing.get_context("spawn").Process(target=serve, args=(port, args.request_s), daemon=True)
    server.start()
    url = f"http://127.0.0.1:{port}"
    rows = []
    try:
        wait_up(url)
        cfg = bench_tts.ClientConfig(base_url=url, model="stand-in", max_new_frames=args.frames, trace=True)
        requests = args.streams * args.waves
        for _ in range(args.rounds):
            for mode in ("shared pool", "connection per stream"):
                level = asyncio.run(bench_tts.run_level(cfg, args.streams, requests, shared_pool=mode == "shared pool"))
                rows.append(row(mode, level))
                print(json.dumps(rows[-1]), flush=True)
    finally:
        server.terminate()
        server.join(10)
    if args.json:
        args.json.write_text(json.dumps({"argv": sys.argv[1:], "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
