"""Running a runbook notebook headless with papermill, into a run folder of its own.

A run folder is named by UTC time, notebook and host, and is never overwritten. It holds the
executed notebook (written even when a cell fails), the journal of remote commands, the
verdicts the notebook recorded, and ``run.json`` with the exit code.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import nbformat
import papermill
from papermill.exceptions import PapermillExecutionError

from opsbook import exceptions, outcome, records
from opsbook.deployment import load_deployment
from opsbook.exceptions import RunError
from opsbook.journal import JOURNAL_ENV
from opsbook.progress import HEADLESS_ENV
from opsbook.redact import Redactor

# Exit codes of `opsbook run`, documented in the README.
EXIT_OK = 0
EXIT_PROBLEM = 1  # the notebook ran and a check found a problem on the host
EXIT_USAGE = 2  # bad arguments or deployment file
EXIT_TOOL_FAILED = 3  # opsbook or the notebook itself failed
EXIT_UNREACHABLE = 4  # the host could not be reached

NOTEBOOKS_DIR = Path(__file__).resolve().parent.parent / "notebooks"


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
    verdicts: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.exit_code == EXIT_OK

    @property
    def executed_notebook(self) -> Path:
        return self.folder / Path(self.notebook).name


def find_notebook(name: str) -> Path:
    """A notebook by path, or by stage name (``00_preflight``, ``preflight``) in notebooks/.

    Raises:
        RunError: no such notebook.
    """
    path = Path(name)
    if path.is_file():
        return path
    candidates = sorted(NOTEBOOKS_DIR.glob("*.ipynb")) + sorted(Path("notebooks").glob("*.ipynb"))
    stem = path.stem
    for nb in candidates:
        if nb.stem == stem or nb.stem.split("_", 1)[-1] == stem:
            return nb
    known = ", ".join(sorted({nb.stem for nb in candidates})) or "none found"
    raise RunError(f"no notebook named {name!r}", remedy=f"use a path or one of: {known}")


def check_parameters(notebook: Path, parameters: Mapping[str, Any]) -> None:
    """Refuse parameter names the notebook does not declare (papermill only warns).

    Raises:
        RunError: a name is unknown.
    """
    declared = set(papermill.inspect_notebook(str(notebook)))
    unknown = sorted(set(parameters) - declared)
    if unknown:
        raise RunError(
            f"{notebook.name} has no parameter(s) {', '.join(unknown)}",
            remedy=f"its parameters are: {', '.join(sorted(declared)) or 'none'}",
        )


def new_run_folder(runs_dir: Path, name: str, host: str) -> Path:
    """Create ``runs_dir/<UTC time>-<notebook>-<host>``; a taken name gets a suffix."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    safe_host = "".join(c if c.isalnum() or c in ".-" else "_" for c in host)
    # Absolute: the notebook's kernel runs in notebooks/ and writes the journal here.
    runs_dir = runs_dir.resolve()
    base = runs_dir / f"{stamp}-{name}-{safe_host}"
    runs_dir.mkdir(parents=True, exist_ok=True)
    for n in range(1, 1000):
        folder = base if n == 1 else base.with_name(f"{base.name}-{n}")
        try:
            folder.mkdir()
            return folder
        except FileExistsError:
            continue
    raise RunError(f"could not create a new run folder under {runs_dir}")


def run_notebook(
    notebook: str | Path,
    deployment: str | Path,
    parameters: Mapping[str, Any] | None = None,
    runs_dir: str | Path = "runs",
    timeout: float | None = None,
    stage_timeout: float | None = None,
) -> RunRecord:
    """Execute one runbook notebook against a deployment and file the run.

    Args:
        notebook: a path or a stage name.
        deployment: the deployment file (passed to the notebook as ``deployment``).
        parameters: further notebook parameters; unknown names are refused.
        runs_dir: where run folders are made.
        timeout: seconds a single cell may run.
        stage_timeout: seconds the whole notebook may run.

    Raises:
        RunError: the notebook or a parameter is unknown.
        DeploymentError: the deployment file is unusable.
    """
    nb_path = find_notebook(str(notebook))
    deployment_path = Path(deployment).resolve()
    dep = load_deployment(deployment_path)
    params = {"deployment": str(deployment_path), **dict(parameters or {})}
    check_parameters(nb_path, params)
    folder = new_run_folder(Path(runs_dir), nb_path.stem, dep.host.address)
    redactor = Redactor(dep.secret_values())
    record = execute_stage(nb_path, folder, params, redactor, timeout, stage_timeout)
    (folder / "run.json").write_text(json.dumps(asdict(record), default=str, indent=2) + "\n")
    return record


