"""Diagnose on one host: the server's state (never started, crashed, loading, ready, hung)
and, from its log, the known failure with its remedy; changes nothing."""

from __future__ import annotations

from opsbook import diagnose, launch
from opsbook.deployment import Deployment
from opsbook.hosts import Host
from opsbook.results import State
from opsbook.stages.base import Note, Report


def run(host: Host, deployment: Deployment, *, log_when_ready: bool = True) -> Report:
    """Classify the server: ok when ready or loading, failed otherwise (with the failure id
    the log shows). Without ``log_when_ready`` a server that answers ``/health`` is ready
    without its log being read (the scheduled check; the notebook shows its startup)."""
    paths = launch.resolve_paths(host, deployment)
    state = diagnose.server_state(
        host,
        paths,
        deployment.server_port,
        notes=(launch.RUNNING_SCRIPT,),
        log_when_ready=log_when_ready,
    )
    digest = launch.noted_running_script(host, paths, state.notes) if state.ok else ""
    verdict = state.to_result()
    shows: list[object] = [Note(f"{state.state}: {state.message}")]
    if state.diagnosis is not None:
        shows.append(state.diagnosis)
    shows.append(state.processes_table())
    failure = state.diagnosis.failure or "" if state.diagnosis is not None else ""
    return Report(State.OK if state.ok else State.FAILED, verdict, shows, failure, digest)
