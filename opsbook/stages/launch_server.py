"""Launch on one host: stop the server opsbook started, start the script detached, prove it
started, follow it to ready and smoke-test it; record which script the server runs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from opsbook.core import channel
from opsbook.core.deployment import Deployment
from opsbook.core.results import Result, State
from opsbook.remote.protocol import RemoteHost
from opsbook.stages.base import Report, StageRun, concurrently, hook
from opsbook.steps import host_facts, plots, script, server, triage


@dataclass(frozen=True)
class Options:
    """The launch's options (and its "Stop" button's: :func:`stop`).

    Args:
        apply: stop, start and follow the server (a dry run otherwise).
        ready_timeout: seconds the server may take to answer ``/health``.
        stop_grace: seconds a stopped server is given after SIGTERM, before SIGKILL.
        on_progress: told the host's name and each look at the starting server (a notebook
            shows the phase and the log's last lines as they come).
    """

    apply: bool = False
    ready_timeout: int = 900
    stop_grace: int = 10
    on_progress: Callable[[str, server.Progress], None] | None = hook()


@dataclass(kw_only=True)
class LaunchReport(Report):
    """A dry run's report, with the server's state as found (the notebook's stop button looks
    for hosts where a server opsbook started still has processes)."""

    server: triage.ServerState


def hosts_with_server(run: StageRun) -> list[str]:
    """The hosts of a dry run where a server opsbook started still has processes."""
    return [
        name
        for name, report in run.reports.items()
        if isinstance(report, LaunchReport) and report.server.processes
    ]


def run(host: RemoteHost, deployment: Deployment, options: Options) -> Report:
    """With ``apply``: stop, start, follow to ready, smoke test (changed, or failed at the
    step that failed). Without: ok when the server runs and is ready, else would change."""
    paths = server.resolve_paths(host, deployment)
    stop_grace = options.stop_grace
    if not options.apply:
        return _dry_run(host, deployment, paths)
    # Who holds the GPUs and the port is read alongside the stop; read again only when the
    # stop signalled a process, since only then can the answer have changed.
    stopped, started_facts = concurrently(
        lambda: server.stop_previous(host, paths, grace=stop_grace),
        lambda: host_facts.gather_facts(host, deployment, host_facts.START_FACTS),
    )
    shows: list[object] = [stopped]
    if not stopped.ok:
        return Report(State.FAILED, stopped, shows)
    if server.signalled_any(stopped):
        started_facts = host_facts.gather_facts(host, deployment, host_facts.START_FACTS)
    can_start = server.check_can_start(started_facts, deployment.server_port)
    shows.append(can_start)
    if not can_start.ok:
        return Report(State.FAILED, can_start, shows)
    started = server.start_server(host, paths, deployment.server_port)
    shows.append(started)
    if not started.ok:
        return Report(State.FAILED, started, shows, _failure_of(started))
    ready = server.wait_until_ready(
        host, paths, deployment.server_port, timeout=options.ready_timeout,
        on_progress=_phases(host, options.on_progress),
    )  # fmt: skip
    shows.append(ready)
    digest = server.record_running_script(host, paths)
    if not ready.ok:
        return Report(State.FAILED, ready, shows, _failure_of(ready), digest)
    api_key = script.server_api_key(deployment)
    smoke = server.smoke_test(host, deployment.server_port, api_key=api_key)
    diagnosis = server.diagnosis_of(ready)
    if diagnosis is not None:
        timeline = server.timeline(diagnosis.phases)
        shows += [timeline, plots.startup_timeline(timeline)]
    shows.append(smoke)
    return Report(State.CHANGED if smoke.ok else State.FAILED, smoke, shows, "", digest)


def stop(host: RemoteHost, deployment: Deployment, options: Options) -> Report:
    """Stop the server opsbook started on the host (by its recorded process group) and clean
    its stale shared memory: changed when one was stopped, ok when none ran."""
    paths = server.resolve_paths(host, deployment)
    before = triage.server_state(host, paths, deployment.server_port)
    stopped = server.stop_previous(host, paths, grace=options.stop_grace)
    if not stopped.ok:
        return Report(State.FAILED, stopped, [stopped])
    state = State.CHANGED if before.processes else State.OK
    return Report(state, stopped, [stopped])


def _phases(
    host: RemoteHost, listener: Callable[[str, server.Progress], None] | None = None
) -> Callable[[server.Progress], None]:
    """Note each startup phase a host's server reaches, once, for the runner's live lines;
    pass every look on to ``listener``."""
    seen: set[str | None] = set()

    def note(progress: server.Progress) -> None:
        if listener is not None:
            listener(host.name, progress)
        if progress.phase in seen:
            return
        seen.add(progress.phase)
        phase = progress.phase or "starting"
        text = phase if phase == progress.state else f"{progress.state} {phase}"
        channel.record_progress(channel.StageProgress(host.name, "launch", progress.seconds, text))

    return note


def _dry_run(host: RemoteHost, deployment: Deployment, paths: server.LaunchPaths) -> Report:
    state = triage.server_state(host, paths, deployment.server_port, notes=(server.RUNNING_SCRIPT,))
    digest = server.noted_running_script(host, paths, state.notes)
    if state.state == "ready":
        verdict = Result(True, f"already running and ready: {state.message}")
        return LaunchReport(State.OK, verdict, [state.processes_table()], "", digest, server=state)
    verdict = Result(True, f"would (re)start the server (now {state.state}); apply=True does it")
    shows = [state.processes_table()]
    return LaunchReport(State.WOULD_CHANGE, verdict, shows, "", digest, server=state)


def _failure_of(result: Result) -> str:
    diagnosis = server.diagnosis_of(result)
    return diagnosis.failure or "" if diagnosis is not None else ""
