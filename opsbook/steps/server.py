"""Launching the model server: a safe stop, a clean start proven within seconds, readiness,
a smoke test and the startup timeline.

opsbook never kills a process it did not start: a stop signals only the process group that
its own launch recorded on the host (``<state dir>/launch.json``), after checking that the
process is still the one it started. Everything else it finds is reported, with the remedy.
"""

from __future__ import annotations

import functools
import json
import posixpath
import shlex
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from opsbook.core.deployment import Deployment
from opsbook.core.exceptions import HostUnreachable
from opsbook.core.results import Finding, Result, Table
from opsbook.knowledge import logscan
from opsbook.remote.protocol import RemoteHost
from opsbook.steps.launch_answers import (
    HttpAnswer,
    LaunchRecord,
    ProcessInfo,
    ShmAnswer,
    SmokeAnswer,
    StartAnswer,
    StartProof,
    StatusAnswer,
    StopAnswer,
)

if TYPE_CHECKING:
    from opsbook.steps.host_facts import HostFacts

PROBE = "launch"
# Written next to the launch record when a server starts: the sha256 of the script it runs.
RUNNING_SCRIPT = "running-script.sha256"
# A probe that waits for a process to die needs its own time on top of the grace period.
PROBE_SLACK = 30.0
# How much of the log's end a progress report carries, for a live tail.
TAIL = 4096
RECONNECT_ATTEMPTS = 5
RECONNECT_PAUSE = 2.0
# A listener that accepts but never answers (not vLLM, or a wedged server) must not stall a
# readiness loop that looks every second.
HEALTH_TIMEOUT = 3.0
# Seconds each request of the smoke test may take (a first completion compiles on some GPUs).
SMOKE_TIMEOUT = 10.0


@dataclass(frozen=True)
class LaunchPaths:
    """The deployment's paths on the host, made absolute."""

    script: str
    log: str
    state_dir: str

    def probe_args(self, **extra: Any) -> dict[str, Any]:
        return {"script": self.script, "log": self.log, "state_dir": self.state_dir, **extra}


def resolve_paths(host: RemoteHost, deployment: Deployment) -> LaunchPaths:
    """Absolute paths of the script, the log and the state folder on the host."""
    # The script module (its flag tables) is not needed by a health check that imports this.
    from opsbook.steps.script import resolve_remote_path

    return LaunchPaths(
        script=resolve_remote_path(host, deployment.script_path),
        log=resolve_remote_path(host, deployment.log_path),
        state_dir=resolve_remote_path(host, deployment.state_dir),
    )


# -- stop -------------------------------------------------------------------------------------


@dataclass(kw_only=True, repr=False)
class ShmResult(Result):
    """A clean of stale shared memory: what was (or would be) removed, and what was kept."""

    answer: ShmAnswer


@dataclass(kw_only=True, repr=False)
class StopResult(Result):
    """A stop: the processes signalled (a table), the probe's answer, and with
    :func:`stop_previous` the clean of shared memory that followed it."""

    stopped: Table
    answer: StopAnswer
    shm: ShmResult | None = None

    @property
    def signalled_any(self) -> bool:
        """Whether the stop sent a signal (a process may have let go of GPUs or a port),
        rather than finding nothing of opsbook's to stop."""
        return self.answer.reason not in ("no-record", "not-running")


def stop_server(host: RemoteHost, paths: LaunchPaths, *, grace: float = 10.0) -> StopResult:
    """Stop the server opsbook launched: SIGTERM to its process group, then SIGKILL.

    Processes opsbook did not start (another user's server, a server started by hand, a PID
    now used by another program) are never signalled: they are findings with the remedy.

    Args:
        host: the host.
        paths: the deployment's paths (the launch record lives in ``paths.state_dir``).
        grace: seconds between SIGTERM and SIGKILL.

    Returns:
        ``ok`` when the recorded launch is stopped or there was none, and no vLLM process of
        this user that opsbook did not start runs (another user's only gives ``info``
        findings). With ``stopped`` (a table of the processes signalled) and ``answer``.
    """
    answer = host.probe(
        PROBE, paths.probe_args(op="stop", grace=grace), timeout=grace + PROBE_SLACK
    )
    return _stop_result(StopAnswer.parse(answer))


