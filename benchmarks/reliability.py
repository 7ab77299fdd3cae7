"""Overload and abort timings of a served Kani pipeline (the numbers in docs/RELIABILITY.md).

    python benchmarks/reliability.py                     # starts its own CPU server on 127.0.0.1
    python benchmarks/reliability.py --url http://127.0.0.1:8091

- **overload**: every admission slot is taken by a long greedy stream (its headers read, the engine busy), then
  ``--probes`` requests past the limit go out one after another on a warm connection and ``--burst`` more at once;
  each must be a 503 with ``Retry-After``; the burst goes out once on new connections and once on connections
  opened beforehand. Reports their latency (p50 / p99 / max) and any connection that failed. The holders are then
  cancelled through ``POST /v1/audio/speech/{id}/cancel``, and the time until the active gauge reads 0 is reported.
- **abort**: ``--streams`` long streams are cut by their clients at random points; reports the time from the last
  cut until the active gauge reads 0, and then that a normal request succeeds.

Only 127.0.0.1 is used; every request is bounded (greedy 1,500 frames at most, and cancelled or cut).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from pathlib import Path

import httpx

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from vllm_omni_kani.entrypoints.openai.metrics import sample_value  # noqa: E402

LONG = {"input": "Hello world, this is Kani speaking.", "max_new_tokens": 1500, "temperature": 0.0}
STREAM = {**LONG, "response_format": "pcm", "stream_format": "audio"}


async def gauge(client: httpx.AsyncClient, base: str, name: str) -> float:
    return sample_value((await client.get(base + "/metrics")).text, name) or 0.0


async def wait_gauge(client: httpx.AsyncClient, base: str, name: str, value: float, timeout_s: float) -> float:
    """Seconds until the gauge reads ``value`` (polled every 10 ms)."""
    start = time.perf_counter()
    while await gauge(client, base, name) != value:
        if time.perf_counter() - start > timeout_s:
            raise TimeoutError(f"{name} != {value} after {timeout_s} s")
        await asyncio.sleep(0.01)
    return time.perf_counter() - start


def summary(seconds: list[float]) -> dict[str, float]:
    ms = sorted(s * 1000 for s in seconds)
    return {
        "n": len(ms),
        "p50_ms": round(statistics.median(ms), 2),
        "p99_ms": round(ms[min(len(ms) - 1, int(0.99 * len(ms)))], 2),
        "max_ms": round(ms[-1], 2),
    }


async def overload(base: str, probes: int, burst: int) -> dict:
    async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=200)) as client:
        limit = int(await gauge(client, base, "kani:speech_max_concurrent_requests"))
        holders = []
        for i in range(limit):
            request = client.build_request(
                "POST", base + "/v1/audio/speech", json=STREAM, headers={"X-Request-Id": f"hold-{i}"}
            )
            holders.append(await client.send(request, stream=True))
        assert all(h.status_code == 200 for h in holders)
        await wait_gauge(client, base, "kani:speech_requests_active", limit, 60)

        latencies, statuses, errors = [], [], []

        async def probe(on: httpx.AsyncClient, text: str) -> float | None:
            """One request past the limit: its latency, or None (recorded in ``errors``) if the connection failed."""
            start = time.perf_counter()
            try:
                r = await on.post(base + "/v1/audio/speech", json={"input": text})
            except httpx.TransportError as exc:
                errors.append({"probe": text, "after_s": round(time.perf_counter() - start, 4), "error": repr(exc)})
                return None
            statuses.append((r.status_code, r.headers.get("retry-after")))
            return time.perf_counter() - start

        await client.get(base + "/health")
        for _ in range(probes):
            latencies.append(await probe(client, "One more, please."))
        # A burst on fresh connections (connect + request), then one on connections opened beforehand, so the
        # second measures the server's answer rather than ``burst`` TCP handshakes on a busy host.
        cold = await asyncio.gather(*(probe(client, "All at once.") for _ in range(burst)))
        async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=burst)) as warm_client:
            await asyncio.gather(*(warm_client.get(base + "/v1/models") for _ in range(burst)))
            warm = await asyncio.gather(*(probe(warm_client, "All at once, warm.") for _ in range(burst)))
        assert all(s == (503, "1") for s in statuses), statuses[:5]

        start = time.perf_counter()
        cancels = await asyncio.gather(*(client.post(f"{base}/v1/audio/speech/hold-{i}/cancel") for i in range(limit)))
        assert all(c.status_code == 200 for c in cancels)
        freed_s = time.perf_counter() - start + await wait_gauge(client, base, "kani:speech_requests_active", 0, 30)
        for h in holders:
            await h.aclose()
        return {
            "limit": limit,
            "sequential_503": summary([x for x in latencies if x is not None]),
            "burst_503_new_connections": summary([x for x in cold if x is not None]),
            "burst_503_open_connections": summary([x for x in warm if x is not None]),
            "connection_errors": errors,
            "cancel_all_holders_freed_s": round(freed_s, 3),
        }


async def abort(base: str, streams: int, seed: int) -> dict:
    rng = random.Random(seed)
    async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=streams + 4)) as client:

        async def one(i: int) -> float:
            await asyncio.sleep(rng.random())
            cut_after = rng.choice([0, 1, 2, 3, 5, 8, 13])
            async with client.stream("POST", base + "/v1/audio/speech", json=STREAM) as r:
                seen = 0
                if cut_after:
                    async for chunk in r.aiter_bytes():
                        seen += bool(chunk)
                        if seen >= cut_after:
                            break
            return time.perf_counter()

        cut_times = await asyncio.gather(*(one(i) for i in range(streams)))
        last_cut = max(cut_times)
        freed_s = time.perf_counter() - last_cut + await wait_gauge(client, base, "kani:speech_requests_active", 0, 30)
        r = await client.post(base + "/v1/audio/speech", json={**LONG, "max_new_tokens": 5})
        text = (await client.get(base + "/metrics")).text
        return {
            "streams": streams,
            "freed_after_last_cut_s": round(freed_s, 3),
            "next_request_status": r.status_code,
            "engine_running_after": sample_value(text, "vllm_omni:num_requests_running"),
            "engine_waiting_after": sample_value(text, "vllm_omni:num_requests_waiting"),
        }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="a running server, http://127.0.0.1:PORT (default: start one)")
    parser.add_argument("--ckpt", default=str(REPO_ROOT / "checkpoints/kani-tiny-parallel"))
    parser.add_argument("--deploy", default="kani_tts_cpu.yaml")
    parser.add_argument("--probes", type=int, default=200)
    parser.add_argument("--burst", type=int, default=50)
    parser.add_argument("--streams", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("reliability.json"))
    args = parser.parse_args(argv)

    server = None
    if args.url:
        if not args.url.startswith(("http://127.0.0.1:", "http://localhost:")):
            parser.error("--url must be a local server")
        base = args.url.rstrip("/")
    else:
        from tests.server_utils import ServeProcess

        server = ServeProcess(args.out.with_suffix(".serve.log"))
        base = server.start(args.ckpt, args.deploy)
    try:
        result = {
            "overload": asyncio.run(overload(base, args.probes, args.burst)),
            "abort": asyncio.run(abort(base, args.streams, args.seed)),
        }
    finally:
        if server is not None:
            server.stop()
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
