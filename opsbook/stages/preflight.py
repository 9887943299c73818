"""Preflight on one host: its facts in one probe, and the verdict on them; on several hosts,
the hosts side by side (:mod:`opsbook.steps.host_compare`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from opsbook.core.deployment import Deployment
from opsbook.core.exceptions import OpsbookError
from opsbook.core.results import State
from opsbook.knowledge.logscan import failure_for
from opsbook.remote.hosts import DEFAULT_FORKS
from opsbook.remote.protocol import RemoteHost
from opsbook.stages.base import Note, Report, Together, concurrently, hook
from opsbook.steps import drift, host_facts, host_side, plots, record_facts, start_checks
from opsbook.steps.host_compare import Comparison, HostSide, compare


@dataclass(frozen=True)
class Options:
    """Preflight's options: none a notebook sets (it reads the host and changes nothing).

    Args:
        readings: a deploy run's readings, where the host's full reading is kept for the
            run's later stages (set by :func:`opsbook.stages.base.run_stage` in the run's
            shared kernel).
    """

    readings: host_facts.RunReadings | None = hook()


@dataclass(kw_only=True)
class PreflightReport(Report):
    """Preflight's report, with the host's facts (a cluster's preflight compares its nodes')."""

    facts: host_facts.HostFacts


def run(host: RemoteHost, deployment: Deployment, options: Options) -> PreflightReport:
    """Gather the host's facts (GPUs, processes, driver, interconnect, python, vLLM, disk,
    ports, servers) and judge them; changes nothing."""
    found = host_facts.gather_facts(host, deployment, readings=options.readings)
    record_facts.note_preflight(host.name, found)
    moved = drift.since_last_good(host, deployment, found)
    verdict = host_facts.check_facts(found, [*start_checks.gpu_findings(found, deployment), *moved])
    verdict = drift.noted(verdict, moved)
    shows = [
        Note(f"{len(found.gpus)} GPU(s); interconnect: {found.topology.interconnect}"),
        host_facts.summary_table(found),
        host_facts.gpu_table(found),
        plots.gpu_memory(found.gpus, found.processes),
        host_facts.process_table(found),
        host_facts.server_table(found),
        *drift.tables(moved),
    ]
    return PreflightReport(State.OK if verdict.ok else State.FAILED, verdict, shows, facts=found)


def side_by_side(
    hosts: Sequence[RemoteHost], deployment: Deployment, reports: dict[str, Report]
) -> Together:
    """The hosts side by side once each has its preflight: what the comparison needs beyond
    its facts read from each (one command), each host's report with its row and the
    differences it takes part in."""
    return compared(hosts, deployment, reports, predict=True)


def compared(
    hosts: Sequence[RemoteHost],
    deployment: Deployment,
    reports: dict[str, Report],
    *,
    predict: bool,
) -> Together:
    """The hosts that answered their stage read (at once) and compared; each one's report
    amended (:func:`noted`). ``predict``: where a host's log names no KV-cache dtype and
    attention backend, compare what vLLM is predicted to choose (else they are unknown)."""
    answered = [
        h for h in hosts if h.name in reports and reports[h.name].state is not State.UNREACHABLE
    ]
    found = read_sides(answered, deployment, reports, predict=predict)
    ordered = [found[h.name] for h in answered if h.name in found]
    comparison = compare(ordered, cluster=deployment.cluster is not None)
    amended = {name: noted(report, comparison, name) for name, report in reports.items()}
    return Together(amended, comparison)


def read_sides(
    hosts: Sequence[RemoteHost],
    deployment: Deployment,
    reports: Mapping[str, Report],
    *,
    predict: bool,
) -> dict[str, HostSide]:
    """Each host's side, the hosts at once: the facts its preflight gathered (else the facts
    probe's light part) and the deployment's python's answer. A host that cannot be read
    now is left out. Each host's connection is closed again (kept in a deploy)."""

    def one(host: RemoteHost) -> HostSide | None:
        view = deployment.for_host(host.spec)
        report = reports.get(host.name)
        known = report.facts if isinstance(report, PreflightReport) else None
        try:
            found, answer = concurrently(
                lambda: known or host_side.facts_for_side(host, view),
                lambda: host_side.read_side(host, view),
            )
        except OpsbookError:
            return None
        finally:
            host.close()
        return host_side.side_of(host.name, view, found, answer, predict=predict)

    if not hosts:
        return {}
    with ThreadPoolExecutor(max_workers=min(len(hosts), DEFAULT_FORKS)) as pool:
        sides = dict(zip((h.name for h in hosts), pool.map(one, hosts), strict=True))
    return {name: side for name, side in sides.items() if side is not None}


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
