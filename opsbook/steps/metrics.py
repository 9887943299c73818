"""The server's ``/metrics``: read from the host, parsed with prometheus_client's text parser.

A snapshot holds every sample summed over its labels (one engine or several, any model name)
and every histogram's cumulative buckets, so that later readers ask by name: the names vLLM
uses are in :class:`MetricNames`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from opsbook.core.exceptions import ProbeError
from opsbook.remote.protocol import RemoteHost
from opsbook.steps.server import http_get

METRICS_TIMEOUT = 10.0


@dataclass(frozen=True)
class MetricNames:
    """The sample names a vLLM release exports.

    Defaults: vLLM 0.32.0 ``vllm/v1/metrics/loggers.py`` (``PrometheusStatLogger``); a counter's
    sample carries the ``_total`` suffix prometheus_client adds.
    """

    running: str = "vllm:num_requests_running"
    waiting: str = "vllm:num_requests_waiting"
    kv_cache_usage: str = "vllm:kv_cache_usage_perc"
    prompt_tokens: str = "vllm:prompt_tokens_total"
    generation_tokens: str = "vllm:generation_tokens_total"
    preemptions: str = "vllm:num_preemptions_total"
    requests_succeeded: str = "vllm:request_success_total"
    time_to_first_token: str = "vllm:time_to_first_token_seconds"
    inter_token_latency: str = "vllm:inter_token_latency_seconds"
    e2e_latency: str = "vllm:e2e_request_latency_seconds"


@dataclass(frozen=True)
class Histogram:
    """One histogram, summed over labels: cumulative counts by upper bound, sum and count."""

    buckets: tuple[tuple[float, float], ...]
    total: float = 0.0
    count: float = 0.0

    def quantile(self, q: float) -> float | None:
        """The ``q`` quantile by linear interpolation inside its bucket, as Prometheus's
        ``histogram_quantile`` does; None without observations."""
        if not self.buckets or self.count <= 0:
            return None
        rank = q * self.buckets[-1][1]
        lower_bound, lower_count = 0.0, 0.0
        for bound, cumulative in self.buckets:
            if cumulative >= rank:
                if math.isinf(bound):
                    return lower_bound
                width = cumulative - lower_count
                share = (rank - lower_count) / width if width else 1.0
                return lower_bound + (bound - lower_bound) * share
            lower_bound, lower_count = bound, cumulative
        return lower_bound

    def minus(self, earlier: Histogram) -> Histogram:
        """The observations made since ``earlier`` (a snapshot of the same histogram)."""
        before = dict(earlier.buckets)
        buckets = tuple((b, c - before.get(b, 0.0)) for b, c in self.buckets)
        return Histogram(buckets, self.total - earlier.total, self.count - earlier.count)


@dataclass(frozen=True)
class MetricsSnapshot:
    """``/metrics`` at one moment."""

    taken_at: float
    samples: Mapping[str, float] = field(default_factory=dict)
    histograms: Mapping[str, Histogram] = field(default_factory=dict)
    names: MetricNames = field(default_factory=MetricNames)

    def value(self, name: str) -> float | None:
        """A sample's value summed over its labels; None when the server does not export it."""
        return self.samples.get(name)

    @property
    def running(self) -> float | None:
        return self.value(self.names.running)

    @property
    def waiting(self) -> float | None:
        return self.value(self.names.waiting)

    @property
    def generation_tokens(self) -> float | None:
        return self.value(self.names.generation_tokens)

    @property
    def prompt_tokens(self) -> float | None:
        return self.value(self.names.prompt_tokens)

    @property
    def preemptions(self) -> float | None:
        return self.value(self.names.preemptions)

    @property
    def kv_cache_usage(self) -> float | None:
        return self.value(self.names.kv_cache_usage)

    @property
    def idle(self) -> bool:
        """No request running or waiting (a missing gauge counts as none)."""
        return not (self.running or 0) and not (self.waiting or 0)


def parse_metrics(
    text: str, *, names: MetricNames | None = None, taken_at: float | None = None
) -> MetricsSnapshot:
    """Parse Prometheus text exposition (what vLLM's ``/metrics`` answers).

    Raises:
        ValueError: the text is not Prometheus exposition format.
    """
    samples: dict[str, float] = {}
    buckets: dict[str, dict[float, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if family.type == "histogram" and sample.name.endswith("_bucket"):
                bound = float(sample.labels.get("le", "+Inf"))
                counts = buckets.setdefault(family.name, {})
                counts[bound] = counts.get(bound, 0.0) + sample.value
            else:
                samples[sample.name] = samples.get(sample.name, 0.0) + sample.value
    histograms = {
        name: Histogram(
            tuple(sorted(counts.items())),
            samples.get(f"{name}_sum", 0.0),
            samples.get(f"{name}_count", 0.0),
        )
        for name, counts in buckets.items()
    }
    return MetricsSnapshot(
        taken_at=time.time() if taken_at is None else taken_at,
        samples=samples,
        histograms=histograms,
        names=names or MetricNames(),
    )


def read_metrics(
    host: RemoteHost,
    port: int,
    *,
    api_key: str | None = None,
    names: MetricNames | None = None,
    timeout: float = METRICS_TIMEOUT,
) -> MetricsSnapshot:
    """GET ``/metrics`` from the host itself and parse it.

    Raises:
        ProbeError: nothing answered, the answer was not 200, or not Prometheus text.
    """
    answer = http_get(host, port, "/metrics", timeout=timeout, api_key=api_key)
    if answer.status != 200:
        detail = answer.error or f"HTTP {answer.status}"
        raise ProbeError(
            f"/metrics on port {port} did not answer: {detail}",
            host=host.name,
            remedy="check that the server is running (opsbook check) and the port is its own",
        )
    try:
        return parse_metrics(answer.body, names=names)
    except ValueError as error:
        raise ProbeError(
            f"/metrics on port {port} is not Prometheus text: {error}",
            host=host.name,
            remedy="the port may belong to another program than vLLM: check server.port",
        ) from error
