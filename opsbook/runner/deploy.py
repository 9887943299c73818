"""A deploy run: the runbook's stages over every host of a deployment, into one run folder.

``run_deploy`` goes through the stages, drops a host from the later stages once it fails, stops
when too many hosts failed, and with ``serial`` does it one batch of hosts at a time: before a
batch is taken down the hosts staying up must be healthy, and a batch that fails stops the run
unless ``max_fail_percentage`` lets it go on. Around each host it runs the deployment's hooks
and, with ``on_failure="rollback"``, brings a host whose launch failed back to what it ran
before (:mod:`opsbook.runner.rolling`). The stages of a deploy share one kernel
(:class:`~opsbook.runner.shared_kernel.SharedKernel`) and their HTML copies are exported on a
thread of their own while the next stages run.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opsbook.core import exceptions
from opsbook.core.exceptions import RunError
from opsbook.core.redact import Redactor
from opsbook.core.results import (
    EXIT_OK,
    EXIT_TOOL_FAILED,
    EXIT_UNREACHABLE,
    TOOL_FAILED,
    HostResult,
    State,
    worst_exit_code,
)
from opsbook.runner import records, rolling
from opsbook.runner.execution import (
    DEFAULT_FORKS,
    KERNEL_LOG,
    STATUS,
    OnProgress,
    OnResult,
    RunRecord,
    execute_stage,
    limit_hosts,
    new_run_folder,
    recreate_lost_folder,
    redact_notebook,
    redact_text_file,
    run_label,
    write_facts,
    write_run_json,
)
from opsbook.runner.interrupt import (
    RunInterrupted,
    quiet_abandoned_tasks,
    sealing,
    signal_name,
    signum_of,
)
from opsbook.runner.parameters import find_notebook, parameter_names
from opsbook.runner.shared_kernel import SharedKernel

if TYPE_CHECKING:
    from opsbook import stages
    from opsbook.core.deployment import Deployment, HostSpec
    from opsbook.runner.lock import Locks

BATCH_PREFIX = "batch-"
# The record's one column when every host was settled: the stages had nothing to do.
SETTLED = "settled"
# Restart values the launch takes (restart_rule.RESTART_WHEN), let through without the launch's
# own check: that check imports the stages (0.3-0.5 s), which would delay the kernel's start
# behind them; any other value still gets it, and its error naming the allowed ones.
KNOWN_RESTARTS = ("changed", "always")


def plan_batches(hosts: Sequence[str], serial: int | str | None) -> list[list[str]]:
    """The hosts in batches for a rolling run: ``serial`` hosts at a time (a count, or a
    percentage such as ``"25%"``); all at once when it is empty or 0.

    Raises:
        RunError: ``serial`` is neither a positive count nor a percentage.
    """
    if serial in (None, "", 0):
        return [list(hosts)]
    text = str(serial).strip()
    try:
        if text.endswith("%"):
            percent = int(text[:-1])
            size = max(1, len(hosts) * percent // 100) if percent > 0 else 0
        else:
            size = int(text)
    except ValueError:
        size = 0
    if size < 1:
        raise RunError(
            f"serial must be a number of hosts or a percentage, not {serial!r}",
            remedy="e.g. -p serial 1, -p serial 2 or -p serial 25%",
        )
    return [list(hosts[i : i + size]) for i in range(0, len(hosts), size)]


def too_many_failed(results: Sequence[HostResult], total: int, percentage: float | None) -> bool:
    """Ansible's ``max_fail_percentage``: more than ``percentage`` of the hosts failed or were
    unreachable."""
    if percentage is None or total == 0:
        return False
    bad = {r.host for r in results if r.state in (State.FAILED, State.UNREACHABLE)}
    return len(bad) * 100 / total > percentage


@dataclass
class _DeployRun:
    """What a deploy run collects as it goes."""

    deployment: Path
    dep: Deployment
    folder: Path
    redactor: Redactor
    apply: bool
    forks: int
    limits: tuple[float | None, float | None]
    on_result: OnResult | None
    on_progress: OnProgress | None
    restart: str = "changed"
    on_failure: str = "leave"
    qualify: str = "off"
    # Run every stage even when the hosts are settled.
    recheck: bool = False
    results: list[HostResult] = field(default_factory=list)
    notebooks: list[records.NotebookEntry] = field(default_factory=list)
    stopped: str = ""
    kernel: SharedKernel = field(default_factory=SharedKernel)
    # The HTML copies, exported by a helper process while the next stages run.
    html: records.HtmlExports = field(default_factory=records.HtmlExports)
    pages: list[Future[Path | None]] = field(default_factory=list)
    # Deploy-lock notes (a stale lock taken over), and the signal that interrupted the run.
    notes: list[str] = field(default_factory=list)
    interrupted: int = 0
    # Whether every host was settled (opsbook.steps.settled): then no stage was run.
    settled: bool = False


def run_deploy(
    deployment: str | Path,
    runs_dir: str | Path = "runs",
    *,
    apply: bool = True,
    timeout: float | None = None,
    stage_timeout: float | None = None,
    forks: int = DEFAULT_FORKS,
    max_fail_percentage: float | None = None,
    serial: int | str | None = None,
    on_result: OnResult | None = None,
    on_progress: OnProgress | None = None,
    restart: str = "changed",
    on_failure: str = "leave",
    limit: str | None = None,
    on_folder: Callable[[Path], None] | None = None,
    qualify: str = "off",
    recheck: bool = False,
) -> RunRecord:
    """The whole runbook on every host of a deployment, into one run folder: the stages 00 to
    04 in order, a host dropped from the later stages once it fails, then 05_diagnose on every
    reachable host; an HTML copy of each notebook, ``summary.json`` and ``index.html`` with a
    host x stage grid. The folder is made read-only when the run ends.

    Args:
        deployment: the deployment file.
        runs_dir: where run folders are made.
        apply: passed to the stages that change the host; False makes the run a rehearsal
            in which a host with something to change is reported "would change".
        timeout: seconds a single cell may run.
        stage_timeout: seconds each stage may run.
        forks: how many hosts a stage works on at once.
        max_fail_percentage: stop the run once more than this share of the hosts failed (the
            failures so far over all the hosts of the run, checked after each stage and each
            batch); with ``serial``, a batch that fails within it does not stop the roll.
        serial: a rolling run: this many hosts (or this percentage) at a time, each batch
            through all the stages before the next. Before a batch is taken down, the hosts
            staying up must pass the health check (``opsbook check``), or the run stops; without
            ``max_fail_percentage`` the run stops at the first batch in which a host fails. The
            hosts of batches not reached are left untouched.
        on_result: called with each host's result of each stage as it finishes.
        on_progress: called with the steps long stages reach on each host.
        restart: the launch's ``restart`` option: "changed" restarts only a server that is not
            ready or whose script, env, configs or engine changed; "always" every server.
        on_failure: "leave" a host whose launch failed as it is, or "rollback": put back its
            previous launch script and the configs this run patched, and start it again.
        limit: only the hosts this pattern picks (:func:`~opsbook.runner.execution.limit_hosts`).
        on_folder: called with the run folder once the hosts are locked, before the first
            stage (a detached run points its output there).
        qualify: "off", or the profile of 06_qualify run after the launch on the hosts that
            launched (``quick``, ``standard``, ``full``), in an apply only.
        recheck: run every stage even when every host is settled. Without it, a deploy
            (apply or dry run, ``restart="changed"``, no qualification, not a cluster) first
            asks each host whether it is settled (:mod:`opsbook.steps.settled`: its server is
            the one the last complete deploy left ready, and nothing the deploy reads or
            writes changed since); when every host is, the record says so, one ``settled``
            result per host, and no stage runs.

    Raises:
        DeploymentError: the deployment file is unusable.
        RunError: ``serial`` is not a count or a percentage, ``restart``, ``on_failure`` or
            ``qualify`` not an allowed value (or a rollback asked of a cluster), or ``limit``
            picks no host.
        HostLocked: another deploy run holds a host (``opsbook.runner.lock``); nothing was done.
    """
    deployment_path = Path(deployment).resolve()
    from opsbook.core.deployment import load_deployment

    if restart not in KNOWN_RESTARTS:
        _stages().get("launch").options({"restart": restart})  # a bad value, before any host
    rolling.check_on_failure(on_failure)
    if qualify != "off":
        _stages().QUALIFY.options({"profile": qualify})  # a bad value, before any host
    dep = load_deployment(deployment_path)
    names = limit_hosts(dep, limit) if limit is not None else [h.name for h in dep.hosts]
    if on_failure == "rollback" and dep.cluster is not None:
        raise RunError(
            "-p on_failure rollback brings back hosts that serve on their own, not the nodes "
            "of a model served across hosts",
            remedy="leave on_failure out; `opsbook cluster stop` and a deploy of the previous "
            "deployment file bring a cluster back",
        )
    batches = plan_batches(names, serial)
    folder = new_run_folder(Path(runs_dir), "deploy", run_label(dep))
    started_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
    started = time.monotonic()
    run = _DeployRun(
        deployment_path,
        dep,
        folder,
        Redactor(dep.secret_values()),
        apply,
        forks,
        (timeout, stage_timeout),
        on_result,
        on_progress,
        restart,
        on_failure,
        qualify,
        recheck,
    )
    # The kernel boots (and imports the stages) while the locks are taken and papermill is
    # imported, and while a run that may have nothing to do asks the hosts whether they are
    # settled (over the connections of their locks); the notebooks of a deploy are
    # preflight's neighbours. A run with nothing to do shuts it down unused.
    first = [h for h in dep.hosts if h.name in batches[0]] if batches else []
    may_be_settled = _may_be_settled(run)
    run.kernel.start(folder / KERNEL_LOG, find_notebook("preflight").parent, first, forks)
    try:
        journal = _run_journal(run) if may_be_settled else None
        locks = _deploylock().acquire(dep, folder, names, journal=journal)
    except (exceptions.HostLocked, RunInterrupted, KeyboardInterrupt):
        run.kernel.discard()
        # Made a moment ago, holding only the kernel's log and the locks' journal: no record
        # of a run that never began.
        (folder / KERNEL_LOG).unlink(missing_ok=True)
        _journal(run).unlink(missing_ok=True)
        folder.rmdir()
        raise
    run.notes = locks.notes
    try:
        if on_folder is not None:
            on_folder(folder)
        if may_be_settled and _all_settled(run, names, locks):
            run.settled = True
            run.kernel.discard()
            (folder / KERNEL_LOG).unlink(missing_ok=True)
        else:
            run.html.start()
            _deploy_batches(run, batches, names, max_fail_percentage)
            _note_settled(run, names)
    except (RunInterrupted, KeyboardInterrupt) as e:
        with sealing():
            _note_interrupted(run, folder, e)
    finally:
        # A second signal while the record is written would leave it half written.
        with sealing():
            _close_run(run, locks, folder)
    with sealing():
        return _file_deploy_run(run, names, started_at, started, serial, max_fail_percentage, limit)


def _note_interrupted(run: _DeployRun, folder: Path, e: BaseException) -> None:
    quiet_abandoned_tasks()
    run.interrupted = signum_of(e)
    run.stopped = f"interrupted by {signal_name(run.interrupted)}: the run was stopped"
    # The stage cut short never reached its own redaction.
    for notebook in folder.rglob("*.ipynb"):
        redact_notebook(notebook, run.redactor)


def _close_run(run: _DeployRun, locks: Locks, folder: Path) -> None:
    # The last HTML copy is made while the locks go and the kernel is shut down.
    closing = threading.Thread(target=run.html.close, name="opsbook-html-close")
    closing.start()
    try:
        locks.release()
        run.kernel.discard()
    finally:
        closing.join()
    # The kernels are done writing their logs (the shared one in the run folder, one
    # started after a failed stage in its batch folder).
    for log in folder.rglob(KERNEL_LOG):
        with contextlib.suppress(FileNotFoundError):  # a folder deleted during the run
            redact_text_file(log, run.redactor)


def _file_deploy_run(
    run: _DeployRun,
    names: list[str],
    started_at: str,
    started: float,
    serial: int | str | None,
    max_fail_percentage: float | None,
    limit: str | None,
) -> RunRecord:
    pages = [page.result() for page in run.pages]
    run.notebooks = [
        replace(entry, html=str(page.relative_to(run.folder)) if page else None)
        for entry, page in zip(run.notebooks, pages, strict=True)
    ]
    if not run.settled:
        run.results = _with_skipped(run.results, names, run.stopped, _qualifies(run))
    settings = {
        "max_fail_percentage": "" if max_fail_percentage is None else f"{max_fail_percentage:g}",
        "limit": limit or "",
    }
    return _file_deploy(run, names, started_at, time.monotonic() - started, serial, settings)


def _deploy_batches(
    run: _DeployRun, batches: list[list[str]], names: list[str], max_fail: float | None
) -> None:
    for number, batch in enumerate(batches, start=1):
        if len(batches) > 1 and _unhealthy_before(run, number, batches, names):
            break
        where = run.folder if len(batches) == 1 else run.folder / f"{BATCH_PREFIX}{number:02d}"
        where.mkdir(exist_ok=True)
        _deploy_with_hooks(run, batch, where, len(names), max_fail)
        if run.stopped:
            break
        failed = _failed_in(run.results, batch)
        if failed and number < len(batches) and max_fail is None:
            run.stopped = (
                f"batch {number} of {len(batches)} failed on {', '.join(failed)}: "
                "the hosts of later batches were left untouched"
            )
            break
    unreachable = {r.host for r in run.results if r.state is State.UNREACHABLE}
    diagnosed = [n for n in names if n not in unreachable]
    if diagnosed and run.folder.is_dir():
        _run_stage(run, _stages().DIAGNOSE, diagnosed, run.folder)


def _failed_in(results: list[HostResult], batch: list[str]) -> list[str]:
    """The hosts of ``batch`` that a stage left out of the later stages, or a hook or a
    rollback failed on (a dry run's hook, not run, is no failure; nor is a dry run's "would
    change": its apply goes on)."""
    steps = (rolling.PRE_HOST, rolling.POST_HOST, rolling.ROLLBACK)
    return list(
        dict.fromkeys(
            r.host
            for r in results
            if r.host in batch
            and (r.state in (State.FAILED, State.UNREACHABLE) or not r.state.goes_on)
            and r.state is not State.WOULD_CHANGE
            and not (r.stage in steps and r.state is State.SKIPPED)
        )
    )


def _unhealthy_before(
    run: _DeployRun, number: int, batches: list[list[str]], names: list[str]
) -> bool:
    """Whether the hosts staying up while batch ``number`` is taken down failed the health
    check; the run is then stopped, each of them with a failed (or unreachable) result.
    A cluster's nodes go down and up together: it has no hosts staying up."""
    if run.dep.cluster is not None:
        return False
    batch = batches[number - 1]
    failed = {r.host for r in run.results if r.state in (State.FAILED, State.UNREACHABLE)}
    staying = rolling.hosts_staying_up(names, batch, failed)
    checked = rolling.health_check(run.dep, [*batch, *staying], run.forks, _journal(run))
    unhealthy = rolling.unhealthy_before(checked, batch, staying)
    if not unhealthy:
        return False
    run.stopped = rolling.stop_reason(number, len(batches), unhealthy)
    for result in unhealthy:
        said = replace(
            result,
            stage=rolling.HEALTH,
            message=f"before batch {number}: {result.message}",
        )
        _record(run, said)
    return True


def _deploy_with_hooks(
    run: _DeployRun, batch: list[str], where: Path, total: int, max_fail: float | None
) -> None:
    """One batch: each host's pre hook, the stages on the hosts whose hook passed, the
    rollback of those whose launch failed (``on_failure="rollback"``), then the post hook of
    each host that serves again."""
    rollback = run.on_failure == "rollback" and run.apply
    snapshots = rolling.take_snapshots(run.dep, batch, run.forks, _journal(run)) if rollback else {}
    active = _pre_hooks(run, batch)
    if active:
        _deploy_batch(run, active, where, total, max_fail)
    if rollback:
        _roll_back(run, batch, snapshots)
    _post_hooks(run, batch)
    if not run.stopped and too_many_failed(run.results, total, max_fail):
        run.stopped = f"more than {max_fail:g}% of the hosts failed: the run was stopped"


def _pre_hooks(run: _DeployRun, batch: list[str]) -> list[str]:
    """Run the pre hook of each host of the batch (one after the other, as a load balancer
    takes them): the hosts whose hook passed, or all of them without a hook or in a dry run."""
    argv = run.dep.rolling.pre_host
    if not argv:
        return list(batch)
    going = []
    for spec in _specs(run, batch):
        result = _hook(run, rolling.PRE_HOST, argv, spec)
        if result.state is not State.FAILED:
            going.append(spec.name)
    return going


def _post_hooks(run: _DeployRun, batch: list[str]) -> None:
    """Run the post hook of each host of the batch that serves again: its launch went through,
    or it was rolled back."""
    argv = run.dep.rolling.post_host
    if not argv:
        return
    launched = {r.host for r in run.results if r.stage == "launch" and r.state is not State.FAILED}
    launched -= {r.host for r in run.results if r.state is State.UNREACHABLE}
    launched |= {
        r.host for r in run.results if r.stage == rolling.ROLLBACK and r.state is State.CHANGED
    }
    for spec in _specs(run, batch):
        if spec.name in launched:
            _hook(run, rolling.POST_HOST, argv, spec)


def _hook(run: _DeployRun, step: str, argv: Sequence[str], spec: HostSpec) -> HostResult:
    folder = run.deployment.parent
    if not run.apply:
        result = rolling.hook_not_run(step, argv, spec, folder)
    else:
        timeout = run.dep.rolling.hook_timeout
        result = rolling.run_hook(
            step, argv, spec, folder=folder, timeout=timeout, redactor=run.redactor
        )
    return _record(run, result)


def _roll_back(run: _DeployRun, batch: list[str], snapshots: dict[str, Any]) -> None:
    """Bring back each host of the batch whose launch failed (one that could not be reached
    cannot be)."""
    failed = [
        r.host
        for r in run.results
        if r.host in batch and r.stage == "launch" and r.state is State.FAILED
    ]
    patched = {
        r.host for r in run.results if r.stage == "config-patch" and r.state is State.CHANGED
    }
    for result in rolling.roll_back(run.dep, failed, snapshots, patched, run.forks, _journal(run)):
        _record(run, result)


def _record(run: _DeployRun, result: HostResult) -> HostResult:
    """Keep a result of the steps this process ran (not a notebook's: those are masked as
    they are recorded), its secrets masked, and report it."""
    mask = run.redactor.redact
    result = replace(
        result,
        message=mask(result.message),
        findings=tuple(
            replace(f, subject=mask(f.subject), message=mask(f.message), remedy=mask(f.remedy))
            for f in result.findings
        ),
    )
    run.results.append(result)
    if run.on_result is not None:
        run.on_result(result)
    return result


def _specs(run: _DeployRun, names: list[str]) -> list[HostSpec]:
    return [spec for spec in run.dep.hosts if spec.name in names]


def _journal(run: _DeployRun) -> Path:
    return run.folder / "journal.jsonl"


def _deploy_batch(
    run: _DeployRun, batch: list[str], where: Path, total: int, max_fail: float | None
) -> None:
    active = list(batch)
    qualify = (_stages().QUALIFY,) if _qualifies(run) else ()
    for stage in (*_stages().DEPLOY, *qualify):
        if not active:
            return
        results = _run_stage(run, stage, active, where)
        active = _going_on(run, results)
        if not run.folder.is_dir():
            run.stopped = "the run folder was deleted during the run: the later stages were not run"
            return
        if too_many_failed(run.results, total, max_fail):
            run.stopped = f"more than {max_fail:g}% of the hosts failed: the run was stopped"
            return


def _run_stage(
    run: _DeployRun, stage: stages.Stage, hosts: list[str], where: Path
) -> list[HostResult]:
    nb_path = find_notebook(stage.notebook)
    params: dict[str, Any] = {"deployment": str(run.deployment), "hosts": hosts, "forks": run.forks}
    declared = parameter_names(nb_path)
    if "apply" in declared:
        params["apply"] = run.apply
    if "restart" in declared:
        params["restart"] = run.restart
    if "profile" in declared:
        params["profile"] = run.qualify
    if "pending" in declared and not run.apply:
        params["pending"] = _stages().base.pending_changes(run.results, hosts)
    journal = run.folder / "journal.jsonl"
    record = execute_stage(
        nb_path,
        where,
        params,
        run.redactor,
        *run.limits,
        run.on_result,
        journal=journal,
        on_progress=run.on_progress,
        kernel=run.kernel,
    )
    results = _complete(record, stage, hosts, run.on_result)
    run.results += results
    run.pages.append(run.html.submit(record.executed_notebook))
    run.notebooks.append(
        records.NotebookEntry(
            stage=stage.name,
            notebook=str(record.executed_notebook.relative_to(run.folder)),
            html=None,  # filled in from run.pages when the exports are done
            hosts=tuple(hosts),
            exit_code=record.exit_code,
            message=record.message,
            duration=record.duration,
        )
    )
    return results


def _going_on(run: _DeployRun, results: list[HostResult]) -> list[str]:
    """The hosts that take part in the next stages: those ok or changed, and in a dry run
    those that would change too (its apply goes on with them changed, and the dry run's later
    stages say what they would do then: the launch, with what 02 and 03 would change)."""
    goes_on = [State.WOULD_CHANGE] if not run.apply else []
    return [r.host for r in results if r.state.goes_on or r.state in goes_on]


def _complete(
    record: RunRecord, stage: stages.Stage, hosts: list[str], on_result: OnResult | None
) -> list[HostResult]:
    """The stage's result for each host it was given: a host the notebook recorded nothing for
    (a cell raised before or after the fan-out) gets the notebook's failure as its result."""
    by_host = {r.host: r for r in record.results if r.stage == stage.name}
    results = []
    for host in hosts:
        result = by_host.get(host)
        if result is None:
            state = State.UNREACHABLE if record.exit_code == EXIT_UNREACHABLE else State.FAILED
            result = HostResult(host, stage.name, state, record.message, failure_id=TOOL_FAILED)
            if on_result is not None:
                on_result(result)
        results.append(result)
    return results


def _qualifies(run: _DeployRun) -> bool:
    """Whether the run ends its hosts' stages with 06_qualify (``-p qualify``, in an apply)."""
    return run.qualify != "off" and run.apply


def _with_skipped(
    results: list[HostResult], names: list[str], stopped: str, qualifies: bool = False
) -> list[HostResult]:
    """Every host x stage of the run (06_qualify when it ``qualifies``): a pair with no
    result is skipped, saying why."""
    done = {(r.host, r.stage) for r in results}
    filled = list(results)
    for host in names:
        mine = [r for r in results if r.host == host]
        reason = next(
            (f"not run: {r.state.value} at {r.stage}" for r in mine if not r.state.goes_on),
            f"not run: {stopped}" if stopped else "not run",
        )
        for stage in _stages().STAGES:
            if stage is _stages().QUALIFY and not qualifies:
                continue
            if (host, stage.name) not in done:
                filled.append(HostResult(host, stage.name, State.SKIPPED, reason))
    return filled


def _file_deploy(
    run: _DeployRun,
    names: list[str],
    started_at: str,
    duration: float,
    serial: Any,
    settings: dict[str, str],
) -> RunRecord:
    dep = run.dep
    code = 128 + run.interrupted if run.interrupted else worst_exit_code(run.results)
    problems = [r for r in run.results if r.exit_code != EXIT_OK]
    if problems:
        first = problems[0]
        message = f"{len({r.host for r in problems})} of {len(names)} host(s) not ok; " + (
            f"{first.host} {first.state.value} at {first.stage}: {first.message}"
        )
    elif run.interrupted:
        message = f"{len(run.notebooks)} stage(s) had finished, with no problem found"
    elif run.settled:
        done = "would change" if not run.apply else "had to change"
        message = f"all {len(names)} host(s) settled: nothing {done}, no stage was run"
    else:
        message = f"all {len(names)} host(s) ok"
    if run.stopped:
        message = f"{run.stopped}; {message}"
    lost = recreate_lost_folder(run.folder)
    if lost and not run.interrupted:
        code = EXIT_TOOL_FAILED  # the record is incomplete: never "ok"
    message = "; ".join([*run.notes, *([lost] if lost else []), message])
    summary = RunRecord(
        folder=run.folder,
        notebook="deploy",
        exit_code=code,
        status=STATUS.get(code, "interrupted"),
        message=run.redactor.redact(message),
        duration=round(duration, 2),
        parameters={
            "deployment": str(run.deployment),
            "apply": str(run.apply),
            "serial": str(serial or ""),
            "forks": str(run.forks),
            "restart": run.restart,
            "on_failure": run.on_failure,
            "qualify": run.qualify,
            "recheck": str(run.recheck),
            **settings,
        },
        results=run.results,
    )
    doc = records.RunSummary(
        name=dep.name,
        deployment=str(run.deployment),
        started=started_at,
        status=summary.status,
        exit_code=code,
        message=summary.message,
        duration=summary.duration,
        parameters=summary.parameters,
        hosts=names,
        stages=record_steps(run.results),
        results=run.results,
        notebooks=run.notebooks,
        dry_run=not run.apply,
    )
    with records.private_files():
        write_run_json(run.folder, summary)
        records.write_summary(run.folder, doc)
        write_facts(
            run.folder,
            deployment=str(run.deployment),
            started=started_at,
            status=summary.status,
            hosts=names,
            results=run.results,
        )
    records.close(run.folder)
    return summary


def record_steps(results: Sequence[HostResult]) -> list[str]:
    """The columns of a deploy's record: the stages, and the steps around them that ran (the
    health check before a batch and the pre hook first, the rollback and the post hook after
    the launch)."""
    ran = {r.stage for r in results}
    if ran == {SETTLED}:
        return [SETTLED]
    names = [s.name for s in _stages().STAGES if s is not _stages().QUALIFY or s.name in ran]
    before = [s for s in (rolling.HEALTH, rolling.PRE_HOST) if s in ran]
    after = [s for s in (rolling.ROLLBACK, rolling.POST_HOST) if s in ran]
    launch = names.index("launch") + 1
    return [*before, *names[:launch], *after, *names[launch:]]


def _may_be_settled(run: _DeployRun) -> bool:
    """Whether the run asks the hosts if they are settled before it runs any stage: not when
    told to recheck, to restart ready servers or to qualify, nor for a cluster (its nodes'
    launch is one; the note is a single host's)."""
    return (
        not run.recheck
        and run.restart == "changed"
        and not _qualifies(run)
        and run.dep.cluster is None
    )


def _run_journal(run: _DeployRun) -> Any:
    """The run's journal, for the commands this process sends (the stages' go there too)."""
    from opsbook.remote.journal import Journal

    return Journal(run.redactor, str(_journal(run)))


def _all_settled(run: _DeployRun, names: list[str], locks: Locks) -> bool:
    """Ask each host, over its lock's connection, whether it is settled; when every one is,
    their results say so (one ``settled`` result each) and the run has nothing to do. A host
    whose lock was not taken (unreachable) is not settled."""
    from opsbook.remote.hosts import HostGroup
    from opsbook.steps import settled

    view_of = _settled_views(run)
    started = time.monotonic()

    def ask(host: Any) -> settled.Settled:
        view, digest, secrets = view_of(host)
        return settled.is_settled(host, view, digest, secrets)

    locked = {host.name: host for host, _ in locks.held}
    found: dict[str, object] = {
        name: RunError("the deploy lock was not taken: the host was not reached")
        for name in names
        if name not in locked
    }
    # The lock's connections: closed by its release.
    found |= HostGroup([locked[n] for n in names if n in locked], run.forks).map(ask)
    verdicts = [found.get(name) for name in names]
    took = round(time.monotonic() - started, 2)
    if not all(isinstance(v, settled.Settled) and v.settled for v in verdicts):
        _say_not_settled(run, names, verdicts, took)
        return False
    nothing = "nothing would change" if not run.apply else "nothing to do"
    for name, verdict in zip(names, verdicts, strict=True):
        assert isinstance(verdict, settled.Settled)
        said = f"{nothing}: {verdict.message}"
        _record(run, HostResult(name, SETTLED, State.OK, said, duration=took))
    return True


def _settled_views(run: _DeployRun) -> Callable[[Any], tuple[Deployment, str, list[str]]]:
    """For a host: the deployment as it sees it, that view's digest and the secrets' values,
    as the settled question and the settled note both send them."""
    from opsbook.steps import settled

    code = settled.opsbook_digest()
    secrets = run.dep.secret_values()

    def view_of(host: Any) -> tuple[Deployment, str, list[str]]:
        view = run.dep.for_host(host.spec)
        return view, settled.deployment_digest(view, code, secrets), secrets

    return view_of


def _say_not_settled(
    run: _DeployRun, names: list[str], verdicts: list[object], took: float
) -> None:
    """A line per host that is not settled, saying why: the run then runs every stage."""
    from opsbook.core.channel import StageProgress
    from opsbook.steps import settled

    if run.on_progress is None:
        return
    for name, verdict in zip(names, verdicts, strict=True):
        if isinstance(verdict, settled.Settled):
            if verdict.settled:
                continue
            why = verdict.message
        else:
            why = f"not asked ({type(verdict).__name__}: {verdict})"
        text = run.redactor.redact(f"not settled: {why}; every stage runs")
        run.on_progress(StageProgress(name, SETTLED, took, text))


def _note_settled(run: _DeployRun, names: list[str]) -> None:
    """After a complete apply, note on each host whose every step went through that its ready
    server is what this run left: the next deploy with nothing to change does nothing. A note
    not written (a host not ready, or not reached) only means the next deploy runs every
    stage."""
    if not run.apply or run.stopped or run.dep.cluster is not None or not run.folder.is_dir():
        return
    bad = {r.host for r in run.results if not r.ok}
    ran = {r.host for r in run.results if r.stage == "diagnose"}
    hosts = [name for name in names if name in ran and name not in bad]
    if not hosts:
        return
    from opsbook.steps import settled

    view_of = _settled_views(run)

    def note(host: Any) -> object:
        view, digest, secrets = view_of(host)
        return settled.note_settled(host, view, run.folder.name, digest, secrets)

    group = rolling.host_group(run.dep, hosts, run.forks, _journal(run))
    try:
        group.map(note)
    finally:
        group.close()


def _deploylock() -> Any:
    from opsbook.runner import lock as deploylock

    return deploylock


def _stages() -> Any:
    from opsbook import stages

    return stages
