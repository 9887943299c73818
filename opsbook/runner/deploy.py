"""A deploy run: the runbook's stages over every host of a deployment, into one run folder.

``run_deploy`` goes through the stages, drops a host from the later stages once it fails, stops
when too many hosts failed, and with ``serial`` does it one batch of hosts at a time, stopping at
the first batch that fails. The stages of a deploy share one kernel
(:class:`~opsbook.runner.shared_kernel.SharedKernel`) and their HTML copies are exported on a
thread of their own while the next stages run.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Sequence
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
from opsbook.runner import records
from opsbook.runner.execution import (
    DEFAULT_FORKS,
    KERNEL_LOG,
    STATUS,
    OnProgress,
    OnResult,
    RunRecord,
    execute_stage,
    new_run_folder,
    recreate_lost_folder,
    redact_notebook,
    redact_text_file,
    run_label,
    write_run_json,
)
from opsbook.runner.interrupt import RunInterrupted, quiet_abandoned_tasks, signal_name, signum_of
from opsbook.runner.parameters import find_notebook
from opsbook.runner.shared_kernel import SharedKernel

if TYPE_CHECKING:
    from opsbook import stages
    from opsbook.core.deployment import Deployment

BATCH_PREFIX = "batch-"


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
    folder: Path
    redactor: Redactor
    apply: bool
    forks: int
    limits: tuple[float | None, float | None]
    on_result: OnResult | None
    on_progress: OnProgress | None
    restart: str = "changed"
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
        max_fail_percentage: stop the run once more than this share of hosts failed.
        serial: a rolling run: this many hosts (or this percentage) at a time, each batch
            through all the stages before the next; the run stops at the first batch in which
            a host fails, and the hosts of later batches are left untouched.
        on_result: called with each host's result of each stage as it finishes.
        on_progress: called with the steps long stages reach on each host.
        restart: the launch's ``restart`` option: "changed" restarts only a server that is not
            ready or whose script, env, configs or engine changed; "always" every server.

    Raises:
        DeploymentError: the deployment file is unusable.
        RunError: ``serial`` is not a count or a percentage, or ``restart`` not an allowed
            value.
        HostLocked: another deploy run holds a host (``opsbook.runner.lock``); nothing was done.
    """
    deployment_path = Path(deployment).resolve()
    from opsbook.core.deployment import load_deployment

    _stages().get("launch").options({"restart": restart})  # a bad value, before any host
    dep = load_deployment(deployment_path)
    names = [h.name for h in dep.hosts]
    batches = plan_batches(names, serial)
    folder = new_run_folder(Path(runs_dir), "deploy", run_label(dep))
    started_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
    started = time.monotonic()
    run = _DeployRun(
        deployment_path,
        folder,
        Redactor(dep.secret_values()),
        apply,
        forks,
        (timeout, stage_timeout),
        on_result,
        on_progress,
        restart,
    )
    # The kernel boots (and imports the stages) while the locks are taken and papermill is
    # imported; the notebooks of a deploy are preflight's neighbours.
    first = [h for h in dep.hosts if h.name in batches[0]] if batches else []
    run.kernel.start(folder / KERNEL_LOG, find_notebook("preflight").parent, first, forks)
    try:
        locks = _deploylock().acquire(dep, folder)
    except (exceptions.HostLocked, RunInterrupted, KeyboardInterrupt):
        run.kernel.discard()
        # Made a moment ago, holding only the kernel's log: no record of a run that never began.
        (folder / KERNEL_LOG).unlink(missing_ok=True)
        folder.rmdir()
        raise
    run.notes = locks.notes
    try:
        run.html.start()
        _deploy_batches(run, batches, names, max_fail_percentage)
    except (RunInterrupted, KeyboardInterrupt) as e:
        quiet_abandoned_tasks()
        run.interrupted = signum_of(e)
        run.stopped = f"interrupted by {signal_name(run.interrupted)}: the run was stopped"
        # The stage cut short never reached its own redaction.
        for notebook in folder.rglob("*.ipynb"):
            redact_notebook(notebook, run.redactor)
    finally:
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
    pages = [page.result() for page in run.pages]
    run.notebooks = [
        replace(entry, html=str(page.relative_to(folder)) if page else None)
        for entry, page in zip(run.notebooks, pages, strict=True)
    ]
    run.results = _with_skipped(run.results, names, run.stopped)
    return _file_deploy(run, dep, started_at, time.monotonic() - started, serial)


