"""The record of an interactive session: a JupyterLab session files a run folder too.

Opening a notebook's deployment form in JupyterLab starts a session: a run folder
``runs/<UTC>-session-<notebook>-<host>`` like the one ``opsbook run`` makes, with the journal of
every remote command (the kernel's hosts write to it, redacted, as they do headless), the
per-host results of every stage run, ``session.json`` (who, where, when, every deployment and
host the session touched, parameters, which opsbook), ``clicks.jsonl`` (every button: label,
hosts, UTC time, user, seconds, result) and every executed cell from the form's first draw on,
the kernel's cells before it first, from IPython's history (``cells.jsonl`` and
``session.ipynb``, :mod:`opsbook.runner.cells`), all written as the session goes. It is a
record from then on, filed or not: its status is the state at the end (:func:`outcome`).
:meth:`Session.file` writes ``summary.json`` and ``index.html`` and makes the folder
read-only, as a deploy run's is.
"""

from __future__ import annotations

import getpass
import json
import os
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Protocol

from opsbook import __version__
from opsbook.core import channel
from opsbook.core.channel import JOURNAL_ENV, OUTCOME_ENV, RUNS_DIR_ENV
from opsbook.core.deployment import Deployment
from opsbook.core.redact import Redactor
from opsbook.core.results import EXIT_OK, EXIT_PROBLEM, HostResult, Result, worst_exit_code
from opsbook.runner import records
from opsbook.runner.cells import CELLS, CellRecorder, write_notebook

# The notebooks live in notebooks/; their records go to the checkout's runs/, as `make demo`'s.
DEFAULT_RUNS_DIR = "../runs"
HEADER = "session.json"
CLICKS = "clicks.jsonl"


class Clicked(Protocol):
    """What a session records of a click (:class:`opsbook.widgets.gates.Click`)."""

    @property
    def label(self) -> str: ...
    @property
    def started(self) -> datetime: ...
    @property
    def seconds(self) -> float: ...
    @property
    def user(self) -> str: ...
    @property
    def result(self) -> Result: ...
    @property
    def hosts(self) -> tuple[str, ...]: ...


@dataclass
class Session:
    """An interactive session's run folder and what it records."""

    folder: Path
    notebook: str
    deployment: str
    name: str
    hosts: list[str]
    parameters: dict[str, str]
    started: datetime
    user: str
    machine: str
    redactor: Redactor
    version: str = __version__
    clicks: int = 0
    filed: bool = False
    deployments: list[str] = field(default_factory=list)
    recorder: CellRecorder | None = None
    _clock: float = field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        self.deployments = self.deployments or [self.deployment]

    @property
    def journal(self) -> Path:
        return self.folder / "journal.jsonl"

    @property
    def results_file(self) -> Path:
        return self.folder / f"{self.notebook}.results.jsonl"

    def header(self) -> dict[str, Any]:
        return {
            "notebook": self.notebook,
            "started": self.started.isoformat(timespec="seconds"),
            "user": self.user,
            "machine": self.machine,
            "opsbook": self.version,
            "deployment": self.deployment,
            "deployments": self.deployments,
            "hosts": self.hosts,
            "parameters": self.parameters,
        }

    def write_header(self) -> None:
        (self.folder / HEADER).write_text(json.dumps(self.header(), indent=2) + "\n")

    def touch(self, deployment: Deployment, deployment_path: str) -> None:
        """The session now works with ``deployment``: it and its hosts join those on record
        (a switch in the form adds, never replaces)."""
        path = str(Path(deployment_path).resolve())
        hosts = [h.name for h in deployment.hosts]
        if self.filed or (path in self.deployments and set(hosts) <= set(self.hosts)):
            return
        self.deployments = list(dict.fromkeys([*self.deployments, path]))
        self.hosts = list(dict.fromkeys([*self.hosts, *hosts]))
        self.secrets(deployment)
        self.write_header()

    def secrets(self, deployment: Deployment) -> None:
        """Mask ``deployment``'s secrets too, in everything recorded from now on."""
        for value in deployment.secret_values():
            self.redactor.add(value)

    def record_cells(self, shell: Any) -> None:
        """Write every cell ``shell`` runs from now on (:mod:`opsbook.runner.cells`)."""
        if self.recorder is None and not self.filed:
            self.recorder = CellRecorder(self.folder, self.redactor.redact)
            self.recorder.attach(shell)

    def record_this_kernel(self) -> None:
        """:meth:`record_cells` of the IPython shell this process runs, if any."""
        from IPython import get_ipython

        shell = get_ipython()
        if shell is not None:
            self.record_cells(shell)

    def stop_recording_cells(self) -> None:
        if self.recorder is not None:
            self.recorder.detach()
            self.recorder = None

    def note_click(self, click: Clicked) -> None:
        """Append a click to ``clicks.jsonl`` (nothing once filed)."""
        if self.filed:
            return
        self.clicks += 1
        doc = {
            "label": click.label,
            "hosts": list(click.hosts),
            "started": click.started.isoformat(timespec="seconds"),
            "seconds": round(click.seconds, 2),
            "user": click.user,
            "ok": click.result.ok,
            "message": self.redactor.redact(click.result.message),
        }
        with (self.folder / CLICKS).open("a") as f:
            f.write(json.dumps(doc) + "\n")

    def save_notebook(self) -> None:
        """``session.ipynb`` as the page now stands (after a click and the redraw it made)."""
        if not self.filed:
            write_notebook(self.folder)

    def file(self) -> Result:
        """Write the summary and index page, stop recording, make the folder read-only."""
        if self.filed:
            return Result(True, f"already filed: {self.folder}")
        self.stop_recording_cells()
        write_notebook(self.folder)
        results = channel.read(self.results_file) if self.results_file.exists() else []
        code, message = outcome(self.folder, self.notebook, self.user)
        summary = records.RunSummary(
            name=self.name,
            deployment=", ".join(self.deployments),
            started=self.started.isoformat(timespec="seconds"),
            status=status_of(code),
            exit_code=code,
            message=message,
            duration=round(time.monotonic() - self._clock, 2),
            parameters=self.parameters,
            hosts=self.hosts,
            stages=list(dict.fromkeys(r.stage for r in results)),
            results=results,
            notebooks=[],
        )
        records.write_summary(self.folder, summary)
        from opsbook.runner import run_facts  # pydantic: imported as a session is filed

        run_facts.write_facts(
            self.folder,
            deployment=self.deployments[0] if self.deployments else "",
            started=summary.started,
            status=summary.status,
            hosts=self.hosts,
            results=results,
        )
        _stop_recording(self)
        records.close(self.folder)
        self.filed = True
        return Result(True, f"filed {self.folder} (read-only): {message}")


