"""Where an engine core's main thread spends a served step, as a table, from a py-spy ``raw`` file.

    python3 benchmarks/stage0_step_table.py R/profile/idle-PID.txt[.gz] [--gpu-util R/profile/gpu-util-LABEL.csv]

Reads the main thread's stacks (those that start in the process's ``<module>``, under a ``MainThread`` root when
py-spy ran with ``--threads``) of a ``profile_served.py`` record,
idle samples included, and sorts each sample into the first category whose frame it contains (``CATEGORIES``, the
rows of docs/BENCHMARKS.md's eleventh-set table). With ``--gpu-util``, the samples taken after the load ended (the
trailing 0% utilisation samples, at the csv's 500-ms spacing and py-spy's ``--rate``) are dropped from the idle row,
so the shares describe the loaded engine. Prints a markdown table and the GPU's mean utilisation while loaded.
"""

from __future__ import annotations

import argparse
import collections
import gzip
from pathlib import Path

# (row, frame prefix): a sample goes to the first row one of its frames starts with.
CATEGORIES = (
    ("idle, no request in the engine", "_process_input_queue (vllm/v1/engine/core.py:1384)"),
    ("vLLM's penalties", "apply_penalties (vllm/v1/sample/sampler.py"),
    ("the penalties from device counts (`penalty_counts`)", "apply_penalties (vllm_omni_kani/"),
    ("zeroing new KV blocks (`_zero_block_ids`)", "_zero_block_ids (vllm/v1/worker/gpu_model_runner.py"),
    (
        "vLLM's codebook-1 noise, one draw per seeded generator",
        "random_sample (vllm/v1/sample/ops/topk_topp_sampler.py",
    ),
    ("vLLM's sampler, the rest", "forward (vllm/v1/sample/sampler.py"),
    ("waiting for the GPU in `_to_list`", "_to_list (vllm/v1/worker/gpu_model_runner.py"),
    ("our code heads (`make_omni_output`)", "make_omni_output ("),
    ("vLLM-Omni's output builder", "output_builder (vllm_omni/worker/gpu_ar_model_runner.py"),
    ("`sample_tokens`, the rest", "sample_tokens (vllm_omni/worker/gpu_ar_model_runner.py"),
    ("vLLM-Omni `_update_states`", "_update_states (vllm_omni/worker/gpu_ar_model_runner.py"),
    ("`execute_model` without the heads", "execute_model (vllm_omni/worker/gpu_ar_model_runner.py"),
    ("scheduler `schedule`", "schedule (vllm_omni/core/sched/omni_ar_scheduler.py"),
    ("scheduler `update_from_output`", "update_from_output (vllm_omni/core/sched/omni_ar_scheduler.py"),
)
OTHER = "other"
GPU_UTIL_SPACING_S = 0.5  # profile_served.py samples nvidia-smi every 500 ms


def read_raw(path: Path) -> list[tuple[list[str], int]]:
    """(frames, count) per line of a py-spy ``raw`` file, gzipped or not."""
    data = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    rows = []
    for line in data.decode(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            rows.append((stack.split(";"), int(count)))
    return rows


def unqualified(frame: str) -> str:
    """``Class.method (file:line)`` (py-spy 0.4.3 names the class) as ``method (file:line)`` (as py-spy 0.4.1 did)."""
    name, sep, where = frame.partition(" (")
    return name.rsplit(".", 1)[-1] + sep + where


def main_thread_shares(rows: list[tuple[list[str], int]]) -> collections.Counter[str]:
    """Samples per category of the main thread's stacks."""
    counts: collections.Counter[str] = collections.Counter()
    for frames, count in rows:
        if frames[0].startswith("thread (") and len(frames) > 1:
            # Recorded with --threads: the root names the thread ("thread (TID): MainThread").
            if not frames[0].endswith(": MainThread"):
                continue
            frames = frames[1:]
        if not frames[0].startswith("<module>"):
            continue
        frames = [unqualified(f) for f in frames]
        row = next((name for name, prefix in CATEGORIES if any(f.startswith(prefix) for f in frames)), OTHER)
        counts[row] += count
    return counts


def after_load(gpu_util: Path) -> tuple[int, float]:
    """(trailing 0% samples, mean utilisation before them) of a ``profile_served.py`` utilisation csv."""
    values = [float(line.split(",")[1]) for line in gpu_util.read_text().splitlines() if line.count(",") >= 2]
    trailing = len(values) - len("".join("x" if v else "0" for v in values).rstrip("0"))
    loaded = values[: len(values) - trailing]
    return trailing, (sum(loaded) / len(loaded) if loaded else 0.0)


def table(counts: collections.Counter[str], drop_idle: int = 0) -> list[tuple[str, int, float]]:
    """(row, samples, share) in ``CATEGORIES`` order, then the rest, with ``drop_idle`` idle samples removed."""
    counts = collections.Counter(counts)
    idle = CATEGORIES[0][0]
    counts[idle] = max(counts[idle] - drop_idle, 0)
    total = sum(counts.values()) or 1
    order = [name for name, _ in CATEGORIES] + [OTHER]
    return [(name, counts[name], 100.0 * counts[name] / total) for name in order if counts[name]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("raw", type=Path, help="py-spy raw file of an engine core (idle samples kept)")
    parser.add_argument("--gpu-util", type=Path, help="profile_served.py's gpu-util csv of the same window")
    parser.add_argument("--rate", type=int, default=100, help="py-spy samples per second of the record")
    args = parser.parse_args()
    drop = 0
    if args.gpu_util:
        trailing, mean = after_load(args.gpu_util)
        drop = round(trailing * GPU_UTIL_SPACING_S * args.rate)
        print(
            f"GPU busy {mean:.1f}% while loaded; {trailing} samples at 0% after the load: {drop} idle samples dropped"
        )
    print("| main thread | samples | share |\n|---|---|---|")
    for name, samples, share in table(main_thread_shares(read_raw(args.raw)), drop):
        print(f"| {name} | {samples} | {share:.1f}% |")


if __name__ == "__main__":
    main()