def _deploy_batches(
    run: _DeployRun, batches: list[list[str]], names: list[str], max_fail: float | None
) -> None:
    for number, batch in enumerate(batches, start=1):
        where = run.folder if len(batches) == 1 else run.folder / f"{BATCH_PREFIX}{number:02d}"
        where.mkdir(exist_ok=True)
        _deploy_batch(run, batch, where, len(names), max_fail)
        failed = [r.host for r in run.results if r.host in batch and not r.state.goes_on]
        if run.stopped:
            break
        if failed and number < len(batches):
            run.stopped = (
                f"batch {number} of {len(batches)} failed on {', '.join(dict.fromkeys(failed))}: "
                "the hosts of later batches were left untouched"
            )
            break
    unreachable = {r.host for r in run.results if r.state is State.UNREACHABLE}
    diagnosed = [n for n in names if n not in unreachable]
    if diagnosed and run.folder.is_dir():
        _run_stage(run, _stages().DIAGNOSE, diagnosed, run.folder)


def _deploy_batch(
    run: _DeployRun, batch: list[str], where: Path, total: int, max_fail: float | None
) -> None:
    active = list(batch)
    for stage in _stages().DEPLOY:
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
    declared = {p.name for p in _stages().parameters_of(stage)}
    if "apply" in declared:
        params["apply"] = run.apply
    if "restart" in declared:
        params["restart"] = run.restart
    if "pending" in declared and not run.apply:
        params["pending"] = _stages().launch_server.pending_changes(run.results, hosts)
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


def _with_skipped(results: list[HostResult], names: list[str], stopped: str) -> list[HostResult]:
    """Every host x stage of the run: a pair with no result is skipped, saying why."""
    done = {(r.host, r.stage) for r in results}
    filled = list(results)
    for host in names:
        mine = [r for r in results if r.host == host]
        reason = next(
            (f"not run: {r.state.value} at {r.stage}" for r in mine if not r.state.goes_on),
            f"not run: {stopped}" if stopped else "not run",
        )
        for stage in _stages().STAGES:
            if (host, stage.name) not in done:
                filled.append(HostResult(host, stage.name, State.SKIPPED, reason))
    return filled


def _file_deploy(
    run: _DeployRun, dep: Deployment, started_at: str, duration: float, serial: Any
) -> RunRecord:
    code = 128 + run.interrupted if run.interrupted else worst_exit_code(run.results)
    problems = [r for r in run.results if r.exit_code != EXIT_OK]
    if problems:
        first = problems[0]
        message = f"{len({r.host for r in problems})} of {len(dep.hosts)} host(s) not ok; " + (
            f"{first.host} {first.state.value} at {first.stage}: {first.message}"
        )
    elif run.interrupted:
        message = f"{len(run.notebooks)} stage(s) had finished, with no problem found"
    else:
        message = f"all {len(dep.hosts)} host(s) ok"
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
        hosts=[h.name for h in dep.hosts],
        stages=[s.name for s in _stages().STAGES],
        results=run.results,
        notebooks=run.notebooks,
        dry_run=not run.apply,
    )
    with records.private_files():
        write_run_json(run.folder, summary)
        records.write_summary(run.folder, doc)
    records.close(run.folder)
    return summary


def _deploylock() -> Any:
    from opsbook.runner import lock as deploylock

    return deploylock


def _stages() -> Any:
    from opsbook import stages

    return stages