def _stop_result(answer: StopAnswer) -> StopResult:
    reason = answer.reason
    findings = [_not_ours(p, answer.uid) for p in answer.refused]
    stopped = answer.stopped
    table = process_table(stopped)

    def result(ok: bool, message: str) -> StopResult:
        return StopResult(ok, message, findings=findings, stopped=table, answer=answer)

    if reason == "stopped":
        signals = "+".join(answer.signals)
        return result(True, f"stopped {len(stopped)} process(es) with SIG{signals}")
    if reason in ("no-record", "not-running"):
        what = "no launch by opsbook is recorded" if reason == "no-record" else "nothing to stop"
        # A server of this user that opsbook did not start is likely the previous one, started
        # by hand: the user must deal with it. Another user's is only worth knowing about.
        ok = not any(f.severity == "warning" for f in findings)
        message = what if ok else f"{what}, but other vLLM processes of yours run: see the findings"
        return result(ok, message)
    problems = {
        "pid-reused": "the recorded PID now belongs to another process: nothing was signalled",
        "own-session": "the recorded group holds this SSH session: nothing was signalled",
        "other-user": "the recorded group has processes of another user: nothing was signalled",
        "survived": "processes survived SIGKILL (uninterruptible sleep?)",
    }
    return result(False, problems.get(reason, f"stop failed: {reason}"))


# What stops a server opsbook started: the notebook's button, or a run that restarts it.
STOP_REMEDY = "stop it first: 04_launch's Stop button, or `opsbook run 04_launch -p apply true`"


def stop_previous(host: RemoteHost, paths: LaunchPaths, *, grace: float = 10.0) -> StopResult:
    """:func:`stop_server`, then :func:`clean_stale_shm`: the step before a start, in one
    probe."""
    asked = paths.probe_args(op="stop", grace=grace, clean_shm=True)
    answer = StopAnswer.parse(host.probe(PROBE, asked, timeout=grace + PROBE_SLACK))
    stopped = _stop_result(answer)
    if not stopped.ok:
        return stopped
    cleaned = _shm_result(answer.shm or ShmAnswer(), apply=True)
    return StopResult(
        cleaned.ok,
        f"{stopped.message}; {cleaned.message}",
        findings=stopped.findings + cleaned.findings,
        stopped=stopped.stopped,
        answer=answer,
        shm=cleaned,
    )


def signalled_any(stopped: StopResult) -> bool:
    """Whether a :func:`stop_previous` sent a signal (a process may have let go of GPUs or a
    port), rather than finding nothing of opsbook's to stop."""
    return stopped.signalled_any


def clean_stale_shm(host: RemoteHost, *, apply: bool = True) -> ShmResult:
    """Remove ``/dev/shm/psm_*`` and ``sem.mp-*`` files of this user that no live process
    holds (a server killed with SIGKILL leaves them behind). Done by a probe: no shell glob,
    which zsh would abort on when nothing matches."""
    answer = host.probe(PROBE, {"op": "clean_shm", "apply": apply})
    return _shm_result(ShmAnswer.parse(answer), apply=apply)


def _shm_result(answer: ShmAnswer, *, apply: bool) -> ShmResult:
    if answer.error:
        return ShmResult(False, answer.error, answer=answer)
    freed = sum(r.bytes for r in answer.removed)
    verb = "would remove" if not apply else "removed"
    in_use = [k for k in answer.kept if k.mine]
    message = (
        f"{verb} {len(answer.removed)} stale file(s) ({freed} bytes); {len(in_use)} in use kept"
    )
    return ShmResult(True, message, answer=answer)


# -- start ------------------------------------------------------------------------------------


