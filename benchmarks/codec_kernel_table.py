"""The codec's served GPU time by kind of work, and what cuDNN converts around each conv, from one kernel trace.

    python3 benchmarks/codec_kernel_table.py TRACE [--json OUT]

TRACE is the codec engine's Chrome trace from ``KANI_KERNEL_TRACE`` (``kernel-trace-LABEL/stage1-PID.json``, or its
``.json.gz``). A gzip cut short (a device call that ended mid-pack) is read up to its last whole event, and the table
says how much of the window that covered. Kernels fall into the first kind whose name pattern they match
(:data:`KINDS`); every cuDNN conversion kernel (its ``convertTensor`` and its NCHW<->NHWC transposes) is charged to
the conv it runs next to, so the conv table shows each conv kernel family's own time beside the conversions it needs.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import zlib
from pathlib import Path

from kernel_share import GPU_CATEGORIES

# (kind, name substrings): the first match names a kernel's kind; the order matters (a conversion kernel's name
# mentions neither a conv nor a copy).
KINDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("cuDNN conversions (convertTensor, NCHW<->NHWC)", ("convertTensor", "nchwToNhwc", "nhwcToNchw")),
    ("cuDNN workspace set-up", ("init_device_workspace",)),  # its template arguments name a conv
    ("convolutions (cuDNN)", ("fprop", "implicit_gemm", "dgrad", "wgrad")),
    ("half-snakes", ("_half_snake",)),
    ("residual adds", ("_residual_kernel",)),
    ("up-samplers", ("_upsample_kernel",)),
    ("state gathers and scatters", ("indexSelect", "scatter_gather", "index_elementwise", "index_copy")),
    ("copies and fills", ("direct_copy", "Memcpy", "Memset", "memset", "fill")),
)
OTHER = "the rest"
CONVERSION, CONV = KINDS[0][0], KINDS[2][0]


def kind_of(name: str) -> str:
    for kind, patterns in KINDS:
        if any(p in name for p in patterns):
            return kind
    return OTHER


def read_trace_text(path: Path) -> tuple[str, bool]:
    """The trace's text and whether it was whole; a cut gzip yields what it holds."""
    raw = path.read_bytes()
    if not path.name.endswith(".gz"):
        return raw.decode(), True
    try:
        return gzip.decompress(raw).decode(), True
    except (EOFError, OSError, zlib.error):
        inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
        return inflate.decompress(raw).decode(errors="ignore"), False


def gpu_events(text: str) -> list[dict]:
    """The trace's kernel, memcpy and memset events in start order, up to the last whole one."""
    start = text.find("[", text.find('"traceEvents"'))
    if start < 0:
        return []
    decoder, i, events = json.JSONDecoder(), start + 1, []
    while True:
        while i < len(text) and text[i] in " \n\r\t,":
            i += 1
        try:
            event, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            break
        if event.get("ph") == "X" and event.get("cat") in GPU_CATEGORIES:
            events.append(event)
    return sorted(events, key=lambda e: float(e["ts"]))


def table(events: list[dict]) -> dict[str, object]:
    """Time per kind, and per conv kernel family the conversions charged to it."""
    if not events:
        return {"events": 0}
    kinds: collections.Counter[str] = collections.Counter()
    counts: collections.Counter[str] = collections.Counter()
    for e in events:
        kinds[kind_of(e["name"])] += float(e.get("dur", 0.0))
        counts[kind_of(e["name"])] += 1
    convs: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0, 0.0])  # count, conv µs, conversions µs
    pending = 0.0  # conversions seen since the last conv, charged to the next one
    last_conv: str | None = None
    for e in events:
        kind, dur = kind_of(e["name"]), float(e.get("dur", 0.0))
        if kind == CONVERSION:
            pending += dur
        elif kind == CONV:
            family = e["name"].split("(")[0][:90]
            row = convs[family]
            row[0] += 1
            row[1] += dur
            row[2] += pending
            pending, last_conv = 0.0, family
        else:
            if pending and last_conv is not None:  # conversions after a conv (its output back) are its own
                convs[last_conv][2] += pending
            pending = 0.0
    total = sum(kinds.values())
    window = max(float(e["ts"]) + float(e.get("dur", 0.0)) for e in events) - float(events[0]["ts"])
    return {
        "events": len(events),
        "window_ms": round(window / 1e3, 3),
        "gpu_ms": round(total / 1e3, 3),
        "kinds": [
            {"kind": k, "ms": round(us / 1e3, 3), "share": round(us / total, 4), "count": counts[k]}
            for k, us in kinds.most_common()
        ],
        "convs": [
            {"conv": name, "count": int(c), "conv_ms": round(us / 1e3, 3), "conversions_ms": round(cv / 1e3, 3)}
            for name, (c, us, cv) in sorted(convs.items(), key=lambda kv: -(kv[1][1] + kv[1][2]))
        ],
    }


def markdown(result: dict[str, object], whole: bool) -> str:
    if not result.get("events"):
        return "no GPU events\n"
    lines = [
        f"{result['events']} GPU events over {result['window_ms']} ms, {result['gpu_ms']} ms of GPU time"
        + ("" if whole else " (the trace was cut: only its first part is here)"),
        "",
        "| kind | ms | share | kernels |",
        "|---|---|---|---|",
    ]
    lines += [f"| {r['kind']} | {r['ms']:.1f} | {r['share']:.1%} | {r['count']} |" for r in result["kinds"]]
    lines += ["", "| conv kernel | calls | conv ms | cuDNN conversions beside it, ms |", "|---|---|---|---|"]
    lines += [
        f"| `{r['conv']}` | {r['count']} | {r['conv_ms']:.1f} | {r['conversions_ms']:.1f} |" for r in result["convs"]
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace", type=Path)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    text, whole = read_trace_text(args.trace)
    result = table(gpu_events(text))
    result["whole_trace"] = whole
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    print(markdown(result, whole), end="")


if __name__ == "__main__":
    main()
