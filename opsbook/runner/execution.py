"""One notebook run into a run folder: the folder, papermill, the results followed as they
come, and the executed notebook's redaction.

A run folder is named by UTC time, notebook and host (or deployment), and is never overwritten.
It holds the executed notebook (written even when a cell fails), the journal of remote
commands, the per-host results the notebook recorded, and ``run.json`` with the exit code.

Each stage notebook runs its stage on every host it is given, in one kernel, fanning out over
threads (:mod:`opsbook.stages`); the runner follows the results file while the notebook runs,
so each host's line is reported as it finishes.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from fnmatch import fnmatchcase
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opsbook.core import channel, exceptions
from opsbook.core.exceptions import RunError
from opsbook.core.redact import Redactor
from opsbook.core.results import (
    EXIT_BUSY,
    EXIT_OK,
    EXIT_ORDER,
    EXIT_PROBLEM,
    EXIT_TOOL_FAILED,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    HostResult,
    worst_exit_code,
)
from opsbook.runner import records
from opsbook.runner.interrupt import (
    RunInterrupted,
    quiet_abandoned_tasks,
    sealing,
    signal_name,
    signum_of,
)
from opsbook.runner.parameters import RUNNER_PARAMETERS, check_parameters, find_notebook

if TYPE_CHECKING:
    from opsbook import stages
    from opsbook.core.deployment import Deployment, HostSpec
    from opsbook.runner import lock as deploylock
    from opsbook.runner.shared_kernel import SharedKernel

# papermill, nbformat, the stages (Fabric, paramiko) and YAML are imported by the functions that use
# them: the CLI imports this module to parse its arguments, and must start in a blink.

OnResult = Callable[[HostResult], None]
OnProgress = Callable[[channel.StageProgress], None]
# How often the runner looks for results the notebook wrote.
FOLLOW_SECONDS = 0.2
# As opsbook.remote.hosts.DEFAULT_FORKS, without importing Fabric to read it.
DEFAULT_FORKS = 10
# The stage kernels' own log in the run folder (opsbook.runner.kernel keeps it off the terminal).
KERNEL_LOG = "kernel.log"


@dataclass
class RunRecord:
    """What one notebook run did and where its record is."""

    folder: Path
    notebook: str
    exit_code: int
    status: str
    message: str
    duration: float
    parameters: dict[str, Any] = field(default_factory=dict)
    results: list[HostResult] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.exit_code == EXIT_OK

    @property
    def executed_notebook(self) -> Path:
        return self.folder / Path(self.notebook).name


# Free space a run folder needs at the start: a deploy's record (six notebooks with their HTML
# copies, the journal) takes a few MB; below this a run would fail while filing it.
MIN_FREE_BYTES = 16 * 2**20


def new_run_folder(runs_dir: Path, name: str, host: str) -> Path:
    """Create ``runs_dir/<UTC time>-<notebook>-<host>``; a taken name gets a suffix.

    Raises:
        RunError: the runs folder cannot be written (read-only, not a folder, no permission)
            or is full: said before any host is touched.
    """
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    safe_host = "".join(c if c.isalnum() or c in ".-" else "_" for c in host)
    # Absolute: the notebook's kernel runs in notebooks/ and writes the journal here.
    runs_dir = runs_dir.resolve()
    base = runs_dir / f"{stamp}-{name}-{safe_host}"
    try:
        runs_dir.mkdir(parents=True, exist_ok=True)
        _check_free_space(runs_dir)
        for n in range(1, 1000):
            folder = base if n == 1 else base.with_name(f"{base.name}-{n}")
            try:
                # Private to the operator: the journal names hosts, users and their processes.
                folder.mkdir(mode=records.FOLDER_MODE)
                folder.chmod(records.FOLDER_MODE)
                return folder
            except FileExistsError:
                continue
    except OSError as e:
        raise _unwritable_runs(runs_dir, e) from None
    raise RunError(f"could not create a new run folder under {runs_dir}")


def _check_free_space(runs_dir: Path) -> None:
    stats = os.statvfs(runs_dir)
    free = stats.f_bavail * stats.f_frsize
    if free < MIN_FREE_BYTES:
        raise RunError(
            f"the runs folder {runs_dir} is full ({free // 1024} kB free; a run's record needs "
            f"{MIN_FREE_BYTES // 2**20} MB)",
            remedy="free space there, or give another folder with --runs-dir",
        )


def _unwritable_runs(runs_dir: Path, error: OSError) -> RunError:
    reason = (error.strerror or str(error)).lower()
    where = f": {error.filename}" if error.filename and str(error.filename) != str(runs_dir) else ""
    return RunError(
        f"cannot create a run folder in {runs_dir}: {reason}{where}",
        remedy="give a folder you can write to with --runs-dir (a run writes its record there)",
    )


def run_notebook(
    notebook: str | Path,
    deployment: str | Path,
    parameters: Mapping[str, Any] | None = None,
    runs_dir: str | Path = "runs",
    timeout: float | None = None,
    stage_timeout: float | None = None,
    *,
    forks: int = DEFAULT_FORKS,
    on_result: OnResult | None = None,
    on_progress: OnProgress | None = None,
    limit: str | None = None,
    on_folder: Callable[[Path], None] | None = None,
) -> RunRecord:
    """Execute one runbook notebook against a deployment and file the run.

    Args:
        notebook: a path or a stage name.
        deployment: the deployment file (passed to the notebook as ``deployment``).
        parameters: further notebook parameters; unknown names are refused.
        runs_dir: where run folders are made.
        timeout: seconds a single cell may run.
        stage_timeout: seconds the whole notebook may run.
        forks: how many hosts a stage notebook works on at once.
        on_result: called with each host's result as the notebook records it.
        on_progress: called with the steps long stages reach on each host.
        limit: only the hosts this pattern picks (:func:`limit_hosts`), as the notebook's
            ``hosts`` parameter.
        on_folder: called with the run folder once the hosts are locked, before the notebook
            runs (a detached run points its output there).

    Raises:
        RunError: the notebook or a parameter is unknown, or ``limit`` picks no host or is
            given with a ``hosts`` parameter.
        DeploymentError: the deployment file is unusable.
        HostLocked: the notebook changes hosts and another run holds one of them.
    """
    nb_path = find_notebook(str(notebook))
    given = dict(parameters or {})
    for name, flag in RUNNER_PARAMETERS.items():
        if name in given:
            raise RunError(
                f"the parameter {name} is set by opsbook run itself",
                remedy=f"give it as {flag}, not as a notebook parameter",
            )
    deployment_path = Path(deployment).resolve()
    from opsbook.core.deployment import load_deployment

    dep = load_deployment(deployment_path)
    params = {"deployment": str(deployment_path), **given}
    if _stages().for_notebook(nb_path.stem) is not None:
        params.setdefault("forks", forks)
    if limit is not None:
        if "hosts" in given:
            raise RunError("--limit and -p hosts both pick hosts", remedy="give only one of them")
        params["hosts"] = limit_hosts(dep, limit)
    check_parameters(nb_path, params)
    if isinstance(params.get("hosts"), list):  # before a run folder or a kernel: bad input
        from opsbook.stages.base import known_hosts

        known_hosts(dep, params["hosts"])
    folder = new_run_folder(Path(runs_dir), nb_path.stem, run_label(dep))
    redactor = Redactor(dep.secret_values())
    started = time.monotonic()
    locks = _lock_for(_stages().for_notebook(nb_path.stem), dep, folder, params)
    try:
        try:
            if on_folder is not None:
                on_folder(folder)
            record = execute_stage(
                nb_path,
                folder,
                params,
                redactor,
                timeout,
                stage_timeout,
                on_result,
                on_progress=on_progress,
            )
        except (RunInterrupted, KeyboardInterrupt) as e:
            with sealing():
                quiet_abandoned_tasks()
                record = _interrupted_record(
                    folder, nb_path, params, redactor, started, signum_of(e)
                )
    finally:
        with sealing():
            locks.release()
    with sealing():
        record.message = "; ".join([*locks.notes, record.message])
        recreate_lost_folder(folder)
        with records.private_files():
            write_run_json(folder, record)
            write_facts(
                folder,
                deployment=str(params["deployment"]),
                started="",
                status=record.status,
                hosts=[],
                results=record.results,
            )
        # A stage run alone (an upgrade, a diagnosis) is an incident record as a deploy is.
        records.close(folder)
    return record


@dataclass
class CheckRecord:
    """What a health check found on each host; nothing is filed (``--record`` files the
    diagnose notebook instead)."""

    exit_code: int
    status: str
    message: str
    duration: float
    results: list[HostResult] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.exit_code == EXIT_OK


def check_servers(
    deployment: str | Path,
    *,
    forks: int = DEFAULT_FORKS,
    on_result: OnResult | None = None,
    limit: str | None = None,
) -> CheckRecord:
    """The scheduled health check: the diagnose stage on every host of the deployment, in this
    process, over one SSH connection and one status probe per host; no kernel, no notebook,
    no run folder. The verdict and the exit code are those of ``run_notebook("05_diagnose")``,
    which is the same check with a record. ``limit`` checks only the hosts it picks
    (:func:`limit_hosts`).

    Raises:
        DeploymentError: the deployment file is unusable.
        RunError: ``limit`` picks no host of the deployment.
    """
    from opsbook.core.deployment import load_deployment

    started = time.monotonic()
    dep = load_deployment(Path(deployment).resolve())
    hosts = limit_hosts(dep, limit) if limit is not None else []
    stages = _stages()
    done = stages.run_stage(
        stages.DIAGNOSE,
        dep,
        hosts=hosts,
        forks=forks,
        on_result=on_result,
        compare=False,
        log_when_ready=False,
    )
    code, message = _verdict(done.results, None)
    return CheckRecord(
        exit_code=code,
        status=STATUS[code],
        message=Redactor(dep.secret_values()).redact(message),
        duration=round(time.monotonic() - started, 2),
        results=done.results,
    )


# An index or an inclusive range of indices in --limit, from 0 as Ansible's ``hosts[0:2]``.
_INDEX = re.compile(r"\[?(\d+)(?::(\d+))?\]?")


def limit_hosts(deployment: Deployment, limit: str) -> list[str]:
    """The names of the hosts ``limit`` picks, in the deployment's order (Ansible's
    ``--limit``): comma-separated host names or addresses, shell-style globs of them
    (``gpu-0[1-3]*``), or 0-based indices and inclusive ranges (``0``, ``[2]``, ``1:3``).

    Raises:
        RunError: an item picks no host, or the limit leaves out some of a cluster's nodes (a
            model served across hosts is deployed and checked whole); the error lists the hosts.
    """
    hosts = deployment.hosts
    names = [h.name for h in hosts]
    items = [item.strip() for item in limit.split(",") if item.strip()]
    picked: set[str] = set()
    listed = f"the hosts are: {', '.join(f'[{i}] {n}' for i, n in enumerate(names))}"
    if not items:
        raise RunError("--limit is empty: it picks no host", remedy=listed)
    for item in items:
        found = _picked_by(item, hosts)
        if not found:
            raise RunError(f"--limit {item!r} picks no host of {deployment.name}", remedy=listed)
        picked.update(found)
    chosen = [n for n in names if n in picked]
    if deployment.cluster is not None and len(chosen) < len(names):
        raise RunError(
            f"--limit {limit!r} picks {len(chosen)} of the {len(names)} nodes of a model "
            "served across them",
            remedy="a cluster is deployed and checked whole: leave --limit out",
        )
    return chosen


def _picked_by(item: str, hosts: list[HostSpec]) -> list[str]:
    index = _INDEX.fullmatch(item)
    if index is not None:
        first = int(index.group(1))
        last = int(index.group(2)) if index.group(2) is not None else first
        return [h.name for i, h in enumerate(hosts) if first <= i <= last]
    return [h.name for h in hosts if fnmatchcase(h.name, item) or fnmatchcase(h.address, item)]


def _lock_for(
    stage: stages.Stage | None, dep: Deployment, folder: Path, params: Mapping[str, Any]
) -> deploylock.Locks:
    """The deploy locks of the hosts a stage that changes them works on (none for a stage
    that only reads); a held host refuses the run before it begins.

    Raises:
        HostLocked: another run holds one of the hosts (the empty run folder is removed).
    """
    deploylock = _deploylock()
    if stage is None or not stage.changes_host:
        return deploylock.Locks()
    hosts = params.get("hosts") or ()
    names = [hosts] if isinstance(hosts, str) else [str(h) for h in hosts]
    try:
        return deploylock.acquire(dep, folder, names)
    except (exceptions.HostLocked, RunInterrupted, KeyboardInterrupt):
        folder.rmdir()
        raise


def _interrupted_record(
    folder: Path,
    nb_path: Path,
    params: Mapping[str, Any],
    redactor: Redactor,
    started: float,
    signum: int,
) -> RunRecord:
    redact_notebook(folder / nb_path.name, redactor)
    return RunRecord(
        folder=folder,
        notebook=nb_path.name,
        exit_code=128 + signum,
        status="interrupted",
        message=f"interrupted by {signal_name(signum)}: the notebook was stopped",
        duration=round(time.monotonic() - started, 2),
        parameters={k: redactor.redact(str(v)) for k, v in params.items()},
    )


def run_label(deployment: Deployment) -> str:
    """What a run folder is named after: the host, or the deployment when it has several."""
    return deployment.host.address if len(deployment.hosts) == 1 else deployment.name


def execute_stage(
    nb_path: Path,
    folder: Path,
    params: Mapping[str, Any],
    redactor: Redactor,
    timeout: float | None = None,
    stage_timeout: float | None = None,
    on_result: OnResult | None = None,
    journal: Path | None = None,
    on_progress: OnProgress | None = None,
    kernel: SharedKernel | None = None,
) -> RunRecord:
    """Run one notebook with papermill into ``folder``; the notebook is written even when a
    cell fails, and the journal and per-host results go next to it.

    Args:
        nb_path: the notebook.
        folder: the run folder.
        params: its parameters.
        redactor: masks secrets in what is filed.
        timeout: seconds a cell may run.
        stage_timeout: seconds the whole notebook may run (enforced from the main thread).
        on_result: called with each host's result while the notebook runs.
        journal: where the remote commands are journalled (default: ``journal.jsonl`` in
            ``folder``).
        on_progress: called with the steps long stages reach on each host.
        kernel: a kernel the stages of a run share (a fresh kernel per notebook without it).
    """
    import papermill
    from papermill.exceptions import PapermillExecutionError

    from opsbook.runner import engine

    output = folder / nb_path.name
    results_file = folder / f"{nb_path.stem}.results.jsonl"
    started = time.monotonic()
    env = {
        channel.JOURNAL_ENV: str(journal or folder / "journal.jsonl"),
        channel.OUTCOME_ENV: str(results_file),
        channel.HEADLESS_ENV: "1",
    }
    if kernel is not None:  # the stages that share the kernel share its SSH connections
        env[channel.KEEP_CONNECTIONS_ENV] = "1"
    failure: tuple[int, str] | None = None
    with _following(results_file, on_result, on_progress) as results:
        try:
            with _environment(env), _deadline(stage_timeout), records.private_files():
                shared = _kernel_options(kernel, env, folder / KERNEL_LOG)
                papermill.execute_notebook(
                    str(nb_path),
                    str(output),
                    parameters=dict(params),
                    engine_name=engine.register(),
                    progress_bar=False,
                    cwd=str(nb_path.parent),
                    execution_timeout=timeout,
                    **shared,
                )
        except PapermillExecutionError as e:
            failure = exit_code_for(e.ename), f"cell {e.exec_count} raised {e.ename}: {e.evalue}"
        except StageTimeout:
            message = f"the stage ran longer than {stage_timeout:g} s and was stopped"
            failure = EXIT_TOOL_FAILED, message
        except Exception as e:  # a dead kernel or a broken notebook still gets a record
            failure = EXIT_TOOL_FAILED, f"the notebook could not run: {type(e).__name__}: {e}"
    if failure is not None and kernel is not None:
        kernel.discard()  # a kernel that a cell failed or a deadline stopped is not reused
    code, message = _verdict(results, failure)
    # The run folder may be deleted while the stage runs: the deploy reports that itself, so
    # what was to be redacted is gone with it rather than a traceback.
    with contextlib.suppress(FileNotFoundError):
        redact_notebook(output, redactor)
        if kernel is None:  # a shared kernel's log is redacted when the run ends
            redact_text_file(folder / KERNEL_LOG, redactor)
    return RunRecord(
        folder=folder,
        notebook=nb_path.name,
        exit_code=code,
        status=STATUS[code],
        message=redactor.redact(message),
        duration=round(time.monotonic() - started, 2),
        parameters={k: redactor.redact(str(v)) for k, v in params.items()},
        results=results,
    )


def _verdict(results: list[HostResult], failure: tuple[int, str] | None) -> tuple[int, str]:
    """A notebook run's exit code (its worst host's, or the failure of the notebook itself)
    and message (the problems, host by host when there are several)."""
    codes = [worst_exit_code(results)] + ([failure[0]] if failure else [])
    code = max(codes, key=EXIT_ORDER.index)
    several = len({r.host for r in results}) > 1
    problems = [r for r in results if r.exit_code != EXIT_OK]
    shown = [f"{r.host}: {r.message}" if several else r.message for r in problems or results]
    if failure:
        shown.insert(0, failure[1])
    return code, "; ".join(shown) or "the notebook ran (it records no result)"


@contextlib.contextmanager
def _following(
    path: Path, on_result: OnResult | None, on_progress: OnProgress | None
) -> Iterator[list[HostResult]]:
    """Collect the results written to ``path`` while the body runs, reporting each to
    ``on_result`` (and each progress line to ``on_progress``) as it appears; the list is
    complete when the body is done."""
    follower = channel.Follower(path)
    results: list[HostResult] = []
    done = threading.Event()

    def take() -> None:
        for record in follower.new():
            if isinstance(record, HostResult):
                results.append(record)
                if on_result is not None:
                    on_result(record)
            elif isinstance(record, channel.Amended):
                # Said again only when the amendment changes what its line says.
                earlier = channel.amend(results, record.result)
                if on_result is not None and not channel.same_line(earlier, record.result):
                    on_result(record.result)
            elif isinstance(record, channel.StageProgress) and on_progress is not None:
                on_progress(record)

    def loop() -> None:
        while not done.wait(FOLLOW_SECONDS):
            take()

    thread = threading.Thread(target=loop, name="opsbook-results", daemon=True)
    thread.start()
    try:
        yield results
    finally:
        done.set()
        thread.join()
        take()


def redact_notebook(path: Path, redactor: Redactor) -> None:
    """Mask secrets in every cell and output of an executed notebook, in place.

    The library redacts what it logs, but a table a notebook displays is the host's own text
    (a command line with an API key, say): the record is the last place to catch it.
    """
    if not path.exists():
        return
    import nbformat

    # papermill checked the schema when it wrote the file a moment ago: read it as JSON.
    text = path.read_text(encoding="utf-8", errors="replace")
    try:
        nb = nbformat.v4.reads(text)
    except ValueError:
        # A signal cut papermill's writing of it short (a run interrupted mid-save): what
        # there is is masked as text.
        path.write_text(redactor.redact(text), encoding="utf-8")
        return
    changed = False

    def redact(text: str) -> str:
        nonlocal changed
        masked = redactor.redact(text)
        changed = changed or masked != text
        return masked

    for cell in nb.cells:
        cell.source = redact(cell.source)
        for out in cell.get("outputs", []):
            if "text" in out:
                out["text"] = redact(out["text"])
            if "traceback" in out:
                out["traceback"] = [redact(line) for line in out["traceback"]]
            if "evalue" in out:
                out["evalue"] = redact(out["evalue"])
            for mime, value in out.get("data", {}).items():
                if isinstance(value, str):
                    out["data"][mime] = redact(value)
    if changed:  # most records hold no secret: they are left as papermill wrote them
        nbformat.write(nb, path)


def redact_text_file(path: Path, redactor: Redactor) -> None:
    """Mask secrets in a text file of the run folder (the kernel's log), in place."""
    if path.exists():
        path.write_text(redactor.redact(path.read_text(errors="replace")))


def _kernel_options(
    kernel: SharedKernel | None, env: Mapping[str, str], log_path: Path
) -> dict[str, Any]:
    """papermill's kernel options: the deploy's shared kernel (with the stage's environment
    for the notebook's client to set in it), or a quiet one of its own."""
    if kernel is not None:
        return {"km": kernel.ready(log_path), "environment": dict(env)}
    from opsbook.runner.kernel import quiet_kernel_manager

    return {"kernel_manager_class": quiet_kernel_manager(log_path)}


def recreate_lost_folder(folder: Path) -> str:
    """A run folder deleted during the run is made again, so the results held in memory are
    still filed; the note says what was lost with it."""
    if folder.is_dir():
        return ""
    folder.mkdir(parents=True, exist_ok=True)
    return (
        f"the run folder {folder} was deleted during the run and made again with the results "
        "held in memory (the executed notebooks and journal written before it are lost)"
    )


def write_run_json(folder: Path, record: RunRecord) -> None:
    doc = {
        **{k: v for k, v in asdict(record).items() if k != "results"},
        "results": [channel.to_dict(r) for r in record.results],
    }
    metrics = records.recorded_metrics(folder)
    if metrics:
        doc["metrics"] = metrics
    verdicts = records.qualification_verdicts(folder, record.results)
    if verdicts:
        doc["qualification"] = verdicts
    (folder / "run.json").write_text(json.dumps(doc, default=str, indent=2) + "\n")


STATUS = {
    EXIT_OK: "ok",
    EXIT_PROBLEM: "problem found",
    EXIT_USAGE: "usage error",
    EXIT_TOOL_FAILED: "tool failed",
    EXIT_UNREACHABLE: "host unreachable",
    EXIT_BUSY: "server busy",
}


def exit_code_for(ename: str) -> int:
    """The exit code for an exception a notebook cell raised, by its class name."""
    cls = getattr(exceptions, ename, None)
    if isinstance(cls, type) and issubclass(cls, exceptions.HostUnreachable):
        return EXIT_UNREACHABLE
    return EXIT_TOOL_FAILED


class StageTimeout(Exception):
    """Raised inside a stage that ran past its deadline."""


@contextlib.contextmanager
def _deadline(seconds: float | None) -> Iterator[None]:
    # SIGALRM interrupts the wait for the kernel; papermill has saved every finished cell,
    # and nbclient shuts the kernel down on the way out.
    if not seconds or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum: int, frame: object) -> None:
        raise StageTimeout

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@contextlib.contextmanager
def _environment(values: Mapping[str, str]) -> Iterator[None]:
    # The kernel papermill starts inherits this process's environment.
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, old in saved.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old


def _deploylock() -> Any:
    from opsbook.runner import lock as deploylock

    return deploylock


def _stages() -> Any:
    from opsbook import stages

    return stages


def write_facts(folder: Path, **run: Any) -> Path:
    """``facts.json`` of a run folder (:func:`opsbook.runner.run_facts.write_facts`)."""
    # Its schema (pydantic) is imported as a run ends, not by every command that imports
    # the runner (`opsbook --help`).
    from opsbook.runner import run_facts

    path: Path = run_facts.write_facts(folder, **run)
    return path