def check_can_start(facts: HostFacts, server_port: int) -> Result:
    """Refuse to start while the port is taken or other processes hold GPU memory.

    Args:
        facts: the host's facts (:func:`opsbook.steps.host_facts.gather_facts`), taken after the
        stop.
        server_port: the port the server will listen on.

    Returns:
        ``ok`` when the port is free and no process holds GPU memory; otherwise one error
        finding per holder, naming it.
    """
    findings = []
    # A dual-stack listener shows once for IPv4 and once for IPv6: name each holder once.
    holders = {(s.pid, s.user): s for s in facts.listening if s.port == server_port}
    for sock in holders.values():
        who = (
            f"PID {sock.pid} ({sock.cmdline or sock.process})"
            if sock.pid
            else f"a process of user {sock.user or 'unknown'} (its PID is not visible)"
        )
        findings.append(
            Finding(
                "error",
                f"port {server_port}",
                f"port {server_port} is already taken by {who}",
                "stop that server first (notebook 04 stops only what opsbook started), "
                "or set server.port to a free port",
            )
        )
    for proc in facts.processes:
        findings.append(
            Finding(
                "error",
                f"GPU {proc.gpu_index}",
                f"PID {proc.pid} ({proc.process_name}) holds {proc.used_memory_mib} MiB "
                f"on GPU {proc.gpu_index}",
                "stop it if it is a leftover server (an orphan VLLM::EngineCore keeps GPU memory"
                " after its API server died); vLLM would fail with 'Free memory on device ... "
                "less than desired GPU memory utilization'",
            )
        )
    ok = not findings
    return Result(ok, "port free and GPUs idle" if ok else "cannot start yet", findings=findings)


@dataclass(kw_only=True, repr=False)
class StartResult(Result):
    """A start: the launch record and the proof of its first seconds when it started, what
    the log said when it did not live, and the probe's answer."""

    answer: StartAnswer
    record: LaunchRecord | None = None
    proof: StartProof | None = None
    diagnosis: logscan.LogDiagnosis | None = None


def start_server(
    host: RemoteHost,
    paths: LaunchPaths,
    server_port: int,
    *,
    inputs: Mapping[str, Any] | None = None,
) -> StartResult:
    """Start the launch script detached, in a session of its own, logging to the log file,
    and prove within about two seconds that it started (alive and logging) or say why not.
    With ``inputs`` (:func:`opsbook.steps.restart_rule.run_inputs`) the launch record notes a
    digest of each, taken just before the start: the next deploy compares them."""
    asked = paths.probe_args(op="start", port=server_port)
    if inputs:
        asked["inputs"] = dict(inputs)
    answer = StartAnswer.parse(host.probe(PROBE, asked, timeout=60))
    record, proof = answer.record, answer.proof
    if not answer.started or record is None or proof is None:
        return _not_started(answer, paths, server_port)

    def result(ok: bool, message: str, **more: Any) -> StartResult:
        return StartResult(ok, message, answer=answer, record=record, proof=proof, **more)

    if proof.alive and proof.log_bytes > 0:
        message = f"started: PID {record.pid} (group {record.pgid}), logging to {paths.log}"
        return result(True, message)
    if proof.alive:
        return result(True, f"started: PID {record.pid} is alive but has not logged yet")
    diagnosis = logscan.diagnose_log(proof.tail, running=False)
    code = proof.exit_code
    if diagnosis.state == "failed":
        message = f"crashed within seconds (exit code {code}): {diagnosis.title}"
    elif proof.log_bytes:
        message = f"exited at once with code {code}: {_last_line(proof.tail)}"
    else:
        message = f"never started: exited with code {code} and logged nothing"
    findings = diagnosis.to_result().findings
    return result(False, message, findings=findings, diagnosis=diagnosis)


def diagnosis_of(result: Result) -> logscan.LogDiagnosis | None:
    """What the log said, for a result of :func:`start_server` or :func:`wait_until_ready`."""
    if isinstance(result, StartResult | ReadyResult):
        return result.diagnosis
    return None


