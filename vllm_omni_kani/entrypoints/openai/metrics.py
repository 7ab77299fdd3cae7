"""Prometheus metrics of Kani speech serving, exposed on vLLM's ``/metrics`` next to ``vllm:*`` and ``vllm_omni:*``.

vLLM serves ``/metrics`` from ``vllm.v1.metrics.prometheus.get_prometheus_registry()``: prometheus_client's default
registry in a single API-server process, a multiprocess collector over ``PROMETHEUS_MULTIPROC_DIR`` otherwise.
Metrics created here register in the default registry, and prometheus_client writes their values to that directory
when it is set, so both layouts export them. They are created on first use (not at import) so the directory, when
vLLM sets one, is already in place.

The request gauges are kept by the admission controller itself, at admission and release, so they are exact at
every moment; vLLM's ``num_requests_running`` is only refreshed on engine steps and stays stale after an abort.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

PREFIX = "kani:speech_"

# Seconds from the request's arrival to its first audio from the engine (non-streaming: the whole audio, which is
# when such a client gets its first sample).
TTFA_BUCKETS = (0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 20.0, 60.0)
# Wall-clock seconds per second of audio (< 1: faster than real time).
RTF_BUCKETS = (0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0)

# Why a speech request was turned away (the label values of ``requests_rejected``).
REJECT_REASONS = ("overloaded", "duplicate_request_id", "invalid_request_id", "batch_too_large", "bad_request")
# How an admitted request ended (the label values of ``requests_finished``).
OUTCOMES = ("ok", "cancelled", "disconnected", "client_error", "server_error")


@dataclass(frozen=True)
class SpeechMetrics:
    ttfa: Histogram
    rtf: Histogram
    audio_seconds: Counter
    active: Gauge
    queued: Gauge
    limit: Gauge
    rejected: Counter
    finished: Counter


@functools.cache
def speech_metrics() -> SpeechMetrics:
    """The process's metric objects, registered once (in the registry vLLM's ``/metrics`` serves)."""
    metrics = SpeechMetrics(
        ttfa=Histogram(
            PREFIX + "time_to_first_audio_seconds",
            "Seconds from a speech request's arrival to its first audio from the engine (non-streaming: all of it).",
            ["stream"],
            buckets=TTFA_BUCKETS,
        ),
        rtf=Histogram(
            PREFIX + "real_time_factor",
            "Generation wall time divided by the duration of the audio, per completed speech request.",
            ["stream"],
            buckets=RTF_BUCKETS,
        ),
        audio_seconds=Counter(
            PREFIX + "audio_seconds",
            "Seconds of audio generated (at the codec's rate), including requests later cancelled.",
        ),
        active=Gauge(
            PREFIX + "requests_active",
            "Admitted speech requests not yet finished, queued ones included (a batch counts one per item).",
            multiprocess_mode="livesum",
        ),
        queued=Gauge(
            PREFIX + "requests_queued",
            "Admitted speech requests waiting for the engine: those beyond Stage 0's max_num_seqs.",
            multiprocess_mode="livesum",
        ),
        limit=Gauge(
            PREFIX + "max_concurrent_requests",
            "Admission limit: speech requests beyond it are answered 503 (0: no limit).",
            multiprocess_mode="max",
        ),
        rejected=Counter(PREFIX + "requests_rejected", "Speech requests turned away, by reason.", ["reason"]),
        finished=Counter(PREFIX + "requests_finished", "Admitted speech requests that ended, by outcome.", ["outcome"]),
    )
    for reason in REJECT_REASONS:
        metrics.rejected.labels(reason=reason)
    for outcome in OUTCOMES:
        metrics.finished.labels(outcome=outcome)
    return metrics


@dataclass
class SpeechTiming:
    """Time to first audio, real-time factor and audio seconds of one speech request.

    ``arrival`` is a ``time.perf_counter()`` value (the admission time when the request went through the speech
    middleware). Audio is counted in samples at the codec's rate, so resampled output does not skew the RTF.
    ``recorded`` False keeps a request out of the metrics (the start-up warm-up's, ``warmup.py``).
    """

    stream: bool
    sample_rate: int
    arrival: float = field(default_factory=time.perf_counter)
    recorded: bool = True
    samples: int = 0
    first_audio_s: float | None = None

    def audio(self, num_samples: int) -> bool:
        """Record ``num_samples`` new samples; returns True for the request's first audio."""
        if num_samples <= 0:
            return False
        self.samples += num_samples
        if self.recorded:
            speech_metrics().audio_seconds.inc(num_samples / self.sample_rate)
        if self.first_audio_s is not None:
            return False
        self.first_audio_s = time.perf_counter() - self.arrival
        if self.recorded:
            speech_metrics().ttfa.labels(stream=_label(self.stream)).observe(self.first_audio_s)
        return True

    def finish(self) -> float | None:
        """Record the RTF of a request that ran to its end; returns it (None without audio)."""
        if self.samples == 0:
            return None
        rtf = (time.perf_counter() - self.arrival) / (self.samples / self.sample_rate)
        if self.recorded:
            speech_metrics().rtf.labels(stream=_label(self.stream)).observe(rtf)
        return rtf


def _label(stream: bool) -> str:
    return "true" if stream else "false"


def sample_value(text: str, name: str, labels: dict[str, Any] | None = None) -> float | None:
    """The value of one sample in a Prometheus text exposition (for clients and tests); None when absent."""
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == str(v) for k, v in (labels or {}).items()):
                return sample.value
    return None
