"""Environment variables the plugin reads, defined once (vLLM's own are in ``vllm.envs``)."""

from __future__ import annotations

import os

TRUTHY = ("1", "true", "on", "yes")  # the values that turn a switch on, in any case
FALSY = ("0", "false", "off", "no")  # the values that turn a default-on switch off, in any case


def _flag(name: str) -> bool:
    """Whether the variable ``name`` is set to one of ``TRUTHY`` (any case)."""
    return os.environ.get(name, "").strip().lower() in TRUTHY


def on_unless_off(name: str) -> bool:
    """A default-on switch: whether the variable ``name`` is unset or not one of ``FALSY`` (any case)."""
    return os.environ.get(name, "").strip().lower() not in FALSY


# "1": log one line per chunk where Stage 0 emits it and per codec step (windows, decode time, wall clock), to
# place first-audio latency between the stages; the codec step then waits for its decode to finish (a host sync).
KANI_TRACE_CHUNKS = "KANI_TRACE_CHUNKS"


def trace_chunks() -> bool:
    """Whether ``KANI_TRACE_CHUNKS`` is on (read when a stage process loads its model or producer)."""
    return _flag(KANI_TRACE_CHUNKS)


KANI_DISABLE_PATCHES = "KANI_DISABLE_PATCHES"


def disabled_patches() -> set[str]:
    """Names of ``patch`` functions listed in ``KANI_DISABLE_PATCHES`` (comma-separated): left unapplied, to measure
    or bypass one workaround without editing the plugin."""
    return {name.strip() for name in os.environ.get(KANI_DISABLE_PATCHES, "").split(",") if name.strip()}


KANI_TRACE_FIRST_OUTPUTS = "KANI_TRACE_FIRST_OUTPUTS"


def trace_first_outputs() -> bool:
    """``KANI_TRACE_FIRST_OUTPUTS``: each stage's scheduler logs one ``[KaniFirstOutput]`` line per request (when it was
    added, first scheduled, and its first output left; ``core/sched/first_outputs.py``)."""
    return _flag(KANI_TRACE_FIRST_OUTPUTS)


KANI_LOG_STAGE0_FINISHED = "KANI_LOG_STAGE0_FINISHED"


def log_stage0_finished() -> bool:
    """``KANI_LOG_STAGE0_FINISHED``: Stage 0's scheduler logs one ``[KaniStage0Finished]`` line per request as it frees
    it, with its output token count (``core/sched/finished_tokens.py``), for the audio check of requests whose last
    Stage-0 output the orchestrator dropped."""
    return _flag(KANI_LOG_STAGE0_FINISHED)


KANI_LAZY_SUBMIT = "KANI_LAZY_SUBMIT"


def lazy_submit() -> bool:
    """``KANI_LAZY_SUBMIT``: a streamed speech request's engine request is queued when its response starts, as
    vLLM-Omni does, instead of when the handler has its output generator (``early_start.py``); for A/B runs."""
    return _flag(KANI_LAZY_SUBMIT)


KANI_GENERIC_SUBMIT = "KANI_GENERIC_SUBMIT"


def generic_submit() -> bool:
    """``KANI_GENERIC_SUBMIT``: a Kani segment's engine request is made by vLLM-Omni's generic
    ``_prepare_speech_generation`` (its deep copies of the sampling parameters included) instead of ``kani_submit``;
    for A/B runs."""
    return _flag(KANI_GENERIC_SUBMIT)


KANI_REQUEST_TABLES = "KANI_REQUEST_TABLES"


def request_tables() -> bool:
    """``KANI_REQUEST_TABLES``: the API server logs vLLM-Omni's per-request stats tables instead of one
    ``[KaniRequestStats]`` line per request."""
    return _flag(KANI_REQUEST_TABLES)


KANI_GIL_SWITCH_INTERVAL_MS = "KANI_GIL_SWITCH_INTERVAL_MS"
# The same for the main process alone (the API server, or an offline script): where vLLM-Omni's orchestrator thread
# shares the GIL with the event loop. Wins over KANI_GIL_SWITCH_INTERVAL_MS there.
KANI_MAIN_GIL_SWITCH_INTERVAL_MS = "KANI_MAIN_GIL_SWITCH_INTERVAL_MS"

KANI_WAKE_ON_FINAL_OUTPUTS = "KANI_WAKE_ON_FINAL_OUTPUTS"


