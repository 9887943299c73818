"""Running a runbook notebook headless with papermill, into a run folder of its own.

A run folder is named by UTC time, notebook and host, and is never overwritten. It holds the
executed notebook (written even when a cell fails), the journal of remote commands, the
verdicts the notebook recorded, and ``run.json`` with the exit code.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import papermill
from papermill.exceptions import PapermillExecutionError

from opsbook import exceptions, outcome
from opsbook.deployment import load_deployment
from opsbook.exceptions import RunError
from opsbook.journal import JOURNAL_ENV
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


def new_run_folder(runs_dir: Path, notebook: Path, host: str) -> Path:
    """Create ``runs_dir/<UTC time>-<notebook>-<host>``; a taken name gets a suffix."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    safe_host = "".join(c if c.isalnum() or c in ".-" else "_" for c in host)
    base = runs_dir / f"{stamp}-{notebook.stem}-{safe_host}"
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
) -> RunRecord:
    """Execute one runbook notebook against a deployment and file the run.

    Args:
        notebook: a path or a stage name.
        deployment: the deployment file (passed to the notebook as ``deployment``).
        parameters: further notebook parameters; unknown names are refused.
        runs_dir: where run folders are made.
        timeout: seconds a single cell may run.

    Raises:
        RunError: the notebook or a parameter is unknown.
        DeploymentError: the deployment file is unusable.
    """
    nb_path = find_notebook(str(notebook))
    deployment_path = Path(deployment).resolve()
    dep = load_deployment(deployment_path)
    params = {"deployment": str(deployment_path), **dict(parameters or {})}
    check_parameters(nb_path, params)
    folder = new_run_folder(Path(runs_dir), nb_path, dep.host.address)
    output = folder / nb_path.name
    verdicts_file = folder / "verdicts.jsonl"
    redactor = Redactor(dep.secret_values())
    started = time.monotonic()
    env = {JOURNAL_ENV: str(folder / "journal.jsonl"), outcome.OUTCOME_ENV: str(verdicts_file)}
    try:
        with _environment(env):
            papermill.execute_notebook(
                str(nb_path),
                str(output),
                parameters=params,
                progress_bar=False,
                cwd=str(nb_path.parent),
                execution_timeout=timeout,
            )
        verdicts = outcome.read(verdicts_file)
        problems = [v for v in verdicts if not v["ok"]]
        code = EXIT_PROBLEM if problems else EXIT_OK
        message = "; ".join(v["message"] for v in problems) or "all checks passed"
    except PapermillExecutionError as e:
        verdicts = outcome.read(verdicts_file)
        code = exit_code_for(e.ename)
        message = f"cell {e.exec_count} raised {e.ename}: {e.evalue}"
    record = RunRecord(
        folder=folder,
        notebook=nb_path.name,
        exit_code=code,
        status=STATUS[code],
        message=redactor.redact(message),
        duration=round(time.monotonic() - started, 2),
        parameters={k: redactor.redact(str(v)) for k, v in params.items()},
        verdicts=verdicts,
    )
    (folder / "run.json").write_text(json.dumps(asdict(record), default=str, indent=2) + "\n")
    return record


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
