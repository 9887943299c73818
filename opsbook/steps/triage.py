"""What state is the model server in, and why: never started, crashed, loading, ready or hung.

Brings together what the host shows (the launch record, the processes, the port, the log, the
GPU memory) and what the log says (:mod:`opsbook.knowledge.logscan`, the failure catalogue).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from opsbook.core.exceptions import ProbeError
from opsbook.core.results import Finding, Result, Table
from opsbook.knowledge import logscan
from opsbook.remote.protocol import RemoteHost
from opsbook.steps import metrics
from opsbook.steps.launch_answers import ProcessInfo, SettledAnswer, StatusAnswer
from opsbook.steps.server import HEALTH_TIMEOUT, PROBE, LaunchPaths, http_get

# A live server whose log has been silent this long, with its port closed, is called hung.
SILENT_SECONDS = 300.0
# A server whose log said it was ready, whose port is open, and whose /health does not answer
# for this long while its log does not grow, is hung (a stopped or wedged process): the bound
# on telling hung from busy. The port alone proves nothing: vLLM binds it before the engine
# is built (vllm 0.15.1 vllm/entrypoints/openai/api_server.py, run_server: setup_server, then
# build_async_engine_client), so a loading server's port accepts connections too.
UNRESPONSIVE_SECONDS = 10.0
# Seconds between two /health attempts while watching a server that does not answer.
RECHECK_SECONDS = 2.0

STATES = ("never started", "crashed", "loading", "ready", "hung", "exited")

# How a server whose log said ready lost its answer, when the watch did not call it stopped.
# Its port refusing is a full listen queue (a stopped process stops accepting: the third
# check of a SIGSTOPped server on the survey) or a server closing; /health silent while the log
# grows is an API server that no longer serves. Neither is loading: that phase is over.
LOST_REFUSED = "refused"
LOST_BUSY = "busy"


@dataclass
class ServerState:
    """The verdict on a server, with the evidence."""

    state: str
    message: str
    diagnosis: logscan.LogDiagnosis | None
    processes: list[ProcessInfo] = field(default_factory=list)
    others: list[ProcessInfo] = field(default_factory=list)
    port_open: bool | None = None
    log_age: float | None = None
    notes: dict[str, str | None] = field(default_factory=dict)
    record_error: str | None = None
    # What the server runs, compared with its start (``server_state(inputs=...)``), and when
    # that start was (seconds since the epoch, from the launch record).
    inputs: dict[str, str] = field(default_factory=dict)
    started_at: float | None = None
    # The inputs that changed since the judged launch started, when the caller asked about the
    # last deploy (``server_state(last_deploy=True)``): the running server is not its launch.
    superseded: list[str] = field(default_factory=list)
    # What the token counters did while a ready server was watched (``watch_metrics``), or
    # why /metrics could not tell.
    generation: metrics.GenerationWatch | None = None
    metrics_error: str | None = None
    # The exit code and output of the command run beside a ready server's status
    # (``server_state(when_healthy=...)``), None otherwise.
    side: tuple[int | None, str] | None = None
    # Whether the last complete deploy's note holds (``server_state(settled=...)``); None when
    # none was asked or the server was not ready.
    settled: SettledAnswer | None = None

    @property
    def ok(self) -> bool:
        return self.state in ("ready", "loading") and not self.superseded

    def processes_table(self) -> Table:
        roles = [(p, "this launch") for p in self.processes]
        roles += [(p, "not started by opsbook") for p in self.others]
        rows = [[p.pid, p.ppid, p.pgid, role, p.cmdline] for p, role in roles]
        return Table(["pid", "ppid", "pgid", "role", "cmdline"], rows)

    def to_result(self) -> Result:
        findings = self.diagnosis.to_result().findings if self.diagnosis else []
        findings += [
            Finding(
                "warning",
                f"PID {p.pid}",
                f"a vLLM process not started by this launch: {p.cmdline}",
                "if it is a leftover, stop it by PID or process group; it may hold GPU memory",
            )
            for p in self.others
        ]
        if self.record_error:
            findings.append(
                Finding(
                    "warning",
                    "launch.json",
                    f"the launch state file is unreadable ({self.record_error}): the process "
                    "was judged from the vLLM processes of the login user and the health check",
                    "the next launch rewrites it; until then stop_server cannot find the "
                    "server's process group: stop it by PID (see the processes table)",
                )
            )
        if self.metrics_error:
            findings.append(
                Finding(
                    "warning",
                    "/metrics",
                    f"the token counters were not read ({self.metrics_error}): a server that "
                    "answers /health while its engine produces nothing is not told from a "
                    "ready one",
                    "check that server.port is vLLM's and that --disable-log-stats is not set",
                )
            )
        return Result(self.ok, f"{self.state}: {self.message}", findings=findings)


def server_state(
    host: RemoteHost,
    paths: LaunchPaths,
    server_port: int,
    *,
    kernel_log: str | None = None,
    silent_after: float = SILENT_SECONDS,
    notes: Sequence[str] = (),
    log_when_ready: bool = True,
    inputs: Mapping[str, Any] | None = None,
    last_deploy: bool = False,
    watch_metrics: bool = False,
    api_key: str | None = None,
    when_healthy: Sequence[str] = (),
    settled: Mapping[str, Any] | None = None,
) -> ServerState:
    """Classify the server the deployment launched, from one status probe that also asks
    ``/health`` when the port is open (one round trip).

    Args:
        notes: names of files of the launch's state folder to read in the same probe
            (``ServerState.notes``, None for a missing one).
        log_when_ready: read and diagnose the log even when the server runs and answers
            ``/health`` (the startup timeline of a record); without it a ready server's log
            stays on the host and ``diagnosis`` is None.
        inputs: what the server runs (:func:`opsbook.steps.restart_rule.run_inputs`), each
            compared on the host with its digest noted at the start (``ServerState.inputs``).
        last_deploy: judge the server as the launch of the last deploy (05_diagnose): a running
            server whose ``inputs`` changed since its start is an earlier launch, the last
            deploy did not launch (it stopped before 04, or 04 failed before its stop), and
            that is no "ok" (``ServerState.superseded``).
        watch_metrics: a ready server's ``/metrics`` is watched (sent ``api_key``): requests
            running or waiting while no token is produced for
            :data:`opsbook.steps.metrics.STALL_SECONDS` make it hung, /health 200 or not.
        when_healthy: a command line run on the host, in the same probe, when the server runs
            and answers ``/health`` 200 (``ServerState.side``): what a record notes of a ready
            server, without a round trip of its own.
    """
    asked = paths.probe_args(
        op="status", port=server_port, health="/health", health_timeout=HEALTH_TIMEOUT
    )
    if not log_when_ready:
        asked["log_when_healthy"] = False
    if notes:
        asked["notes"] = list(notes)
    if inputs:
        asked["inputs"] = dict(inputs)
    if when_healthy:
        asked["when_healthy"] = list(when_healthy)
    if settled:
        asked["settled"] = dict(settled)
    status = StatusAnswer.parse(host.probe(PROBE, asked))
    moved = _moved_port(status, server_port)
    if moved is not None:
        server_port = moved
        status = StatusAnswer.parse(host.probe(PROBE, {**asked, "port": moved}))
    log = status.log
    text = log.text if log.exists else ""
    record_error = status.record_error
    # Without a readable record, a vLLM process of the login user stands for the server.
    running = status.running or bool(record_error and status.others)
    stop = _stop_of(status)
    if stop is not None:
        # What the processes logged while the stop's signal killed them is not a crash. A
        # group still exiting after opsbook's stop is no loading server: it is judged as
        # stopped, its live processes named as orphans.
        text = status.log_before_stop or ""
        running = False
    diagnosis = logscan.diagnose_log(text, running=running, kernel_log=kernel_log) if text else None
    healthy = _healthy(host, server_port, status) if status.port_open else False
    unresponsive = False
    lost: str | None = None
    was_ready = diagnosis is not None and diagnosis.state == logscan.READY
    if running and status.port_open and not healthy and was_ready:
        healthy, unresponsive = _watch_unresponsive(host, paths, server_port, log.size)
        lost = None if healthy or unresponsive else LOST_BUSY
    elif running and not status.port_open and was_ready:
        lost = LOST_REFUSED
    state, message = classify(
        record=status.record is not None or bool(record_error),
        running=running,
        log_exists=log.exists,
        log_age=log.age,
        port_open=status.port_open,
        healthy=healthy,
        diagnosis=diagnosis,
        silent_after=silent_after,
        orphans=0 if running else len(status.group),
        stopped_at=stop,
        unresponsive=unresponsive,
        ready_lost=lost,
    )
    generation, metrics_error = None, None
    if watch_metrics and state == "ready":
        version = diagnosis.version if diagnosis is not None else None
        generation, metrics_error = _watch_generation(host, server_port, version, api_key)
        if generation is not None and generation.verdict == metrics.HUNG:
            state, message = "hung", f"/health answers 200, but {generation.message}"
    if record_error:
        message = f"{message}; launch state: {record_error}"
    if moved is not None:
        message = (
            f"{message} (judged on port {moved}, where it was launched; the deployment now "
            "names another port: the next launch moves it)"
        )
    started_at = status.record.started_at if status.record is not None else None
    superseded = _superseded(status.inputs) if last_deploy and running else []
    message = _with_launch(message, started_at, superseded)
    return ServerState(
        state,
        message,
        diagnosis,
        processes=status.group,
        others=status.others,
        port_open=status.port_open,
        log_age=log.age,
        notes=status.notes,
        record_error=record_error,
        inputs=status.inputs,
        started_at=started_at,
        superseded=superseded,
        generation=generation,
        metrics_error=metrics_error,
        side=status.side,
        settled=status.settled,
    )


def _watch_generation(
    host: RemoteHost, port: int, version: str | None, api_key: str | None
) -> tuple[metrics.GenerationWatch | None, str | None]:
    """The watch of the token counters with the names of the release the log names, or why
    there is none."""
    names = metrics.names_for(version)
    try:
        return metrics.watch_generation(host, port, api_key=api_key, names=names), None
    except ProbeError as error:
        return None, error.message


def deploy_inputs(inputs: Mapping[str, Any]) -> dict[str, Any]:
    """The inputs a diagnosis compares to tell the last deploy's launch from an earlier one:
    the files a deploy writes (script, env, configs). The engine's digest runs the server's
    Python to import vLLM, too slow for a health check of every host; 04 compares it."""
    return {name: spec for name, spec in inputs.items() if "files" in spec}


def _superseded(inputs: Mapping[str, str]) -> list[str]:
    """The inputs whose digest changed since the running server started."""
    return [name for name, verdict in inputs.items() if verdict == "changed"]


def _with_launch(message: str, started_at: float | None, superseded: Sequence[str]) -> str:
    """The message naming the launch it judges (its start), and, for a server that is not the
    last deploy's launch, that the deploy did not launch."""
    if started_at is None:
        return message
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(started_at))
    if superseded:
        changed = ", ".join(superseded)
        return (
            f"the running server is from {when}; the last deploy did not launch ({changed} "
            f"changed since that start): {message}"
        )
    return f"{message} (the launch of {when})"