def _make_private(folder: Path, names: list[str]) -> None:
    """Create the session's files 0600 (as a headless run's are): they are appended to for
    as long as the session lasts, from a kernel whose umask is the operator's."""
    for name in names:
        os.close(os.open(folder / name, os.O_WRONLY | os.O_CREAT, 0o600))


def start(
    notebook: str,
    deployment: Deployment,
    deployment_path: str,
    parameters: Mapping[str, Any],
    runs_dir: str | None = None,
) -> Session:
    """Start a session's run folder and point this process's journal and results at it."""
    from opsbook.runner.execution import new_run_folder, run_label

    where = Path(runs_dir or os.environ.get(RUNS_DIR_ENV) or DEFAULT_RUNS_DIR)
    folder = new_run_folder(where, f"session-{notebook}", run_label(deployment))
    redactor = Redactor(deployment.secret_values())
    session = Session(
        folder=folder,
        notebook=notebook,
        deployment=str(Path(deployment_path).resolve()),
        name=deployment.name,
        hosts=[h.name for h in deployment.hosts],
        parameters={k: redactor.redact(str(v)) for k, v in parameters.items()},
        started=datetime.now(timezone.utc),
        user=user_name(),
        machine=socket.gethostname(),
        redactor=redactor,
    )
    _make_private(folder, [HEADER, CLICKS, CELLS, session.journal.name, session.results_file.name])
    session.write_header()
    os.environ[JOURNAL_ENV] = str(session.journal)
    os.environ[OUTCOME_ENV] = str(session.results_file)
    return session


def outcome(folder: Path, notebook: str, user: str) -> tuple[int, str]:
    """A session's exit code and message: the state at its end. The last result recorded per
    host (its last look), and the last click's result: both ok is ok (0), else 1 (or worse, as
    the host results say)."""
    results_file = folder / f"{notebook}.results.jsonl"
    results = channel.read(results_file) if results_file.exists() else []
    last: dict[str, HostResult] = {r.host: r for r in results}
    clicks = read_clicks(folder)
    code = worst_exit_code(list(last.values()))
    if code == EXIT_OK and clicks and not clicks[-1].get("ok"):
        code = EXIT_PROBLEM
    message = (
        f"interactive session of {notebook} by {user}: "
        f"{len(clicks)} click(s), {len(results)} host result(s)"
    )
    if clicks:
        end = clicks[-1]
        mark = "done" if end.get("ok") else "FAILED"
        message += f"; last click '{end.get('label')}' {mark}"
    return code, message


def read_clicks(folder: Path) -> list[dict[str, Any]]:
    source = folder / CLICKS
    if not source.is_file():
        return []
    found = []
    for line in source.read_text().splitlines():
        try:
            found.append(json.loads(line))
        except json.JSONDecodeError:  # a line cut short by a dying kernel
            continue
    return found


def read_header(folder: Path) -> dict[str, Any] | None:
    """A session folder's ``session.json`` (None when ``folder`` is no session's)."""
    try:
        loaded: dict[str, Any] = json.loads((folder / HEADER).read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return loaded


def session_doc(folder: Path) -> dict[str, Any] | None:
    """What an unfiled session's folder records, shaped as a filed run's summary (status as of
    now, "filed": False); None when ``folder`` holds no session."""
    header = read_header(folder)
    if header is None:
        return None
    code, message = outcome(folder, str(header.get("notebook")), str(header.get("user")))
    results_file = folder / f"{header.get('notebook')}.results.jsonl"
    results = channel.read(results_file) if results_file.exists() else []
    return {
        **header,
        "name": folder.name,
        "status": status_of(code),
        "exit_code": code,
        "message": message,
        "duration": _active_seconds(folder, str(header.get("started"))),
        "results": [channel.to_dict(r) for r in results],
        "interactive": True,
        "filed": False,
    }


def _active_seconds(folder: Path, started: str) -> float:
    """From a session's start to the last file it wrote."""
    newest = max(p.stat().st_mtime for p in [folder, *folder.iterdir()])
    try:
        since = datetime.fromisoformat(started).timestamp()
    except ValueError:  # a header cut short: the list still shows the session
        return 0.0
    return round(max(0.0, newest - since), 2)


def status_of(code: int) -> str:
    from opsbook.runner.execution import STATUS

    return STATUS.get(code, "problem found")


def _stop_recording(session: Session) -> None:
    if os.environ.get(JOURNAL_ENV) == str(session.journal):
        os.environ.pop(JOURNAL_ENV)
    if os.environ.get(OUTCOME_ENV) == str(session.results_file):
        os.environ.pop(OUTCOME_ENV)


def user_name() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return f"uid {os.getuid()}"