def wake_on_final_outputs() -> bool:
    """``KANI_WAKE_ON_FINAL_OUTPUTS=1``: the API server's output task waits for the orchestrator's put instead of
    polling every millisecond (``engine/final_outputs.py``; off: no resolved difference served on an H200)."""
    return _flag(KANI_WAKE_ON_FINAL_OUTPUTS)


KANI_MAIN_GC_THRESHOLD = "KANI_MAIN_GC_THRESHOLD"
GC_THRESHOLD_FIELDS = 3  # gc.set_threshold's arguments: the allocations before a gen-0 collection, then two counts


def main_gc_threshold() -> tuple[int, ...] | None:
    """``KANI_MAIN_GC_THRESHOLD``: ``gc.set_threshold``'s arguments for the main process (the API server), one to
    three comma-separated integers (``20000`` or ``20000,10,10``), or None when unset or empty.

    Raises ValueError with the variable's name for anything else, and for a first value below 1 (0 would turn the
    process's automatic collection off, leaking every reference cycle of a long-running server)."""
    raw = os.environ.get(KANI_MAIN_GC_THRESHOLD, "").strip()
    if not raw:
        return None
    parts = [part.strip() for part in raw.split(",")]
    try:
        values = tuple(int(part) for part in parts)
    except ValueError:
        values = ()
    if not 1 <= len(values) <= GC_THRESHOLD_FIELDS or values[0] < 1 or min(values) < 0:
        raise ValueError(
            f"{KANI_MAIN_GC_THRESHOLD}={raw!r}: expected one to {GC_THRESHOLD_FIELDS} comma-separated integers, "
            "the first positive (gc.set_threshold's arguments)"
        )
    return values


def gil_switch_interval_s(name: str = KANI_GIL_SWITCH_INTERVAL_MS) -> float | None:
    """The variable ``name`` (milliseconds) in seconds (``sys.setswitchinterval``'s unit), or None when unset or
    empty.

    Raises ValueError with the variable's name for a value that is not a positive number."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not value > 0:
        raise ValueError(f"{name}={raw!r}: expected a positive number of milliseconds")
    return value / 1000.0


def _seconds(name: str, unit: str = "seconds", default: float = 0.0) -> float:
    """The variable ``name`` as a number (of ``unit``), ``default`` when unset or empty, 0 when negative; ValueError
    naming it otherwise."""
    raw = os.environ.get(name, "").strip()
    try:
        value = float(raw) if raw else default
    except ValueError as exc:
        raise ValueError(f"{name}={raw!r}: expected a number of {unit}") from exc
    return max(value, 0.0)


KANI_SUBMIT_YIELD_US = "KANI_SUBMIT_YIELD_US"
# On unless set to 0: served against 0 on one H200 (engine/submit_yield.py; docs/BENCHMARKS.md, forty-fifth set).
DEFAULT_SUBMIT_YIELD_US = 100.0


def submit_yield_s() -> float:
    """``KANI_SUBMIT_YIELD_US`` in seconds (unset or empty: ``DEFAULT_SUBMIT_YIELD_US``; 0: off): the API server's
    thread sleeps this long after it queues an engine request, handing the GIL to the orchestrator thread that
    forwards it (``engine/submit_yield.py``)."""
    return _seconds(KANI_SUBMIT_YIELD_US, "microseconds", DEFAULT_SUBMIT_YIELD_US) / 1e6


KANI_STEP_STATS_S = "KANI_STEP_STATS_S"
KANI_LOOP_LAG_S = "KANI_LOOP_LAG_S"
KANI_LOOP_STALL_MS = "KANI_LOOP_STALL_MS"
KANI_LOOP_GC_CENSUS = "KANI_LOOP_GC_CENSUS"


def step_stats_interval_s() -> float:
    """``KANI_STEP_STATS_S``: log Stage 0's step rate every this many seconds (0 or unset: off)."""
    return _seconds(KANI_STEP_STATS_S)


def loop_lag_interval_s() -> float:
    """``KANI_LOOP_LAG_S``: log the API server's event-loop lag every this many seconds (0 or unset: off)."""
    return _seconds(KANI_LOOP_LAG_S)


def loop_stall_threshold_s() -> float:
    """``KANI_LOOP_STALL_MS`` in seconds: with the loop-lag meter on, sample the loop thread's stack while the loop
    has not ticked for this long (0 or unset: off)."""
    return _seconds(KANI_LOOP_STALL_MS, "milliseconds") / 1000.0


def loop_gc_census() -> bool:
    """``KANI_LOOP_GC_CENSUS=1``: with the loop-lag meter on, also log each window what the API server's oldest
    generation holds (its count and commonest types): what a full collection under load walks. It walks that
    generation on the event loop once a window, so it is for diagnosis only."""
    return _flag(KANI_LOOP_GC_CENSUS)


