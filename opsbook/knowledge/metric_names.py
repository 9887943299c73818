"""Which ``/metrics`` names a vLLM release exports, and what a dashboard loses in an upgrade.

The names come from each release's source (``tools/vllm_facts.py``, the ``metrics`` section of
``data/vllm_facts/<version>.json``); this module only says which of them stands for what
opsbook reads (requests running, generation tokens...), newest name first.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from opsbook.knowledge import vllm_facts

# What opsbook reads -> the metric names vLLM gave it, newest first. The renames are the
# releases' own: 0.10.2 vllm/v1/metrics/loggers.py documents vllm:gpu_cache_usage_perc as
# "DEPRECATED: Use vllm:kv_cache_usage_perc" and vllm:time_per_output_token_seconds as
# deprecated for vllm:inter_token_latency_seconds; both are hidden from 0.11.2 on.
ROLES: dict[str, tuple[str, ...]] = {
    "running": ("vllm:num_requests_running",),
    "waiting": ("vllm:num_requests_waiting",),
    "kv_cache_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    "prompt_tokens": ("vllm:prompt_tokens",),
    "generation_tokens": ("vllm:generation_tokens",),
    "preemptions": ("vllm:num_preemptions",),
    "requests_succeeded": ("vllm:request_success",),
    "time_to_first_token": ("vllm:time_to_first_token_seconds",),
    "time_per_output_token": (
        "vllm:request_time_per_output_token_seconds",
        "vllm:time_per_output_token_seconds",
    ),
    "inter_token_latency": (
        "vllm:inter_token_latency_seconds",
        "vllm:time_per_output_token_seconds",
    ),
    "e2e_latency": ("vllm:e2e_request_latency_seconds",),
}


@dataclass(frozen=True)
class MetricNames:
    """The names opsbook reads in ``/metrics``: a gauge's or counter's sample name (a counter's
    carries ``_total``), a histogram's family name.

    Defaults: vLLM 0.32.0 ``vllm/v1/metrics/loggers.py`` (``PrometheusStatLogger``);
    :func:`for_release` gives another release's.
    """

    running: str = "vllm:num_requests_running"
    waiting: str = "vllm:num_requests_waiting"
    kv_cache_usage: str = "vllm:kv_cache_usage_perc"
    prompt_tokens: str = "vllm:prompt_tokens_total"
    generation_tokens: str = "vllm:generation_tokens_total"
    preemptions: str = "vllm:num_preemptions_total"
    requests_succeeded: str = "vllm:request_success_total"
    time_to_first_token: str = "vllm:time_to_first_token_seconds"
    time_per_output_token: str = "vllm:request_time_per_output_token_seconds"
    inter_token_latency: str = "vllm:inter_token_latency_seconds"
    e2e_latency: str = "vllm:e2e_request_latency_seconds"
    release: str | None = None


@dataclass(frozen=True)
class LostMetric:
    """A metric an older release exports and a newer one does not (by default)."""

    name: str
    replacement: str | None
    hidden_in_new: bool

    def __str__(self) -> str:
        gone = "hidden (--show-hidden-metrics-for-version)" if self.hidden_in_new else "removed"
        instead = f"; use {self.replacement}" if self.replacement else ""
        return f"{self.name}: {gone}{instead}"


def for_release(version: str | None) -> MetricNames:
    """The names of the nearest release with facts at or below ``version`` (the 0.32.0 defaults
    when the version is unknown).

    Raises:
        OpsbookError: ``version`` is older than every release with facts.
    """
    if not version:
        return MetricNames()
    facts = vllm_facts.for_version(version)
    exported = facts.exported_metrics()
    if not exported:
        return MetricNames(release=facts.version)
    chosen: dict[str, str] = {}
    for role, candidates in ROLES.items():
        name = next((n for n in candidates if n in exported), None)
        if name is not None:
            chosen[role] = read_name(exported[name])
    return MetricNames(release=facts.version, **chosen)


def read_name(fact: vllm_facts.MetricFact) -> str:
    """The name opsbook asks a snapshot for: a histogram's family, else its one sample."""
    return fact.name if fact.kind == "histogram" else fact.samples[0]


def lost_in_upgrade(old: str, new: str) -> list[LostMetric]:
    """The metrics ``/metrics`` of ``old`` shows that ``new``'s no longer shows by default,
    each with the name to query instead when vLLM names one (its deprecation text) or when
    another name of the same role is exported.

    Raises:
        OpsbookError: a version older than every release with facts.
    """
    before = vllm_facts.for_version(old)
    after = vllm_facts.for_version(new)
    kept = after.exported_metrics()
    lost = []
    for name, fact in sorted(before.exported_metrics().items()):
        if name in kept:
            continue
        hidden = after.metrics.get(name)
        replacement = fact.deprecated_for or (hidden.deprecated_for if hidden else None)
        replacement = replacement or _same_role(name, kept)
        lost.append(LostMetric(name, replacement, hidden_in_new=hidden is not None))
    return lost


def _same_role(name: str, kept: dict[str, vllm_facts.MetricFact]) -> str | None:
    for candidates in ROLES.values():
        if name in candidates:
            return next((n for n in candidates if n in kept and n != name), None)
    return None


def roles() -> tuple[str, ...]:
    """What opsbook reads, in :class:`MetricNames`'s order."""
    return tuple(f.name for f in fields(MetricNames) if f.name != "release")


def as_dict(names: MetricNames) -> dict[str, str]:
    """Each figure opsbook reads -> its name (what the simulator's facts sheet holds)."""
    return {role: getattr(names, role) for role in roles()}
