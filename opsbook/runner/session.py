"""The record of an interactive session: a JupyterLab session files a run folder too.

Opening a notebook's deployment form in JupyterLab starts a session: a run folder
``runs/<UTC>-session-<notebook>-<host>`` like the one ``opsbook run`` makes, with the journal of
every remote command (the kernel's hosts write to it, redacted, as they do headless), the
per-host results of every stage run, ``session.json`` (who, where, when, which deployment and
parameters, which opsbook) and ``clicks.jsonl`` (every button: label, UTC time, user, seconds,
result). :meth:`Session.file` writes ``summary.json`` and ``index.html`` and makes the folder
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
from opsbook.core.results import Result, worst_exit_code
from opsbook.runner import records

# The notebooks live in notebooks/; their records go to the checkout's runs/, as `make demo`'s.
DEFAULT_RUNS_DIR = "../runs"
HEADER = "session.json"
CLICKS = "clicks.jsonl"


class Clicked(Protocol):
    """What a session records of a click (:class:`opsbook.widgets.Click`)."""

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
    _clock: float = field(default_factory=time.monotonic)

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
            "hosts": self.hosts,
            "parameters": self.parameters,
        }

    def note_click(self, click: Clicked) -> None:
        """Append a click to ``clicks.jsonl`` (nothing once filed)."""
        if self.filed:
            return
        self.clicks += 1
        doc = {
            "label": click.label,
            "started": click.started.isoformat(timespec="seconds"),
            "seconds": round(click.seconds, 2),
            "user": click.user,
            "ok": click.result.ok,
            "message": self.redactor.redact(click.result.message),
        }
        with (self.folder / CLICKS).open("a") as f:
            f.write(json.dumps(doc) + "\n")

    def file(self) -> Result:
        """Write the summary and index page, stop recording, make the folder read-only."""
        if self.filed:
            return Result(True, f"already filed: {self.folder}")
        results = channel.read(self.results_file) if self.results_file.exists() else []
        code = worst_exit_code(results)
        message = (
            f"interactive session of {self.notebook} by {self.user}: "
            f"{self.clicks} click(s), {len(results)} host result(s)"
        )
        summary = records.RunSummary(
            name=self.name,
            deployment=self.deployment,
            started=self.started.isoformat(timespec="seconds"),
            status="ok" if code == 0 else "problem found",
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
        _stop_recording(self)
        records.close(self.folder)
        self.filed = True
        return Result(True, f"filed {self.folder} (read-only): {message}")


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
    (folder / HEADER).write_text(json.dumps(session.header(), indent=2) + "\n")
    os.environ[JOURNAL_ENV] = str(session.journal)
    os.environ[OUTCOME_ENV] = str(session.results_file)
    return session


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
