"""What finding the speech route costs the API server's event loop, with the route where vLLM-Omni puts it and first.

    python3 benchmarks/route_walk.py [--requests 4000] [--rounds 5] [--json OUT]

The app is built as ``vllm serve --omni`` builds it (vLLM's ``build_app``, then vLLM-Omni's router; the plugin's own
routes and middleware where its patches apply in this process). Two measures, each side in alternating rounds:

- ``walks``: Starlette's route walk for ``POST /v1/audio/speech`` plus the one vLLM's Prometheus instrumentation does
  to name it (``prometheus_fastapi_instrumentator.routing._get_route_name``), µs a request;
- ``asgi``: a whole request through the app's middleware and router, in this process (no socket), with the speech
  route's endpoint replaced by a stand-in that streams five 4-KiB chunks (a 64-frame request's chunk count) and
  reads no engine; the route object itself, its path and its place in the list are the served ones.

Prints the median of the rounds for each side: ``as_built`` and ``speech_first`` (``route_order.speech_first``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path
from typing import Any

from starlette.routing import Match

from vllm_omni_kani.entrypoints.openai.route_order import speech_first
from vllm_omni_kani.entrypoints.openai.speech_guard import SPEECH_PATH

CHUNKS = 5
CHUNK = b"\0" * 4096
BODY = b'{"input": "Hello there, how are you today?", "stream": true, "response_format": "pcm"}'


def served_app() -> Any:
    """The app as ``vllm serve --omni`` builds it: vLLM's routes, then vLLM-Omni's router."""
    from vllm.entrypoints.openai.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    from vllm_omni.entrypoints.openai import api_server

    args = make_arg_parser(FlexibleArgumentParser()).parse_args(["--model", "kani"])
    app = api_server.build_openai_app(args, ())
    app.include_router(api_server.router)
    return app


def _scope() -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": SPEECH_PATH,
        "raw_path": SPEECH_PATH.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(BODY)).encode())],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 8000),
        "state": {},
    }


async def _stand_in(scope: Any, receive: Any, send: Any) -> None:
    """The speech endpoint's place: read the body, stream ``CHUNKS`` chunks."""
    while (await receive()).get("more_body"):
        pass
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"audio/pcm")]})
    for _ in range(CHUNKS):
        await send({"type": "http.response.body", "body": CHUNK, "more_body": True})
    await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _one(app: Any) -> None:
    delivered = False

    async def receive() -> dict[str, Any]:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": BODY, "more_body": False}
        await asyncio.Event().wait()  # no disconnect
        return {}

    async def send(message: dict[str, Any]) -> None:
        pass

    await app(_scope(), receive, send)


def _walks(app: Any, requests: int) -> float:
    from prometheus_fastapi_instrumentator import routing

    scope = _scope()
    start = time.perf_counter()
    for _ in range(requests):
        for route in app.router.routes:
            if route.matches(scope)[0] == Match.FULL:
                break
        routing._get_route_name(scope, app.routes)
    return (time.perf_counter() - start) / requests * 1e6


async def _asgi(app: Any, requests: int) -> float:
    start = time.perf_counter()
    for _ in range(requests):
        await _one(app)
    return (time.perf_counter() - start) / requests * 1e6


def measure(requests: int, rounds: int) -> dict[str, Any]:
    built, first = served_app(), served_app()
    for app in (built, first):
        for route in app.router.routes:
            if getattr(route, "path", None) == SPEECH_PATH:
                route.app = _stand_in
    speech_first(first, SPEECH_PATH)
    sides = {"as_built": built, "speech_first": first}
    index = {
        name: [getattr(r, "path", None) for r in app.router.routes].index(SPEECH_PATH) for name, app in sides.items()
    }
    samples: dict[str, dict[str, list[float]]] = {name: {"walks": [], "asgi": []} for name in sides}

    async def run() -> None:
        for app in sides.values():
            for _ in range(200):
                await _one(app)  # builds the middleware stack, warms the paths
        for _ in range(rounds):
            for name, app in sides.items():
                samples[name]["walks"].append(_walks(app, requests))
                samples[name]["asgi"].append(await _asgi(app, requests))

    asyncio.run(run())
    return {
        "routes": len(built.router.routes),
        "speech_index": index,
        "requests": requests,
        "rounds": rounds,
        "us_per_request": {
            name: {kind: round(statistics.median(values), 1) for kind, values in kinds.items()}
            for name, kinds in samples.items()
        },
        "samples": samples,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    result = measure(args.requests, args.rounds)
    print(f"{result['routes']} routes; the speech route at index {result['speech_index']}")
    for name, kinds in result["us_per_request"].items():
        print(f"{name:>13}: walks {kinds['walks']:7.1f} us, whole request (stand-in endpoint) {kinds['asgi']:7.1f} us")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
