"""The server's ``/metrics``: read from the host, parsed with prometheus_client's text parser.

A snapshot holds every sample summed over its labels (one engine or several, any model name)
and every histogram's cumulative buckets, so that later readers ask by name: the names vLLM
uses are in :class:`~opsbook.knowledge.metric_names.MetricNames`, per release.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from opsbook.core.exceptions import OpsbookError, ProbeError
from opsbook.core.results import Table
from opsbook.knowledge import metric_names
from opsbook.knowledge.metric_names import MetricNames
from opsbook.remote.protocol import RemoteHost
from opsbook.steps.server import http_get

METRICS_TIMEOUT = 10.0


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


def names_for(version: str | None) -> MetricNames:
    """The names of ``version`` (the release a server's log names); 0.32.0's when it is
    unknown or older than every release read."""
    try:
        return metric_names.for_release(version)
    except OpsbookError:
        return MetricNames()


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


# The percentiles a summary gives of each latency histogram.
PERCENTILES = (0.5, 0.9, 0.99)


def summarize(snapshot: MetricsSnapshot) -> dict[str, Any]:
    """What a record keeps of a snapshot: KV cache use, requests running and waiting,
    preemptions, tokens, and TTFT / TPOT / end-to-end percentiles (seconds); None for what the
    server does not export."""
    names = snapshot.names
    summary: dict[str, Any] = {
        "release": names.release,
        "kv_cache_usage": snapshot.kv_cache_usage,
        "running": snapshot.running,
        "waiting": snapshot.waiting,
        "preemptions": snapshot.preemptions,
        "prompt_tokens": snapshot.prompt_tokens,
        "generation_tokens": snapshot.generation_tokens,
        "requests_succeeded": snapshot.value(names.requests_succeeded),
    }
    for label, name in (
        ("ttft", names.time_to_first_token),
        ("tpot", names.time_per_output_token),
        ("e2e", names.e2e_latency),
    ):
        histogram = snapshot.histograms.get(name)
        for q in PERCENTILES:
            value = histogram.quantile(q) if histogram is not None else None
            summary[f"{label}_p{round(q * 100)}_s"] = None if value is None else round(value, 4)
    return summary


# Verdicts of a watch of the generation counter.
HUNG = "hung"
IDLE = "idle"
GENERATING = "generating"
# Seconds the counters must stay still, with requests running or waiting, for "hung": long
# past a decode step or a prefill chunk of any model opsbook deploys, short enough that a
# stopped engine core is named within 30 s of a diagnose's start.
STALL_SECONDS = 15.0
# Seconds between two reads of /metrics while watching.
WATCH_INTERVAL = 1.0


@dataclass(frozen=True)
class GenerationWatch:
    """What the token counters did while requests were in flight.

    Attributes:
        verdict: :data:`HUNG` (requests in flight, no token for ``seconds``), :data:`IDLE`
            (no request) or :data:`GENERATING`.
        first: the first snapshot; last: the last one read.
        seconds: how long the watch took.
    """

    verdict: str
    first: MetricsSnapshot
    last: MetricsSnapshot
    seconds: float

    @property
    def message(self) -> str:
        last = self.last
        if self.verdict == HUNG:
            return (
                f"{_count(last.running)} request(s) running and {_count(last.waiting)} waiting, "
                f"but {last.names.generation_tokens} stayed at {_count(last.generation_tokens)} "
                f"for {self.seconds:g} s: the engine produces no token while /health answers "
                "(a stopped or wedged engine core)"
            )
        if self.verdict == IDLE:
            return "no request running or waiting (idle)"
        gained = (last.generation_tokens or 0) - (self.first.generation_tokens or 0)
        return f"generating: {gained:g} token(s) in {self.seconds:g} s"


def watch_generation(
    host: RemoteHost,
    port: int,
    *,
    api_key: str | None = None,
    names: MetricNames | None = None,
    stall_seconds: float = STALL_SECONDS,
    interval: float = WATCH_INTERVAL,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> GenerationWatch:
    """Read ``/metrics`` until the counters move, the server is idle, or ``stall_seconds``
    pass with requests in flight and neither the generation nor the prompt token counter
    moved (a prefill in progress moves the prompt counter).

    Raises:
        ProbeError: ``/metrics`` did not answer.
    """
    started = clock()
    first = read_metrics(host, port, api_key=api_key, names=names)
    last = first
    while True:
        elapsed = round(clock() - started, 1)
        if last.idle:
            return GenerationWatch(IDLE, first, last, elapsed)
        if _progressed(first, last):
            return GenerationWatch(GENERATING, first, last, elapsed)
        if elapsed >= stall_seconds:
            return GenerationWatch(HUNG, first, last, elapsed)
        sleep(interval)
        last = read_metrics(host, port, api_key=api_key, names=names)


def _progressed(first: MetricsSnapshot, last: MetricsSnapshot) -> bool:
    return (last.generation_tokens or 0) > (first.generation_tokens or 0) or (
        last.prompt_tokens or 0
    ) > (first.prompt_tokens or 0)


def _count(value: float | None) -> str:
    return "?" if value is None else f"{value:g}"


class MetricsSummary(Table):
    """A ``/metrics`` summary a stage shows (figure, value), kept in the run record by the
    stage runner (``summary.json``'s ``metrics``).

    Args:
        moment: when it was read (``ready``, ``end``).
        summary: :func:`summarize`'s figures.
    """

    def __init__(self, moment: str, summary: dict[str, Any]):
        super().__init__(["figure", "value"], [[k, v] for k, v in summary.items()])
        self.moment = moment
        self.summary = summary


def summary_of(moment: str, snapshot: MetricsSnapshot) -> MetricsSummary:
    """The summary of ``snapshot`` read at ``moment``."""
    return MetricsSummary(moment, summarize(snapshot))
