"""What a rolling deploy does around each batch of hosts, in the runner's own process: the health
check of the hosts staying up before a batch is taken down, the operator's hooks around each
host (a load balancer's drain and add), and the way back for a host whose new launch failed.

A hook is a command of the deployment file's ``rolling`` section, run on this machine without
a shell (its ``{host}`` and ``{address}`` replaced); its output goes into the record, secrets
masked. A rollback puts back the launch script the host had before the batch (read here just
before it), restores the configs ``02_config_patch`` patched in this run from their backups,
and starts the server again from them (:mod:`opsbook.stages.launch_server` with
``restart="always"``).
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opsbook.core.exceptions import OpsbookError, RunError
from opsbook.core.redact import Redactor
from opsbook.core.results import Finding, HostResult, State

if TYPE_CHECKING:
    from opsbook.core.deployment import Deployment, HostSpec

# The steps of a deploy around the stages, as results and the record name them.
HEALTH, PRE_HOST, ROLLBACK, POST_HOST = "health-check", "pre-host", "rollback", "post-host"
# -p on_failure: leave a host whose launch failed as it is, or bring back what it ran before.
ON_FAILURE = ("leave", "rollback")
# The most of a hook's output a result keeps (its last characters: where the error is).
HOOK_OUTPUT_CHARS = 2000


def check_on_failure(value: str) -> str:
    """``value``, one of :data:`ON_FAILURE`.

    Raises:
        RunError: it is not.
    """
    if value not in ON_FAILURE:
        raise RunError(
            f"on_failure {value!r} is not one of: {', '.join(ON_FAILURE)}",
            remedy="-p on_failure leave (the default: a host whose launch failed is left as it "
            "is) or -p on_failure rollback (its previous script and config, started again)",
        )
    return value


# -- the health of the hosts staying up -------------------------------------------------------


def hosts_staying_up(names: Sequence[str], batch: Sequence[str], failed: set[str]) -> list[str]:
    """The hosts that must serve while ``batch`` is taken down: all but the batch's and those
    already failed in this run (``--max-fail-percentage`` counts them)."""
    return [n for n in names if n not in batch and n not in failed]


def unhealthy_before(
    checked: Sequence[HostResult], batch: Sequence[str], staying: Sequence[str]
) -> list[HostResult]:
    """The hosts staying up that the check found not healthy, when taking ``batch`` down
    would stop a server that serves (a batch none of whose hosts serves takes nothing down:
    a first deploy, or a host being repaired)."""
    serving = {r.host for r in checked if r.state is State.OK}
    if not serving.intersection(batch):
        return []
    return [r for r in checked if r.host in staying and r.state is not State.OK]


def health_check(
    deployment: Deployment, hosts: Sequence[str], forks: int, journal: Path | None = None
) -> list[HostResult]:
    """``opsbook check`` on ``hosts``: the diagnose stage without the log of a ready server."""
    from opsbook import stages

    group = host_group(deployment, hosts, forks, journal)
    try:
        done = stages.run_stage(
            stages.DIAGNOSE,
            deployment,
            group=group,
            on_result=None,
            compare=False,
            log_when_ready=False,
        )
    finally:
        group.close()
    return list(done.results)


def stop_reason(number: int, total: int, unhealthy: Sequence[HostResult]) -> str:
    said = "; ".join(f"{r.host} {r.state.value}: {r.message}" for r in unhealthy)
    return (
        f"before batch {number} of {total}, not every host staying up was healthy ({said}): "
        f"batch {number} and later ones were not taken down"
    )


# -- hooks ------------------------------------------------------------------------------------


def hook_argv(argv: Sequence[str], spec: HostSpec, folder: Path) -> list[str]:
    """The hook's arguments for one host: ``{host}`` and ``{address}`` replaced, and a relative
    program path (``./lb.sh``) taken from the deployment file's folder."""
    words = [w.replace("{host}", spec.name).replace("{address}", spec.address) for w in argv]
    program = words[0]
    if "/" in program and not os.path.isabs(program):
        words[0] = str(folder / program)
    return words


