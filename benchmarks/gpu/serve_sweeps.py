"""Start one `vllm serve --omni` server and run several `bench` sweeps against it (one per request length).

    python3 benchmarks/gpu/serve_sweeps.py --ckpt CK --deploy-config Y --label L --out R 64:1,64,256 250:64,256

Each RUN is ``FRAMES:CONCURRENCY,...`` and writes ``R/L-fFRAMES.json``; ``FRAMES:CONCURRENCY:STAGGER_S``
spreads the streams' first requests over STAGGER_S seconds (``bench --stagger-s``) and writes
``R/L-fFRAMES-sSTAGGER_S.json``. ``--waves W`` sends W requests per stream at every level (default: bench's 2).
The first run also checks one request end to end (streamed PCM == WAV). Every request is traced (``bench --trace``:
the server logs its TTFA points, which ``benchmarks/ttfa_breakdown.py`` joins with the client's). Afterwards the
server log is scanned for chunks the codec refused (a lost or out-of-order chunk would be logged there), and the count
is written to ``R/L-codec-errors.txt``.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path

from vllm_omni_kani.benchmarks import bench_tts
from vllm_omni_kani.benchmarks.server import serving


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ckpt", required=True)
    parser.add_argument("--deploy-config", required=True)
    parser.add_argument("--label", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--warmup", type=int, default=64)
    parser.add_argument("--waves", type=int, default=0, help="requests per stream at each level (bench --waves)")
    parser.add_argument("--no-preconnect", action="store_true", help="bench --no-preconnect (as before the 62nd set)")
    parser.add_argument("runs", nargs="+", help="FRAMES:CONCURRENCY,...[:STAGGER_S] per sweep")
    args = parser.parse_args()
    # `timeout` ends a step with SIGTERM: leave through the context manager so the server stops too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(124))
    out = Path(args.out)
    log = out / f"serve-{args.label}.log"
    started = time.perf_counter()
    with serving(args.ckpt, args.deploy_config, log) as server:
        startup = time.perf_counter() - started
        print(f"server up in {startup:.0f} s", flush=True)
        for i, run in enumerate(args.runs):
            frames, levels, *stagger = run.split(":")
            label = f"{args.label}-f{frames}" + "".join(f"-s{s}" for s in stagger)
            argv = ["--url", server.url, "--model", args.ckpt, "--label", label]
            argv += [f"--stagger-s={s}" for s in stagger]
            argv += ["--max-new-frames", frames, "--concurrency", levels, "--warmup", str(args.warmup)]
            argv += ["--waves", str(args.waves)] + (["--no-preconnect"] if args.no_preconnect else [])
            argv += ["--out", str(out), "--deploy-config-note", args.deploy_config, "--trace"]
            if i == 0:
                argv.append("--e2e")
            parser_b = argparse.ArgumentParser()
            bench_tts.add_arguments(parser_b)
            bench_args = parser_b.parse_args(argv)
            path = bench_tts.run_serve_bench(bench_args, server.url, args.ckpt, bench_args.label, startup)
            print(f"wrote {path}", flush=True)
    text = log.read_text(errors="replace") if log.exists() else ""
    refused = [line for line in text.splitlines() if "Kani codec: request" in line or "bad window" in line]
    (out / f"{args.label}-codec-errors.txt").write_text(f"{len(refused)}\n" + "\n".join(refused[:50]) + "\n")
    print(f"codec refused/bad chunks in the server log: {len(refused)}", flush=True)


if __name__ == "__main__":
    main()