def execute_stage(
    nb_path: Path,
    folder: Path,
    params: Mapping[str, Any],
    redactor: Redactor,
    timeout: float | None = None,
    stage_timeout: float | None = None,
) -> RunRecord:
    """Run one notebook with papermill into ``folder``; the notebook is written even when a
    cell fails, and the journal and verdicts go next to it.

    Args:
        nb_path: the notebook.
        folder: the run folder.
        params: its parameters.
        redactor: masks secrets in what is filed.
        timeout: seconds a cell may run.
        stage_timeout: seconds the whole notebook may run (enforced from the main thread).
    """
    output = folder / nb_path.name
    verdicts_file = folder / f"{nb_path.stem}.verdicts.jsonl"
    started = time.monotonic()
    env = {
        JOURNAL_ENV: str(folder / "journal.jsonl"),
        outcome.OUTCOME_ENV: str(verdicts_file),
        HEADLESS_ENV: "1",
    }
    try:
        with _environment(env), _deadline(stage_timeout):
            papermill.execute_notebook(
                str(nb_path),
                str(output),
                parameters=dict(params),
                progress_bar=False,
                cwd=str(nb_path.parent),
                execution_timeout=timeout,
            )
        verdicts = outcome.read(verdicts_file)
        problems = [v for v in verdicts if not v["ok"]]
        code = EXIT_PROBLEM if problems else EXIT_OK
        shown = problems or verdicts
        message = (
            "; ".join(v["message"] for v in shown) or "the notebook ran (it records no verdict)"
        )
    except PapermillExecutionError as e:
        verdicts = outcome.read(verdicts_file)
        code = exit_code_for(e.ename)
        message = f"cell {e.exec_count} raised {e.ename}: {e.evalue}"
    except StageTimeout:
        verdicts = outcome.read(verdicts_file)
        code = EXIT_TOOL_FAILED
        message = f"the stage ran longer than {stage_timeout:g} s and was stopped"
    except Exception as e:  # a dead kernel or a broken notebook still gets a record
        verdicts = outcome.read(verdicts_file)
        code = EXIT_TOOL_FAILED
        message = f"the notebook could not run: {type(e).__name__}: {e}"
    redact_notebook(output, redactor)
    return RunRecord(
        folder=folder,
        notebook=nb_path.name,
        exit_code=code,
        status=STATUS[code],
        message=redactor.redact(message),
        duration=round(time.monotonic() - started, 2),
        parameters={k: redactor.redact(str(v)) for k, v in params.items()},
        verdicts=verdicts,
    )


def redact_notebook(path: Path, redactor: Redactor) -> None:
    """Mask secrets in every cell and output of an executed notebook, in place.

    The library redacts what it logs, but a table a notebook displays is the host's own text
    (a command line with an API key, say): the record is the last place to catch it.
    """
    if not path.exists():
        return
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        cell.source = redactor.redact(cell.source)
        for out in cell.get("outputs", []):
            if "text" in out:
                out["text"] = redactor.redact(out["text"])
            if "traceback" in out:
                out["traceback"] = [redactor.redact(line) for line in out["traceback"]]
            if "evalue" in out:
                out["evalue"] = redactor.redact(out["evalue"])
            for mime, value in out.get("data", {}).items():
                if isinstance(value, str):
                    out["data"][mime] = redactor.redact(value)
    nbformat.write(nb, path)