KANI_STAGE0_SAMPLER_PATCHES = "KANI_STAGE0_SAMPLER_PATCHES"
# The patches a Kani Stage-0 process can take (``patch.apply_stage0_sampling``): the penalties' output-token counts
# kept on the device, seeded requests' codebook-1 noise hashed for the whole batch, and top-k/top-p over the columns the
# speech mask can leave open. On by default: in-engine A/Bs on an H200 found the first two faster at 256 streams with
# every request's audio whole (docs/BENCHMARKS.md, "Twelfth set" and "Eighteenth set"); the third cuts the sampling's
# device time at 256 rows from 0.65 to 0.29 ms, a served difference too small to resolve ("Twenty-fifth set").
# ``code_race_kernel`` samples and packs the code heads in one kernel (``code_race``) in steps of up to 16 requests:
# 0.89x the step at batch 1 in an in-engine A/B, served RTF 0.043 at one stream ("Thirty-eighth set").
SAMPLER_PATCH_NAMES = ("penalty_counts", "codebook1_noise", "top_k_open_columns", "code_race_kernel")
DEFAULT_SAMPLER_PATCHES = SAMPLER_PATCH_NAMES


def _patch_names(name: str, raw: str) -> frozenset[str]:
    """A comma-separated list of sampler patch names; ValueError naming the valid ones for a name that is not one."""
    names = {part.strip() for part in raw.split(",") if part.strip()}
    unknown = sorted(names - set(SAMPLER_PATCH_NAMES))
    if unknown:
        raise ValueError(
            f"{name}={raw!r}: unknown {', '.join(unknown)}; expected 1 (the defaults), 0 (none) or a comma-separated "
            f"list of {', '.join(SAMPLER_PATCH_NAMES)}"
        )
    return frozenset(names)


def stage0_sampler_patches() -> frozenset[str]:
    """The sampler patches a Kani Stage-0 process takes: ``DEFAULT_SAMPLER_PATCHES`` when
    ``KANI_STAGE0_SAMPLER_PATCHES`` is unset or on (1), none when it is off (0), else the comma-separated names it
    lists (any of ``SAMPLER_PATCH_NAMES``).

    Raises ValueError naming the valid names for a name that is not one."""
    raw = os.environ.get(KANI_STAGE0_SAMPLER_PATCHES, "").strip().lower()
    if not raw or raw in TRUTHY:
        return frozenset(DEFAULT_SAMPLER_PATCHES)
    if raw in FALSY:
        return frozenset()
    return _patch_names(KANI_STAGE0_SAMPLER_PATCHES, raw)


KANI_SAMPLER_AB_PERIOD_S = "KANI_SAMPLER_AB_PERIOD_S"
KANI_SAMPLER_AB_PATCHES = "KANI_SAMPLER_AB_PATCHES"


def sampler_ab_period_s() -> float:
    """``KANI_SAMPLER_AB_PERIOD_S``: the sampler patches alternate with vLLM's path in windows of this many seconds
    (``sampler_ab``); 0 or unset: no alternation."""
    return _seconds(KANI_SAMPLER_AB_PERIOD_S)


def sampler_ab_patches() -> frozenset[str]:
    """``KANI_SAMPLER_AB_PATCHES``: the taken patches that alternate (unset: all of them); the others take their own
    path in every window, so one patch is measured on top of the rest."""
    raw = os.environ.get(KANI_SAMPLER_AB_PATCHES, "").strip().lower()
    return _patch_names(KANI_SAMPLER_AB_PATCHES, raw) if raw else frozenset(SAMPLER_PATCH_NAMES)


KANI_JIT_EVENTS = "KANI_JIT_EVENTS"


def jit_events() -> bool:
    """``KANI_JIT_EVENTS=1``: log every Triton compile of the process with its start and duration (``jit_events``)."""
    return _flag(KANI_JIT_EVENTS)


KANI_KERNEL_TRACE = "KANI_KERNEL_TRACE"
KANI_KERNEL_TRACE_S = "KANI_KERNEL_TRACE_S"
KERNEL_TRACE_DEFAULT_S = 2.0


def kernel_trace_dir() -> str:
    """``KANI_KERNEL_TRACE``: the folder whose ``start`` file opens one torch-profiler window in every engine process
    (``kernel_trace``); empty when unset."""
    return os.environ.get(KANI_KERNEL_TRACE, "").strip()