def _not_started(answer: StartAnswer, paths: LaunchPaths, port: int) -> StartResult:
    reason = answer.reason
    if reason == "running":
        pid = answer.record.pid if answer.record is not None else None
        return StartResult(
            False,
            f"a server launched by opsbook is still running (PID {pid})",
            answer=answer,
            findings=[
                Finding(
                    "error",
                    "server",
                    "still running",
                    STOP_REMEDY,
                )
            ],
        )
    if reason == "port-taken":
        holders = ", ".join(_holder(h) for h in answer.holders) or "an unseen process"
        message = f"not started: port {port} is already taken by {holders}"
        remedy = (
            "stop that server first (04_launch's Stop button stops only what opsbook started), "
            "or set server.port to a free port"
        )
        findings = [Finding("error", f"port {port}", message, remedy)]
        return StartResult(False, message, answer=answer, findings=findings)
    remedies = {
        "no-script": f"{paths.script} does not exist: upload it with notebook 03_launch_script",
        "not-executable": f"{paths.script} is not executable: upload it again (mode 0755)",
    }
    message = remedies.get(str(reason), f"not started: {reason}")
    return StartResult(
        False, message, answer=answer, findings=[Finding("error", "launch script", message)]
    )


# -- readiness --------------------------------------------------------------------------------


@dataclass
class Progress:
    """One look at a starting server, for progress displays."""

    seconds: float
    phase: str | None
    state: str
    log_bytes: int
    tail: str = ""

    def line(self) -> str:
        return f"{self.seconds:5.0f} s  {self.state:<13} phase: {self.phase or '-'}"

    @property
    def step(self) -> int:
        """How many of the :data:`STARTUP_STEPS` phases are behind (for a progress bar)."""
        names = logscan.PHASE_NAMES
        return names.index(self.phase) + 1 if self.phase in names else 0


STARTUP_STEPS = len(logscan.PHASE_NAMES)


