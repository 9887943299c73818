"""Preflight on one host: its facts in one probe, and the verdict on them; on several hosts,
the hosts side by side (:mod:`opsbook.steps.host_compare`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from opsbook.core.deployment import Deployment
from opsbook.core.results import State
from opsbook.knowledge.logscan import failure_for
from opsbook.remote.protocol import RemoteHost
from opsbook.stages.base import Note, Report, Together, concurrently
from opsbook.steps import host_facts, host_side, plots
from opsbook.steps.host_compare import Comparison, HostSide, compare


@dataclass(frozen=True)
class Options:
    """Preflight's options: none of its own (it reads the host and changes nothing)."""


@dataclass(kw_only=True)
class SidedReport(Report):
    """A report with what the host shows of the facts hosts serving one model should share
    (None: not read), for the stage's look across its hosts."""

    side: HostSide | None = None


@dataclass(kw_only=True)
class PreflightReport(SidedReport):
    """Preflight's report, with the host's facts (a cluster's preflight compares its nodes')."""

    facts: host_facts.HostFacts


def run(host: RemoteHost, deployment: Deployment, options: Options) -> PreflightReport:
    """Gather the host's facts (GPUs, processes, driver, interconnect, python, vLLM, disk,
    ports, servers) and judge them; changes nothing."""
    found, answer = concurrently(
        lambda: host_facts.gather_facts(host, deployment),
        lambda: host_side.read_side(host, deployment),
    )
    verdict = host_facts.check_facts(found)
    shows = [
        Note(f"{len(found.gpus)} GPU(s); interconnect: {found.topology.interconnect}"),
        host_facts.summary_table(found),
        host_facts.gpu_table(found),
        plots.gpu_memory(found.gpus, found.processes),
        host_facts.process_table(found),
        host_facts.server_table(found),
    ]
    side = host_side.side_of(host.name, deployment, found, answer)
    state = State.OK if verdict.ok else State.FAILED
    return PreflightReport(state, verdict, shows, facts=found, side=side)


def side_by_side(
    hosts: Sequence[RemoteHost], deployment: Deployment, reports: dict[str, Report]
) -> Together:
    """The hosts' facts compared (a cluster's nodes' read again where its check dropped
    them), each host's report with the differences it takes part in."""
    return compared(hosts, deployment, reports)


def compared(
    hosts: Sequence[RemoteHost], deployment: Deployment, reports: dict[str, Report]
) -> Together:
    """The hosts side by side from the sides their reports carry; on a cluster (whose nodes
    are still open) a node whose report carries none is read now."""
    sides = {name: r.side for name, r in reports.items() if isinstance(r, SidedReport) and r.side}
    missing = [h for h in hosts if h.name in reports and h.name not in sides]
    if deployment.cluster is not None and missing:
        sides.update(read_sides(missing, deployment))
    ordered = [sides[h.name] for h in hosts if h.name in sides]
    comparison = compare(ordered, cluster=deployment.cluster is not None)
    amended = {name: noted(report, comparison, name) for name, report in reports.items()}
    return Together(amended, comparison)


def read_sides(hosts: Sequence[RemoteHost], deployment: Deployment) -> dict[str, HostSide]:
    """Each host's side, the hosts at once (the facts a comparison needs, not a preflight)."""

    def one(host: RemoteHost) -> HostSide:
        view = deployment.for_host(host.spec)
        found, answer = concurrently(
            lambda: host_side.facts_for_side(host, view),
            lambda: host_side.read_side(host, view),
        )
        return host_side.side_of(host.name, view, found, answer)

    with ThreadPoolExecutor(max_workers=len(hosts)) as pool:
        return dict(zip((h.name for h in hosts), pool.map(one, hosts), strict=True))


def noted(report: Report, comparison: Comparison, host: str) -> Report:
    """``report`` with its row of the table (an info finding, kept in the record) and the
    differences ``host`` takes part in: their findings (a check that named a fact already
    keeps its own), its message saying so, and failed when one is an error (a cluster's nodes
    on other versions: Ray refuses them)."""
    named = {f.subject for f in report.verdict.findings if f.is_problem}
    findings = [f for f in comparison.findings_for(host) if f.subject not in named]
    row = comparison.row_finding(host)
    if row is None:
        return report
    if not findings:
        verdict = dataclasses.replace(report.verdict, findings=[*report.verdict.findings, row])
        return dataclasses.replace(report, verdict=verdict)
    problem = any(f.is_problem for f in findings)
    verdict = dataclasses.replace(
        report.verdict,
        ok=report.verdict.ok and not problem,
        message=f"{report.verdict.message}; {comparison.line_for(host)}",
        findings=[*report.verdict.findings, *findings, row],
    )
    if not problem:
        return dataclasses.replace(report, verdict=verdict)
    ray = any(f.subject == "Ray" for f in findings)
    failure = report.failure_id or (failure_for("ray-versions-differ") if ray else "")
    return dataclasses.replace(report, state=State.FAILED, verdict=verdict, failure_id=failure)