def kernel_trace_seconds() -> float:
    """``KANI_KERNEL_TRACE_S``: the window's length (default ``KERNEL_TRACE_DEFAULT_S``)."""
    return _seconds(KANI_KERNEL_TRACE_S) or KERNEL_TRACE_DEFAULT_S


KANI_KERNEL_TRACE_HOST = "KANI_KERNEL_TRACE_HOST"
KERNEL_TRACE_HOST_MODES = ("", "ops", "python")


def kernel_trace_host(label: str) -> str:
    """``KANI_KERNEL_TRACE_HOST``: what of the host the window of a process labelled ``label`` records beside the
    GPU's activity: nothing (unset), ``ops`` (torch's CPU ops and ``record_function`` ranges, vLLM's with
    ``VLLM_CUSTOM_SCOPES_FOR_PROFILING=1``) or ``python`` (those and every Python call: where a step's host time goes,
    at several times its cost). ``MODE:LABEL[,LABEL]`` limits it to those processes (``python:stage0``)."""
    raw = os.environ.get(KANI_KERNEL_TRACE_HOST, "").strip().lower()
    mode, _, labels = raw.partition(":")
    if mode not in KERNEL_TRACE_HOST_MODES:
        raise ValueError(f"{KANI_KERNEL_TRACE_HOST}={raw!r}: expected one of {', '.join(KERNEL_TRACE_HOST_MODES[1:])}")
    return mode if not labels or label in {part.strip() for part in labels.split(",")} else ""


KANI_STEP_CODE_ROWS = "KANI_STEP_CODE_ROWS"


def step_code_rows() -> bool:
    """``KANI_STEP_CODE_ROWS``: Stage 0's runner hands its step's codes to the scheduler as one host tensor and each
    request's token span (``worker/step_code_rows.py``) instead of vLLM-Omni's payload dict per request; on unless
    set to 0 (the A/B switch: the builder's dicts were 12.5% of Stage 0's main thread at 256 streams, 0.7% with it)."""
    return on_unless_off(KANI_STEP_CODE_ROWS)


KANI_FAST_DECODE_SLOTS = "KANI_FAST_DECODE_SLOTS"


def fast_decode_slots() -> bool:
    """``KANI_FAST_DECODE_SLOTS``: Stage 0's decode steps skip vLLM's slot allocation where a request's KV blocks
    already hold the new token (``core/sched/decode_slots.py``); on unless set to 0 (the A/B switch)."""
    return on_unless_off(KANI_FAST_DECODE_SLOTS)


KANI_CODEC_ASYNC_COPY = "KANI_CODEC_ASYNC_COPY"


def codec_async_copy() -> bool:
    """``KANI_CODEC_ASYNC_COPY``: a CUDA codec stage under vLLM's async scheduling copies each step's audio to pinned
    host memory without waiting for the decode (``codec_stage.audio_to_host``), so the step loop schedules and launches
    the next step while this one runs; on unless set to 0 (the A/B switch: the blocking copy was 66–83% of the codec's
    main thread at 256 streams on an H200; without it 5 of 6 served pairs gained, thirty-first set)."""
    return on_unless_off(KANI_CODEC_ASYNC_COPY)


KANI_CONCURRENT_WARM_UPS = "KANI_CONCURRENT_WARM_UPS"


def concurrent_warm_ups() -> bool:
    """On unless ``KANI_CONCURRENT_WARM_UPS=0``: Stage 0's load-time warm-ups (each a Triton compile on a machine that
    has not compiled it yet) run in threads at once instead of one after another (``kani_tts/warm_ups.py``). A fresh
    H200 engine's model load took 32.7 s with it against 77.9 s (docs/BENCHMARKS.md, forty-seventh set), and the CUDA
    test that no sampled step compiles after the warm-ups passed both ways (forty-eighth set)."""
    return on_unless_off(KANI_CONCURRENT_WARM_UPS)


KANI_INDUCTOR_SAVED_PICKS = "KANI_INDUCTOR_SAVED_PICKS"


def inductor_saved_picks() -> bool:
    """On unless ``KANI_INDUCTOR_SAVED_PICKS=0``: an Inductor kernel that still holds several launch configs at its
    first launch runs the pick its compile saved, instead of timing them again (``inductor_patch.py``), so the engine
    that compiled a graph runs the same reductions as the engines that load it. On an H200, a fresh compile and a load
    of it then gave identical greedy codes, and two servers from empty caches passed the e2e check
    (forty-eighth set)."""
    return on_unless_off(KANI_INDUCTOR_SAVED_PICKS)
