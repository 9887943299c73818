"""Diagnose on one host: the server's state (never started, crashed, loading, ready, hung)
and, from its log, the known failure with its remedy; changes nothing."""

from __future__ import annotations

from opsbook.core.deployment import Deployment
from opsbook.core.results import State
from opsbook.remote.protocol import RemoteHost
from opsbook.stages.base import Note, Report
from opsbook.steps import server, triage


def run(host: RemoteHost, deployment: Deployment, *, log_when_ready: bool = True) -> Report:
    """Classify the server: ok when ready or loading, failed otherwise (with the failure id
    the log shows). Without ``log_when_ready`` a server that answers ``/health`` is ready
    without its log being read (the scheduled check; the notebook shows its startup)."""
    paths = server.resolve_paths(host, deployment)
    state = triage.server_state(
        host,
        paths,
        deployment.server_port,
        notes=(server.RUNNING_SCRIPT,),
        log_when_ready=log_when_ready,
    )
    digest = server.noted_running_script(host, paths, state.notes) if state.ok else ""
    verdict = state.to_result()
    shows: list[object] = [Note(f"{state.state}: {state.message}")]
    if state.diagnosis is not None:
        shows.append(state.diagnosis)
    shows.append(state.processes_table())
    failure = state.diagnosis.failure or "" if state.diagnosis is not None else ""
    return Report(State.OK if state.ok else State.FAILED, verdict, shows, failure, digest)
