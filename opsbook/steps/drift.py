"""Drift: what moved on a host since its last good run (:mod:`opsbook.steps.last_good`), as
preflight sees it live. Each fact that moved is a warning naming old and new, with what to do:
a driver that unattended upgrades moved under a host, an engine upgraded beside the runbook.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

from opsbook.core.deployment import Deployment
from opsbook.core.exceptions import HostUnreachable, OpsbookError
from opsbook.core.facts_schema import HostRunFacts, ModelFacts
from opsbook.core.results import Finding, Result, Table
from opsbook.remote.protocol import RemoteHost
from opsbook.steps import host_side, last_good, record_facts, shard_check
from opsbook.steps.host_facts import HostFacts
from opsbook.steps.last_good import GoodRun

V = TypeVar("V", bound=Result)

# Requalifying (06_qualify), or marking a ready deploy good, moves last good to the new facts.
REQUALIFY = (
    "qualify the host again (06_qualify), or mark a ready deploy good with "
    "`opsbook records mark-good RUN`"
)


@dataclass(frozen=True)
class Watched:
    """A fact drift watches: where it is in the facts, and what to do when it moved."""

    name: str
    section: str
    key: str
    remedy: str


WATCHED = (
    Watched(
        "driver",
        "fingerprint",
        "driver",
        "a driver moved under a running host (unattended upgrades?): hold the package "
        "(apt-mark hold) and reboot into one driver, then " + REQUALIFY,
    ),
    Watched("CUDA", "fingerprint", "cuda", "the driver's CUDA moved with it: " + REQUALIFY),
    Watched(
        "kernel",
        "fingerprint",
        "kernel",
        "the kernel changed (the driver's module is "
        "rebuilt for it): check nvidia-smi answers, then " + REQUALIFY,
    ),
    Watched(
        "GPUs",
        "fingerprint",
        "gpus",
        "the GPUs seen changed: check nvidia-smi -L for a fallen-off GPU before a launch",
    ),
    Watched(
        "vLLM",
        "engine",
        "vllm",
        "vLLM changed beside the runbook: pin the version that was good, or " + REQUALIFY,
    ),
    Watched(
        "torch",
        "engine",
        "torch",
        "torch changed: a torch/CUDA wheel skew breaks vLLM's "
        "kernels; reinstall the pair that was good, or " + REQUALIFY,
    ),
    Watched(
        "model manifest",
        "model",
        "manifest_digest",
        "the checkpoint's shards changed: run 01_download_check, and " + REQUALIFY,
    ),
)
DRIFT_CODE = "drift-since-last-good"


def moved(live: HostRunFacts, good: HostRunFacts) -> list[tuple[Watched, str, str]]:
    """The watched facts whose live value is known and differs from the good run's."""
    found = []
    for watched in WATCHED:
        now = _value(live, watched)
        then = _value(good, watched)
        if now is not None and then is not None and now != then:
            found.append((watched, then, now))
    return found


def _value(facts: HostRunFacts, watched: Watched) -> str | None:
    value = getattr(getattr(facts, watched.section), watched.key)
    if value in (None, [], ""):
        return None
    return ", ".join(value) if isinstance(value, list) else str(value)


def drift_findings(live: HostRunFacts, good: GoodRun | None) -> list[Finding]:
    """A warning per fact that moved since last good; an info line naming the run compared
    with (none when the host has no last good: nothing to compare)."""
    if good is None:
        return []
    source = f"run {good.run} ({good.why})"
    changes = moved(live, good.facts)
    found = [
        Finding(
            "warning",
            watched.name,
            f"{watched.name} moved since last good: {then} -> {now}",
            watched.remedy,
            source,
            DRIFT_CODE,
        )
        for watched, then, now in changes
    ]
    if not found:
        found.append(Finding("info", "last good", f"nothing moved since last good ({source})"))
    return found


def since_last_good(host: RemoteHost, deployment: Deployment, found: HostFacts) -> list[Finding]:
    """Preflight's drift findings for a host: its live facts against its last good run of the
    deployment in the runs folder of this run (none outside a run, or without a last good).

    With a last good only, it reads what preflight's probe does not: torch (the deployment's
    python, one command) and, when the good run knew it, the shard manifest (01's probe)."""
    runs_dir = last_good.runs_dir_of_run()
    if runs_dir is None or not runs_dir.is_dir():
        return []
    good = last_good.last_good_for(runs_dir, deployment.source, host.name)
    if good is None:
        return []
    return drift_findings(live_facts(host, deployment, found, good), good)


def live_facts(
    host: RemoteHost, deployment: Deployment, found: HostFacts, good: GoodRun
) -> HostRunFacts:
    """The host's facts now, as far as drift compares them with ``good``."""
    answer = host_side.read_side(host, deployment)
    engine = record_facts.engine_section(found)
    if not answer.error:
        engine = engine.model_copy(update={"torch": answer.versions.get("torch")})
    model = ModelFacts()
    if good.facts.model.manifest_digest:
        try:
            check = shard_check.check_download(host, deployment.model_path)
        except HostUnreachable:
            raise
        except OpsbookError:
            check = None  # unknown now: not a difference
        if check is not None and check.shards:
            model = record_facts.model_section(deployment, check)
    return HostRunFacts(
        fingerprint=record_facts.fingerprint_section(found), engine=engine, model=model
    )


def noted(verdict: V, moved: Sequence[Finding]) -> V:
    """``verdict`` with its message naming what moved since last good."""
    names = [f.subject for f in moved if f.code == DRIFT_CODE]
    if not names:
        return verdict
    return dataclasses.replace(
        verdict, message=f"{verdict.message}; moved since last good: {', '.join(names)}"
    )


def tables(moved: Sequence[Finding]) -> list[Table]:
    """What a notebook shows of drift: a table of what moved (none when nothing did)."""
    rows = [
        [f.subject, f.message.split(": ", 1)[-1], f.source, f.remedy]
        for f in moved
        if f.code == DRIFT_CODE
    ]
    if not rows:
        return []
    return [Table(["moved since last good", "then -> now", "last good", "remedy"], rows)]