def wait_until_ready(
    host: RemoteHost,
    paths: LaunchPaths,
    server_port: int,
    *,
    timeout: float = 900.0,
    interval: float = 1.0,
    on_progress: Callable[[Progress], None] | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> ReadyResult:
    """Follow the log until the server answers ``/health``, fails, dies or ``timeout`` passes.

    A launch is judged by what the server does: it failed when its process exits, when the
    log shows vLLM's notice that a process of the server died, when an error's process logs
    nothing more for :data:`SETTLE_SECONDS` (a fatal error whose server does not exit), or
    when it is not ready within ``timeout``. An error the startup goes on past (vLLM logs a
    handled exception with its traceback) is a warning finding of the ready result, naming
    its line. An SSH connection that drops while waiting is opened again and the wait goes on
    with the same recorded process.

    Each look is one probe that waits on the host up to ``interval`` seconds for the line
    that proves the server ready (or an error line, or the process gone), so readiness is
    seen within a fraction of a second; only the bytes logged since the last look cross the
    network, and they are screened once (:class:`opsbook.knowledge.logscan.LogFollower`), so a look
    costs the same however long the log has grown.
    """
    started = time.monotonic()
    follower = logscan.LogFollower()
    errors = _StartupErrors()
    tail, offset, wait = "", None, 0.0
    while True:
        status = _watch_with_retry(host, paths, server_port, offset, wait)
        log = status.log
        if log.exists:
            follower.feed(log.text.encode("utf-8", "surrogateescape"))
            tail, offset = (tail + log.text)[-TAIL:], log.end
        running = status.running
        diagnosis = follower.diagnose(running=running)
        elapsed = time.monotonic() - started
        failed = diagnosis.state == logscan.FAILED
        ended = errors.ended(follower, diagnosis, running=bool(running), now=elapsed)
        if on_progress:
            # An error the startup may still go past is not shown as its end.
            state = logscan.LOADING if failed and ended is None else diagnosis.state
            on_progress(Progress(elapsed, diagnosis.phase, state, follower.size, tail))
        # Every ending carries what was seen at this look.
        result = functools.partial(
            ReadyResult, diagnosis=diagnosis, status=status, seconds=round(elapsed, 1)
        )
        if failed and ended is not None:
            findings = diagnosis.to_result().findings
            return result(False, f"failed: {diagnosis.title}{ended}", findings=findings)
        if not running:
            message = f"the server exited ({diagnosis.summary})"
            return result(False, message, findings=_exit_findings(diagnosis))
        if status.port_open:
            health = status.health or _http_with_retry(host, _health_args(server_port))
            if health.status == 200:
                warnings = errors.survived(follower, diagnosis)
                message = f"ready after {elapsed:.0f} s" + _survived_note(warnings)
                return result(True, message, findings=warnings)
        if elapsed > timeout:
            message = f"not ready after {timeout:g} s (state {diagnosis.state}, {diagnosis.phase})"
            return result(False, message, findings=[_timeout_finding(diagnosis, timeout)])
        if status.watched_steps is None:
            sleep(interval)  # a host whose answer did not wait (a test double's)
        wait = min(interval, max(0.0, timeout - elapsed) + 0.1)


# Seconds an error's process may stay silent, its server alive, before the error is taken as
# the end of the startup: vLLM's fatal errors are followed by the process's exit or an engine's
# death notice within seconds, a handled one by the process's next record.
SETTLE_SECONDS = 30.0


class _StartupErrors:
    """The errors a readiness wait has seen while the server process ran, and what became of
    them: the first look that showed each, and those the startup went on past."""

    def __init__(self) -> None:
        self.first_seen: dict[int, float] = {}
        self.went_on: dict[int, logscan.LogDiagnosis] = {}

    def ended(
        self,
        follower: logscan.LogFollower,
        diagnosis: logscan.LogDiagnosis,
        *,
        running: bool,
        now: float,
    ) -> str | None:
        """None while the log shows no failure, or one the startup may still go past;
        otherwise the words that say why it ends the wait ("" when the diagnosis says it)."""
        if diagnosis.state != logscan.FAILED:
            return None
        if not running or diagnosis.line is None:
            return ""
        verdict = follower.judge(diagnosis)
        if verdict == logscan.FATAL:
            return ""
        number = diagnosis.line.number
        if verdict == logscan.WENT_ON:
            self.went_on.setdefault(number, diagnosis)
            return None
        silent = now - self.first_seen.setdefault(number, now)
        if silent <= SETTLE_SECONDS:
            return None
        return f" (its process has logged nothing but errors since, for {silent:.0f} s)"

    def survived(self, follower: logscan.LogFollower, ready: logscan.LogDiagnosis) -> list[Finding]:
        """A warning per error the log showed before the server became ready."""
        seen = dict(self.went_on)
        before = follower.error_before_ready(ready)
        if before is not None and before.line is not None:
            seen.setdefault(before.line.number, before)
        return [_survived_finding(found) for _, found in sorted(seen.items())]


def _survived_finding(found: logscan.LogDiagnosis) -> Finding:
    line = found.line
    # The message without the colour codes and prefixes a raw line may carry; its number finds it.
    where = f"line {line.number}: {line.text[:300]}" if line else "the log"
    return Finding(
        "warning",
        found.failure or "log",
        f"an error was logged before the server became ready, and it started anyway "
        f"({found.title}) at {where}",
        f"the server serves; check that what failed is not needed: {found.remedy}",
        found.source,
    )


def _survived_note(warnings: list[Finding]) -> str:
    if not warnings:
        return ""
    return f", past {len(warnings)} error(s) logged before readiness (warnings)"


@dataclass(kw_only=True, repr=False)
class ReadyResult(Result):
    """The wait for readiness: what the log said, the last status seen, and the seconds."""

    diagnosis: logscan.LogDiagnosis
    status: StatusAnswer
    seconds: float


def _watch_with_retry(
    host: RemoteHost, paths: LaunchPaths, port: int, offset: int | None, wait: float
) -> StatusAnswer:
    args = paths.probe_args(op="watch", port=port, offset=offset, wait=wait)
    args["health_timeout"] = HEALTH_TIMEOUT
    return StatusAnswer.parse(_probe_with_retry(host, args))


def _http_with_retry(host: RemoteHost, args: dict[str, Any]) -> HttpAnswer:
    return HttpAnswer.parse(_probe_with_retry(host, args))


def _probe_with_retry(host: RemoteHost, args: dict[str, Any]) -> dict[str, Any]:
    """A read-only probe, run again on a fresh connection when the connection drops
    (reading twice is harmless)."""
    for attempt in range(RECONNECT_ATTEMPTS):
        try:
            answer: dict[str, Any] = host.probe(PROBE, args)
            return answer
        except HostUnreachable:
            if attempt == RECONNECT_ATTEMPTS - 1:
                raise
            host.close()
            time.sleep(RECONNECT_PAUSE * attempt)
    raise AssertionError("unreachable")


def _health_args(port: int) -> dict[str, Any]:
    return {"op": "http", "port": port, "path": "/health", "timeout": HEALTH_TIMEOUT}


def _exit_findings(diagnosis: logscan.LogDiagnosis) -> list[Finding]:
    return diagnosis.to_result().findings


def _timeout_finding(diagnosis: logscan.LogDiagnosis, timeout: float) -> Finding:
    return Finding(
        "error",
        "readiness",
        f"no answer on /health after {timeout:g} s; last phase {diagnosis.phase or 'none'}",
        "a very large model can take longer (raise the timeout); if the log is silent, run "
        "05_diagnose to tell a slow start from a hang",
    )


# -- HTTP and the smoke test ------------------------------------------------------------------


def http_get(
    host: RemoteHost,
    port: int,
    path: str,
    *,
    timeout: float = 10.0,
    api_key: str | None = None,
    json_body: dict[str, Any] | None = None,
) -> HttpAnswer:
    """GET ``path`` on the server (POST with ``json_body``), from the host itself, so the
    port need not be exposed.

    Args:
        host: the host.
        port: the server's port.
        path: the URL path, e.g. ``/health``.
        timeout: seconds to wait for the answer.
        api_key: sent as ``Authorization: Bearer`` (the server's ``--api-key``).
        json_body: a JSON request body.

    Returns:
        ``status`` (None when nothing answered), ``body`` and ``seconds``, or ``error``.
    """
    args: dict[str, Any] = {"op": "http", "port": port, "path": path, "timeout": timeout}
    if api_key:
        args["bearer"] = api_key
    if json_body is not None:
        args["json"] = json_body
    return HttpAnswer.parse(host.probe(PROBE, args, timeout=timeout + PROBE_SLACK))


@dataclass(kw_only=True, repr=False)
class SmokeResult(Result):
    """The smoke test: the model the server names and the text of its completion."""

    model: str | None
    completion: str


def smoke_test(
    host: RemoteHost, port: int, *, prompt: str = "Hello, my name is", api_key: str | None = None
) -> SmokeResult:
    """``/health``, ``/v1/models`` and one small completion, each a finding.

    Args:
        host: the host.
        port: the server's port.
        prompt: the completion's prompt.
        api_key: the server's ``--api-key``, when it has one.
    """
    args: dict[str, Any] = {"op": "smoke", "port": port, "timeout": SMOKE_TIMEOUT}
    args["completion"] = {"prompt": prompt, "max_tokens": 8, "temperature": 0}
    if api_key:
        args["bearer"] = api_key
    # One round trip: the completion needs the model id /v1/models names, so the host asks.
    answer = SmokeAnswer.parse(host.probe(PROBE, args, timeout=3 * SMOKE_TIMEOUT + PROBE_SLACK))
    findings = [_http_finding("/health", answer.health), _http_finding("/v1/models", answer.models)]
    model_id = answer.model
    completion = answer.completion or HttpAnswer(None)
    if model_id:
        findings.append(_http_finding("/v1/completions", completion))
    ok = all(f.severity == "ok" for f in findings) and bool(model_id)
    text = _completion_text(completion)
    message = f"smoke test passed: {model_id} answered {text!r}" if ok else "smoke test failed"
    return SmokeResult(ok, message, findings=findings, model=model_id, completion=text)


def _http_finding(path: str, answer: HttpAnswer) -> Finding:
    status = answer.status
    if status == 200:
        return Finding("ok", path, f"200 in {answer.seconds:.2f} s")
    detail = answer.error or f"HTTP {status}: {answer.body[:200]}"
    return Finding("error", path, detail, "run 05_diagnose")


def _completion_text(answer: HttpAnswer) -> str:
    # The completion's JSON is vLLM's OpenAI-compatible answer, not opsbook's: read as found.
    try:
        return str(json.loads(answer.body)["choices"][0]["text"])
    except (KeyError, IndexError, TypeError, ValueError):
        return ""


# -- the startup timeline ---------------------------------------------------------------------


def timeline(phases: Sequence[logscan.Phase]) -> Table:
    """Each phase with its start and how long it lasted until the next one."""
    stamped = [p for p in phases if p.timestamp is not None]
    rows = []
    for i, phase in enumerate(stamped):
        start = _seconds(phase.timestamp, stamped[0].timestamp)
        end = (
            _seconds(stamped[i + 1].timestamp, stamped[0].timestamp)
            if i + 1 < len(stamped)
            else None
        )
        rows.append([phase.name, start, None if end is None else round(end - start, 1)])
    return Table(["phase", "starts at (s)", "lasts (s)"], rows)


def _seconds(when: datetime | None, origin: datetime | None) -> float:
    if when is None or origin is None:
        return 0.0
    return round((when - origin).total_seconds(), 1)


PROCESS_COLUMNS = ["pid", "ppid", "pgid", "uid", "cmdline"]


def process_table(found: Sequence[ProcessInfo]) -> Table:
    """Processes as a table of :data:`PROCESS_COLUMNS`."""
    return Table(PROCESS_COLUMNS, [[p.pid, p.ppid, p.pgid, p.uid, p.cmdline] for p in found])


def _not_ours(process: ProcessInfo, my_uid: int | None = None) -> Finding:
    uid = process.uid
    if my_uid is not None and uid is not None and uid != my_uid:
        return Finding(
            "info",
            f"PID {process.pid}",
            f"belongs to another user (uid {uid}), left alone: {process.cmdline}",
            "ask its owner or an administrator to stop it if it holds the port or GPU memory; "
            "opsbook never signals another user's processes",
        )
    return Finding(
        "warning",
        f"PID {process.pid}",
        f"not started by this opsbook launch, left alone: {process.cmdline}",
        "if it is a leftover server of yours, stop it by its PID or process group "
        f"(kill -TERM -- -{process.pgid}); never by a name pattern",
    )


def _holder(process: ProcessInfo) -> str:
    if process.pid:
        return f"PID {process.pid} (uid {process.uid}: {process.cmdline})"
    return f"a process of uid {process.uid} (its PID is not visible to this user)"


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else "it printed nothing"


def record_running_script(host: RemoteHost, paths: LaunchPaths) -> str:
    """Note on the host the sha256 of the script the server was started from; returns it."""
    target = posixpath.join(paths.state_dir, RUNNING_SCRIPT)
    done = host.run(
        f"mkdir -p -- {shlex.quote(paths.state_dir)} && "
        f"sha256sum -- {shlex.quote(paths.script)} | cut -c1-64 | tee -- {shlex.quote(target)}",
        label=f"record the sha256 of {paths.script} in {target}",
    )
    return done.stdout.strip() if done.ok else ""


def running_script(host: RemoteHost, paths: LaunchPaths) -> str:
    """The sha256 of the script the last started server runs, as noted at its start."""
    target = posixpath.join(paths.state_dir, RUNNING_SCRIPT)
    done = host.run(f"cat -- {shlex.quote(target)} 2>/dev/null || true", label=f"read {target}")
    return done.stdout.strip()


def noted_running_script(host: RemoteHost, paths: LaunchPaths, notes: dict[str, str | None]) -> str:
    """The running script's hash from the notes a status probe read (``server_state`` asked
    with ``notes=(RUNNING_SCRIPT,)``), or read on its own when the status did not carry it."""
    if RUNNING_SCRIPT not in notes:
        return running_script(host, paths)
    return (notes[RUNNING_SCRIPT] or "").strip()