def run_hook(
    step: str,
    argv: Sequence[str],
    spec: HostSpec,
    *,
    folder: Path,
    timeout: float,
    redactor: Redactor,
) -> HostResult:
    """Run one host's hook: changed when it exits 0, failed otherwise (its output, the last
    :data:`HOOK_OUTPUT_CHARS` characters with secrets masked, in a finding)."""
    words = hook_argv(argv, spec, folder)
    shown = redactor.redact(" ".join(words))
    started = time.monotonic()
    try:
        done = subprocess.run(
            words,
            cwd=folder,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        message = f"{shown} did not end within {timeout:g} s (stopped)"
        return _hook_result(spec, step, False, message, "", started)
    except OSError as e:
        message = f"{shown} could not run: {e.strerror or e}"
        return _hook_result(spec, step, False, message, "", started)
    output = redactor.redact((done.stdout + done.stderr)[-HOOK_OUTPUT_CHARS:])
    message = f"{shown} exited {done.returncode}"
    return _hook_result(spec, step, done.returncode == 0, message, output, started)


def _hook_result(
    spec: HostSpec, step: str, ok: bool, message: str, output: str, started: float
) -> HostResult:
    findings: list[Finding] = []
    if not ok:
        remedy = "fix the hook (rolling in the deployment file) or the system it calls"
        findings.append(Finding("error", spec.name, message, remedy=remedy))
    if output:
        findings.append(Finding("info", spec.name, f"output: {output}"))
    return HostResult(
        spec.name,
        step,
        State.CHANGED if ok else State.FAILED,
        message,
        findings=tuple(findings),
        duration=round(time.monotonic() - started, 3),
    )


def hook_not_run(step: str, argv: Sequence[str], spec: HostSpec, folder: Path) -> HostResult:
    """A dry run's line for a hook: what an apply would run (a dry run changes nothing)."""
    words = " ".join(hook_argv(argv, spec, folder))
    return HostResult(spec.name, step, State.SKIPPED, f"dry run: an apply would run {words}")


# -- rollback ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Snapshot:
    """What a host ran before its batch: the launch script's text (None: there was none) and
    the sha256 of each config file 02_config_patch may patch (None: absent)."""

    script: str | None
    configs: dict[str, str | None] = field(default_factory=dict)


def take_snapshots(
    deployment: Deployment, hosts: Sequence[str], forks: int, journal: Path | None = None
) -> dict[str, Any]:
    """Per host name its :class:`Snapshot`, or the exception that kept it from being read (the
    host then cannot be rolled back; the deploy itself will say what is wrong with it)."""
    group = host_group(deployment, hosts, forks, journal)
    try:
        return group.map(lambda host: _snapshot(host, deployment.for_host(host.spec)))
    finally:
        group.close()


def host_group(
    deployment: Deployment, hosts: Sequence[str], forks: int, journal: Path | None
) -> Any:
    """The hosts, their commands journalled in the run's journal (where the stages' are)."""
    from opsbook.remote.hosts import HostGroup
    from opsbook.remote.journal import Journal

    shared = Journal(Redactor(deployment.secret_values()), str(journal) if journal else None)
    return HostGroup.from_deployment(deployment, forks, hosts, journal=shared)


def _snapshot(host: Any, view: Deployment) -> Snapshot:
    from opsbook.core.exceptions import TransferError
    from opsbook.steps import patch, server

    paths = server.resolve_paths(host, view)
    try:
        script: str | None = host.read_bytes(paths.script).decode(errors="replace")
    except TransferError:
        script = None
    try:
        state = patch.read_config_state(host, view.model_path)
        configs = {name: f.sha256 if f.exists else None for name, f in state.files.items()}
    except OpsbookError:
        configs = {}
    return Snapshot(script, configs)


def roll_back(
    deployment: Deployment,
    hosts: Sequence[str],
    snapshots: dict[str, Any],
    patched: set[str],
    forks: int,
    journal: Path | None = None,
) -> list[HostResult]:
    """Bring each host back to what it ran before its batch (``patched``: the hosts whose
    configs this run patched) and start its server again; a result per host."""
    if not hosts:
        return []
    group = host_group(deployment, hosts, forks, journal)

    def one(host: Any) -> HostResult:
        started = time.monotonic()
        view = deployment.for_host(host.spec)
        try:
            result = _roll_back_one(host, view, snapshots.get(host.name), host.name in patched)
        except OpsbookError as e:
            result = HostResult(host.name, ROLLBACK, State.FAILED, f"rollback failed: {e.message}")
        finally:
            host.close()
        return replace(result, duration=round(time.monotonic() - started, 3))

    try:
        answers = group.map(one)
    finally:
        group.close()
    return [
        a
        if isinstance(a, HostResult)
        else HostResult(n, ROLLBACK, State.FAILED, f"rollback failed: {type(a).__name__}: {a}")
        for n, a in answers.items()
    ]


def _roll_back_one(
    host: Any, view: Deployment, snapshot: Snapshot | BaseException | None, patched: bool
) -> HostResult:
    from opsbook.stages import launch_server
    from opsbook.steps import patch, script

    name = host.name
    if not isinstance(snapshot, Snapshot):
        why = f": {snapshot}" if snapshot else ""
        message = f"not rolled back: what it ran before could not be read{why}"
        return HostResult(name, ROLLBACK, State.FAILED, message)
    if snapshot.script is None:
        message = "not rolled back: it had no launch script before this run"
        return HostResult(name, ROLLBACK, State.FAILED, message)
    findings: list[Finding] = []
    put_back = script.upload_script(host, view, snapshot.script)
    if not put_back.ok:
        return HostResult(name, ROLLBACK, State.FAILED, f"rollback failed: {put_back.message}")
    if patched:
        restored = patch.restore_patch(host, view.model_path)
        if not restored.ok:
            return HostResult(name, ROLLBACK, State.FAILED, f"rollback failed: {restored.message}")
        findings += _configs_not_as_before(host, view, snapshot)
    relaunch = launch_server.run(host, view, launch_server.Options(apply=True, restart="always"))
    what = "the previous launch script" + (" and config" if patched else "")
    if relaunch.state is not State.CHANGED:
        message = (
            f"rollback failed: {what} put back, but its server did not start: "
            f"{relaunch.verdict.message}"
        )
        return HostResult(
            name,
            ROLLBACK,
            State.FAILED,
            message,
            failure_id=relaunch.failure_id,
            findings=(*findings, *relaunch.verdict.findings),
            script_sha256=relaunch.script_sha256,
        )
    message = f"rolled back to {what}: {relaunch.verdict.message}"
    return HostResult(
        name,
        ROLLBACK,
        State.CHANGED,
        message,
        findings=tuple(findings),
        script_sha256=relaunch.script_sha256,
    )


def _configs_not_as_before(host: Any, view: Deployment, snapshot: Snapshot) -> list[Finding]:
    """A warning per config file that the restore did not bring back to what the host had
    before this run (the backups are the originals from before opsbook's first patch)."""
    from opsbook.steps import patch

    now = patch.read_config_state(host, view.model_path)
    return [
        Finding(
            "warning",
            name,
            "restored from its backup, which differs from the file before this run (the backup "
            "is the original from before opsbook's first patch)",
        )
        for name, before in snapshot.configs.items()
        if name in now.files
        and (now.files[name].sha256 if now.files[name].exists else None) != before
    ]


def recap_notes(results: Sequence[HostResult]) -> dict[str, str]:
    """Per host, what the recap adds to its line: "rolled back", or why the rollback failed."""
    notes = {}
    for r in results:
        if r.stage == ROLLBACK:
            notes[r.host] = "rolled back" if r.state is State.CHANGED else r.message
    return notes
