"""Diagnose on one host: the server's state (never started, crashed, loading, ready, hung)
and, from its log, the known failure with its remedy; changes nothing. A ready server's
``/metrics`` is watched: requests in flight without a token for a while is hung, /health 200
or not; its summary goes in the record. On several hosts, the hosts side by side (what their
engines run with, from their logs), so that a host changed since the deploy stands out."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from opsbook.core.deployment import Deployment
from opsbook.core.results import Finding, State
from opsbook.remote.protocol import RemoteHost
from opsbook.stages import preflight
from opsbook.stages.base import Note, Report, Together, hook
from opsbook.steps import last_good, metrics, restart_rule, script, server, triage


@dataclass(frozen=True)
class Options:
    """Diagnose's options: none a notebook sets.

    Args:
        log_when_ready: read the log of a server that answers ``/health`` too (the notebook
            shows its startup); False: it is ready without (the scheduled check's hook).
    """

    log_when_ready: bool = hook(True)


def run(host: RemoteHost, deployment: Deployment, options: Options) -> Report:
    """Classify the server: ok when ready or loading, failed otherwise (with the failure id
    the log shows)."""
    paths = server.resolve_paths(host, deployment)
    state = triage.server_state(
        host,
        paths,
        deployment.server_port,
        notes=(server.RUNNING_SCRIPT,),
        log_when_ready=options.log_when_ready,
        inputs=triage.deploy_inputs(restart_rule.run_inputs(deployment, paths)),
        last_deploy=True,
        watch_metrics=True,
        api_key=script.server_api_key(deployment),
    )
    digest = server.noted_running_script(host, paths, state.notes) if state.ok else ""
    verdict = state.to_result()
    shows: list[object] = [Note(f"{state.state}: {state.message}")]
    if state.diagnosis is not None:
        shows.append(state.diagnosis)
    shows.append(state.processes_table())
    if state.generation is not None:
        shows.append(Note(f"/metrics: {state.generation.message}"))
    shows.append(_summary_at_end(state))
    failure = state.diagnosis.failure or "" if state.diagnosis is not None else ""
    since = "" if state.ok else last_good.since_last_good_here(deployment, host.name)
    if since:
        shows.insert(1, Note(since))
        finding = Finding("info", "since last good", since.split(": ", 1)[-1])
        verdict = dataclasses.replace(verdict, findings=[*verdict.findings, finding])
    return Report(State.OK if state.ok else State.FAILED, verdict, shows, failure, digest)


def _summary_at_end(state: triage.ServerState) -> metrics.MetricsSummary:
    """The record's summary at the end of the diagnosis: the server's state, when it became
    ready (seconds since the epoch, for the textfile's time since ready), and its /metrics
    figures when they were read."""
    figures: dict[str, object] = {"server_state": state.state, "ready_at": _ready_at(state)}
    if state.generation is not None:
        figures.update(metrics.summarize(state.generation.last))
    return metrics.MetricsSummary("end", figures)


def _ready_at(state: triage.ServerState) -> float | None:
    """When the server answered ready: its launch's start plus the log's time from the first
    phase to "ready"; None when it is not serving or the log was not read."""
    if state.state not in ("ready", "hung") or state.started_at is None:
        return None
    phases = state.diagnosis.phases if state.diagnosis is not None else []
    stamped = {p.name: p.timestamp for p in phases if p.timestamp is not None}
    first = next(iter(stamped.values()), None)
    ready = stamped.get("ready")
    if first is None or ready is None:
        return None
    return round(state.started_at + (ready - first).total_seconds(), 1)


def side_by_side(
    hosts: Sequence[RemoteHost], deployment: Deployment, reports: dict[str, Report]
) -> Together:
    """The hosts compared as they run now, each read once all are diagnosed (what its
    server's log says the engine runs with): a host upgraded since the deploy is named."""
    return preflight.compared(hosts, deployment, reports, predict=False)


def nodes_side_by_side(
    hosts: Sequence[RemoteHost], deployment: Deployment, reports: dict[str, Report]
) -> Together:
    """A cluster's launch: its nodes read and compared again once they joined."""
    return preflight.compared(hosts, deployment, reports, predict=False)