DEPLOY_STAGES = (
    "00_preflight",
    "01_download_check",
    "02_config_patch",
    "03_launch_script",
    "04_launch",
)
DIAGNOSE_STAGE = "05_diagnose"


def run_deploy(
    deployment: str | Path,
    runs_dir: str | Path = "runs",
    *,
    apply: bool = True,
    timeout: float | None = None,
    stage_timeout: float | None = None,
) -> RunRecord:
    """The whole runbook into one run folder: stages 00 to 04 in order, stopping at the first
    that fails, then 05_diagnose; an HTML copy of each, ``summary.json`` and ``index.html``.
    The folder is made read-only when the run ends.

    Args:
        deployment: the deployment file.
        runs_dir: where run folders are made.
        apply: passed to the stages that change the host; False makes the run a rehearsal
            that stops at the first stage with something to change.
        timeout: seconds a single cell may run.
        stage_timeout: seconds each stage may run.

    Raises:
        DeploymentError: the deployment file is unusable.
    """
    deployment_path = Path(deployment).resolve()
    dep = load_deployment(deployment_path)
    folder = new_run_folder(Path(runs_dir), "deploy", dep.host.address)
    limits = (timeout, stage_timeout)
    redactor = Redactor(dep.secret_values())
    started_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
    stage_records: list[tuple[str, RunRecord]] = []
    for stage in DEPLOY_STAGES:
        record = _deploy_stage(stage, deployment_path, folder, redactor, apply, limits)
        stage_records.append((stage, record))
        if not record.ok:
            break
    failed = next((r for _, r in stage_records if not r.ok), None)
    diagnosis = _deploy_stage(DIAGNOSE_STAGE, deployment_path, folder, redactor, apply, limits)
    stage_records.append((DIAGNOSE_STAGE, diagnosis))
    final = failed or diagnosis
    summary = RunRecord(
        folder=folder,
        notebook="deploy",
        exit_code=final.exit_code,
        status=STATUS[final.exit_code],
        message=f"{Path(final.notebook).stem}: {final.message}" if failed else final.message,
        duration=round(sum(r.duration for _, r in stage_records), 2),
        parameters={"deployment": str(deployment_path), "apply": str(apply)},
        verdicts=[v for _, r in stage_records for v in r.verdicts],
    )
    stages = [_stage_summary(stage, record) for stage, record in stage_records]
    skipped = DEPLOY_STAGES[len(stage_records) - 1 :] if failed else ()
    stages[-1:-1] = [_skipped(stage) for stage in skipped]
    run_doc = {
        **asdict(summary),
        "name": dep.name,
        "host": dep.host.name,
        "deployment": str(deployment_path),
        "started": started_at,
    }
    (folder / "run.json").write_text(json.dumps(run_doc, default=str, indent=2) + "\n")
    records.write_summary(folder, run_doc, stages)
    records.close(folder)
    return summary


def _deploy_stage(
    stage: str,
    deployment: Path,
    folder: Path,
    redactor: Redactor,
    apply: bool,
    limits: tuple[float | None, float | None],
) -> RunRecord:
    nb_path = find_notebook(stage)
    params: dict[str, Any] = {"deployment": str(deployment)}
    if "apply" in papermill.inspect_notebook(str(nb_path)):
        params["apply"] = apply
    return execute_stage(nb_path, folder, params, redactor, *limits)


def _stage_summary(stage: str, record: RunRecord) -> records.StageSummary:
    page = records.export_html(record.executed_notebook)
    return records.StageSummary(
        stage=stage,
        notebook=record.notebook,
        status=record.status,
        exit_code=record.exit_code,
        duration=record.duration,
        message=record.message,
        html=page.name if page else None,
    )


def _skipped(stage: str) -> records.StageSummary:
    return records.StageSummary(stage, f"{stage}.ipynb", "skipped", None, 0.0, "not run")


STATUS = {
    EXIT_OK: "ok",
    EXIT_PROBLEM: "problem found",
    EXIT_USAGE: "usage error",
    EXIT_TOOL_FAILED: "tool failed",
    EXIT_UNREACHABLE: "host unreachable",
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
