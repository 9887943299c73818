"""Diagnose on one host: the server's state (never started, crashed, loading, ready, hung)
and, from its log, the known failure with its remedy; changes nothing."""

from __future__ import annotations

from dataclasses import dataclass

from opsbook.core.deployment import Deployment
from opsbook.core.results import State
from opsbook.remote.protocol import RemoteHost
from opsbook.stages.base import Note, Report, hook
from opsbook.steps import restart_rule, server, triage


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
    )
    digest = server.noted_running_script(host, paths, state.notes) if state.ok else ""
    verdict = state.to_result()
    shows: list[object] = [Note(f"{state.state}: {state.message}")]
    if state.diagnosis is not None:
        shows.append(state.diagnosis)
    shows.append(state.processes_table())
    failure = state.diagnosis.failure or "" if state.diagnosis is not None else ""
    return Report(State.OK if state.ok else State.FAILED, verdict, shows, failure, digest)
