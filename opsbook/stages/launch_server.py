"""Launch on one host: stop the server opsbook started, start the script detached, prove it
started, follow it to ready and smoke-test it; record which script the server runs.

A server that is ready and runs what it started with (script, env, patched configs, engine:
:mod:`opsbook.steps.restart_rule`) is left alone unless ``restart="always"``; the dry run
decides the same way, counting what the earlier stages of a deploy's dry run would change
(``pending``: :func:`pending_changes`) as its apply will find it: changed."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field

from opsbook.core import channel
from opsbook.core.deployment import Deployment
from opsbook.core.exceptions import ProbeError, RunError
from opsbook.core.results import Finding, Result, State
from opsbook.knowledge import logscan
from opsbook.remote.protocol import RemoteHost

# CHANGES_OF_STAGE and pending_changes (what a deploy's dry run tells the launch) live in the
# registry's base, which the runner imports without this module; named here as before.
from opsbook.stages.base import CHANGES_OF_STAGE as CHANGES_OF_STAGE
from opsbook.stages.base import HostChoice, Note, Report, StageRun, hook, limited
from opsbook.stages.base import pending_changes as pending_changes
from opsbook.steps import (
    host_facts,
    metrics,
    plots,
    record_facts,
    restart_rule,
    script,
    server,
    start_checks,
    triage,
)


@dataclass(frozen=True)
class Options:
    """The launch's options (and its "Stop" button's: :func:`stop`).

    Args:
        apply: stop, start and follow the server (a dry run otherwise).
        ready_timeout: seconds the server may take to answer ``/health``.
        stop_grace: seconds a stopped server is given after SIGTERM, before SIGKILL.
        on_progress: told the host's name and each look at the starting server (a notebook
            shows the phase and the log's last lines as they come).
        restart: "changed" restarts a ready server only when its script, env file, patched
            configs or engine changed since it started; "always" restarts it on every apply.
        pending: set by a deploy's dry run (:func:`pending_changes`): per host, the inputs
            (``script``, ``configs``) its earlier stages would change, so that the dry run
            says the restart the apply will make once they are changed.
    """

    apply: bool = False
    ready_timeout: int = limited(900, low=1)
    stop_grace: int = limited(10, low=0)
    on_progress: Callable[[str, server.Progress], None] | None = hook()
    restart: str = "changed"
    pending: dict[str, list[str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.restart not in restart_rule.RESTART_WHEN:
            allowed = " or ".join(restart_rule.RESTART_WHEN)
            raise RunError(
                f"restart {self.restart!r} is not one of the allowed values: {allowed}",
                remedy="-p restart changed (the default: only a server that is not ready or "
                "whose script, env, configs or engine changed) or -p restart always",
            )
        unknown = sorted(
            {str(name) for names in self.pending.values() for name in names}
            - set(restart_rule.INPUT_NAMES)
        )
        if unknown:
            raise RunError(
                f"pending names no input a server runs: {', '.join(unknown)}",
                remedy=f"each host's list holds some of {', '.join(restart_rule.INPUT_NAMES)}",
            )


@dataclass(kw_only=True)
class LaunchReport(Report):
    """The report of a launch that did not restart (a dry run, or a server left alone), with
    the server's state as found (the notebook's stop button looks for hosts where a server
    opsbook started still has processes)."""

    server: triage.ServerState


def hosts_with_server(run: StageRun) -> list[str]:
    """The hosts of a dry run where a server opsbook started still has processes."""
    return [
        name
        for name, report in run.reports.items()
        if isinstance(report, LaunchReport) and report.server.processes
    ]


def restart_choice(run: StageRun) -> HostChoice:
    """The hosts of a dry run that the notebook's start button may act on (the reachable ones),
    chosen by default when an apply would restart them (not ready, or what the server runs
    changed since it started); a ready, unchanged server only when the operator chooses it."""
    return run.choice(run.hosts_in(State.WOULD_CHANGE))


def stop_choice(run: StageRun) -> HostChoice:
    """The hosts of a dry run where a server opsbook started still has processes (what the
    stop button may act on), chosen by default when the server is not ready or runs what
    changed since; a ready, unchanged server only when the operator chooses it."""
    running = hosts_with_server(run)
    broken = set(run.hosts_in(State.WOULD_CHANGE))
    return run.choice([name for name in running if name in broken], offered=running)


def run(host: RemoteHost, deployment: Deployment, options: Options) -> Report:
    """When the server is not ready, or what it runs changed, or ``restart="always"``: with
    ``apply`` stop, start, follow to ready, smoke test (changed, or failed at the step that
    failed); without, would change. Otherwise ok, the server left alone."""
    paths = server.resolve_paths(host, deployment)
    stop_grace = options.stop_grace
    inputs = restart_rule.run_inputs(deployment, paths)
    state = triage.server_state(
        host, paths, deployment.server_port, notes=(server.RUNNING_SCRIPT,), inputs=inputs,
        when_healthy=record_facts.launch_side_command(deployment),
    )  # fmt: skip
    decision = restart_rule.decide(state, options.restart, options.pending.get(host.name, ()))
    if not options.apply or not decision.restart:
        return _as_found(host, deployment, paths, state, decision)
    # What the new start needs is read before anything is stopped: a start that cannot
    # succeed leaves the running server alone. Read again only when the stop signalled a
    # process, since only then can the answer have changed.
    started_facts = host_facts.gather_facts(host, deployment, start_checks.BEFORE_STOP_FACTS)
    can_run = start_checks.check_before_stop(
        started_facts, deployment, {p.pid for p in state.processes if p.pid is not None}
    )
    if not can_run.ok:
        return Report(State.FAILED, can_run, [can_run])
    stopped = server.stop_previous(host, paths, grace=stop_grace)
    shows: list[object] = [stopped]
    if not stopped.ok:
        return Report(State.FAILED, stopped, shows)
    if server.signalled_any(stopped):
        started_facts = host_facts.gather_facts(host, deployment, host_facts.START_FACTS)
    can_start = server.check_can_start(started_facts, deployment.server_port)
    shows.append(can_start)
    if not can_start.ok:
        return Report(State.FAILED, can_start, shows)
    started = server.start_server(host, paths, deployment.server_port, inputs=inputs)
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
    read, hung = _metrics_at_ready(host, deployment.server_port, api_key, diagnosis, smoke.ok)
    shows += read
    if smoke.ok:
        record_facts.note_launch(host, deployment, digest, diagnosis)
    # The errors the server started past (warnings of the wait) stay in the record.
    verdict = dataclasses.replace(
        smoke,
        message=decision.applied_message(smoke.message),
        findings=[*ready.findings, *smoke.findings, *hung],
    )
    return Report(State.CHANGED if smoke.ok else State.FAILED, verdict, shows, "", digest)


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
    """Note each startup phase a host's server reaches, once, for the runner's live lines,
    and within a phase a line every :data:`STILL_EVERY` seconds with the log's last words
    (loading 550 GB is one quiet phase of many minutes); pass every look on to ``listener``."""
    seen: set[str | None] = set()
    noted = [0.0]

    def note(progress: server.Progress) -> None:
        if listener is not None:
            listener(host.name, progress)
        phase = progress.phase or "starting"
        text = phase if phase == progress.state else f"{progress.state} {phase}"
        if progress.phase in seen:
            if progress.seconds - noted[0] < STILL_EVERY:
                return
            said = last_said(progress.tail)
            text = f"{text}, still: {said}" if said else f"{text}, still"
        seen.add(progress.phase)
        noted[0] = progress.seconds
        channel.record_progress(channel.StageProgress(host.name, "launch", progress.seconds, text))

    return note


# Seconds between two live lines of one quiet phase: a look takes up to a second and the
# runner reads the channel every 0.2 s, so the terminal sees a line at least every 10 s.
STILL_EVERY = 8.0
# The most of a log line a live line carries.
SAID_CHARS = 160


def last_said(tail: str) -> str:
    """The log's last line with words in it, without its prefixes (level, time, file), for a
    live line: a progress bar's last redraw, a warning, or the phase's own message."""
    # splitlines also splits at carriage returns: a progress bar's redraws are lines here.
    for raw in reversed(tail.splitlines()):
        line = logscan.normalise_line(raw)
        if any(c.isalnum() for c in line):
            return line if len(line) <= SAID_CHARS else line[: SAID_CHARS - 3] + "..."
    return ""


def _as_found(
    host: RemoteHost,
    deployment: Deployment,
    paths: server.LaunchPaths,
    state: triage.ServerState,
    decision: restart_rule.RestartDecision,
) -> Report:
    """A dry run's report (would change when an apply would restart), or an apply's that left
    the server alone (ok): the same words for the same decision."""
    digest = server.noted_running_script(host, paths, state.notes)
    verdict = Result(True, decision.dry_run_message())
    found = State.WOULD_CHANGE if decision.restart else State.OK
    shows = [state.processes_table()]
    if found is State.OK and state.state == "ready":
        record_facts.note_launch(host, deployment, digest, state.diagnosis, state.side)
    return LaunchReport(found, verdict, shows, "", digest, server=state)


def _metrics_at_ready(
    host: RemoteHost,
    port: int,
    api_key: str | None,
    diagnosis: logscan.LogDiagnosis | None,
    smoke_ok: bool,
) -> tuple[list[object], list[Finding]]:
    """The server's /metrics once it is ready (for the record); after a failed smoke test,
    watched for a stall, so that an engine producing no token is named hung."""
    names = metrics.names_for(diagnosis.version if diagnosis is not None else None)
    try:
        if smoke_ok:
            snapshot = metrics.read_metrics(host, port, api_key=api_key, names=names)
            return [metrics.summary_of("ready", snapshot)], []
        watch = metrics.watch_generation(host, port, api_key=api_key, names=names)
    except ProbeError as error:
        return [Note(f"/metrics not read: {error.message}")], []
    shows: list[object] = [
        Note(f"/metrics: {watch.message}"),
        metrics.summary_of("ready", watch.last),
    ]
    if watch.verdict != metrics.HUNG:
        return shows, []
    hung = Finding(
        "error",
        "/metrics",
        f"hung: {watch.message}",
        "see 05_diagnose; stop and start the server again (04_launch with restart=always)",
    )
    return shows, [hung]


def _failure_of(result: Result) -> str:
    diagnosis = server.diagnosis_of(result)
    return diagnosis.failure or "" if diagnosis is not None else ""