def _moved_port(status: StatusAnswer, server_port: int) -> int | None:
    """The port a running launch was started on when the deployment now names another: the
    server is judged where it listens, not by whatever holds the new port."""
    record = status.record
    if not status.running or record is None or not record.port:
        return None
    return int(record.port) if int(record.port) != int(server_port) else None


def _stop_of(status: StatusAnswer) -> float | None:
    """When opsbook stopped this launch (the record's stop), or None."""
    stop = status.record.stop if status.record is not None else None
    if stop is None or stop.log_size is None or status.log_before_stop is None:
        return None
    return stop.at


def _watch_unresponsive(
    host: RemoteHost, paths: LaunchPaths, port: int, log_size: int | None
) -> tuple[bool, bool]:
    """(healthy, unresponsive): /health asked again for :data:`UNRESPONSIVE_SECONDS`; the
    server is unresponsive if it never answered and its log did not grow meanwhile."""
    deadline = time.monotonic() + UNRESPONSIVE_SECONDS
    while time.monotonic() < deadline:
        time.sleep(RECHECK_SECONDS)
        if _healthy(host, port, None):
            return True, False
    later = StatusAnswer.parse(host.probe(PROBE, paths.probe_args(op="status", port=port)))
    return False, later.log.size == log_size


def classify(
    *,
    record: bool,
    running: bool,
    log_exists: bool,
    log_age: float | None,
    port_open: bool | None,
    healthy: bool,
    diagnosis: logscan.LogDiagnosis | None,
    silent_after: float = SILENT_SECONDS,
    orphans: int = 0,
    stopped_at: float | None = None,
    unresponsive: bool = False,
    ready_lost: str | None = None,
) -> tuple[str, str]:
    """The state and a one-line reason, from the facts gathered (pure, for tests).

    Args:
        record: whether opsbook recorded a launch.
        running: whether the recorded server process is alive (and still the same process).
        log_exists: whether the deployment's log file exists.
        log_age: seconds since the log last changed.
        port_open: whether the server port accepts connections (None when not checked).
        healthy: whether ``/health`` answered 200.
        diagnosis: what the log of this launch says; None when it holds nothing.
        silent_after: a live server whose log is silent this long, port closed, is hung.
        orphans: processes of the launch's group still alive after its leader is gone.
        stopped_at: when opsbook stopped this launch (then ``diagnosis`` is of the log written
            before the stop).
        unresponsive: the log said ready, the port is open, and /health did not answer for
            :data:`UNRESPONSIVE_SECONDS` while the log did not grow.
        ready_lost: the log said ready and the server no longer answers otherwise:
            :data:`LOST_REFUSED` (its port refuses) or :data:`LOST_BUSY` (/health silent for
            the watch while the log grows).

    Returns:
        One of :data:`STATES` and the reason.
    """
    if not running:
        state, message = _classify_gone(record, log_exists, diagnosis)
        if stopped_at is not None and state != "crashed":
            when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(stopped_at))
            state = "exited"
            phase = diagnosis.phase if diagnosis else None
            message = f"stopped by opsbook at {when}" + (
                f" (it was in phase {phase})" if phase else ""
            )
        if orphans:
            message += (
                f"; {orphans} of its processes still run (orphans holding GPU memory): "
                "04_launch stops them (its Stop button, or `opsbook run 04_launch -p apply true`)"
            )
        return state, message
    if healthy:
        return "ready", "the process runs and /health answers 200"
    if unresponsive:
        return "hung", (
            f"it was ready, but /health has not answered for {UNRESPONSIVE_SECONDS:g} s while "
            "the port is open and the log does not grow (a stopped or wedged process)"
        )
    if ready_lost == LOST_REFUSED:
        return "hung", (
            "it was ready, but its port no longer accepts connections (a stopped or wedged "
            "process whose listen queue is full, or a server closing)"
        )
    if ready_lost == LOST_BUSY:
        return "hung", (
            f"it was ready, but /health has not answered for {UNRESPONSIVE_SECONDS:g} s while "
            "its log still grows (an API server that no longer serves)"
        )
    phase = diagnosis.phase if diagnosis else None
    if diagnosis is not None and diagnosis.state == logscan.FAILED:
        return "crashed", f"{diagnosis.title} (the process is still alive)"
    if diagnosis is not None and diagnosis.state == logscan.HUNG and not port_open:
        return "hung", f"{diagnosis.title} (alive, in phase {phase}, port closed)"
    if log_age is not None and log_age > silent_after and not port_open:
        return "hung", f"alive, log silent for {log_age:.0f} s in phase {phase}, port closed"
    age = f", last log line {log_age:.0f} s ago" if log_age is not None else ""
    return "loading", f"phase {phase or 'starting'}{age}"


def _classify_gone(
    record: bool, log_exists: bool, diagnosis: logscan.LogDiagnosis | None
) -> tuple[str, str]:
    """The state of a server whose process is not running."""
    if not record and not log_exists:
        return "never started", "no launch recorded, no log, no process"
    if diagnosis is not None and diagnosis.state == logscan.FAILED:
        return "crashed", diagnosis.title
    if not log_exists:
        return "never started", "the launch left no log: the script did not run"
    if diagnosis is None or (diagnosis.phase is None and diagnosis.state != logscan.HUNG):
        # The incident's silent failure: something ran, but vLLM never said a word.
        return "never started", "the process is gone and its log shows no vLLM startup"
    if diagnosis.state == logscan.HUNG:
        return "exited", f"the process is gone after a stall: {diagnosis.title}"
    phase = diagnosis.phase
    return "exited", f"the process is gone and its log shows no error (last phase {phase})"


def _healthy(host: RemoteHost, port: int, status: StatusAnswer | None) -> bool:
    # A host whose probe predates the health answer in the status is asked separately.
    answer = status.health if status is not None else None
    answer = answer or http_get(host, port, "/health", timeout=HEALTH_TIMEOUT)
    return answer.status == 200
