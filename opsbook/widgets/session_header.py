"""The header above an executed notebook, and the "File this run" button of its session."""

from __future__ import annotations

import html
import os
import socket
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from opsbook import __version__
from opsbook.core.channel import JOURNAL_ENV
from opsbook.core.results import shown
from opsbook.runner import session as session_records
from opsbook.widgets.gates import Gate


@dataclass(frozen=True)
class SessionHeader:
    """The header of an executed notebook: when, who, where, what, and where it is filed."""

    notebook: str
    started: str
    user: str
    machine: str
    version: str
    deployment: str
    parameters: dict[str, str]
    record: str

    @classmethod
    def of(cls, session: session_records.Session) -> SessionHeader:
        return cls(
            session.notebook,
            f"{session.started:%Y-%m-%d %H:%M:%S} UTC",
            session.user,
            session.machine,
            session.version,
            session.deployment,
            session.parameters,
            f"{session.folder} (written as the session goes; 'File this run' seals it)",
        )

    @classmethod
    def headless(cls, notebook: str, deployment: str, parameters: dict[str, Any]) -> SessionHeader:
        journal = os.environ.get(JOURNAL_ENV, "")
        record = str(Path(journal).parent) if journal else "none (not run by `opsbook run`)"
        return cls(
            notebook,
            f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M:%S} UTC",
            session_records.user_name(),
            socket.gethostname(),
            __version__,
            deployment,
            {k: shown(str(v)) for k, v in parameters.items()},
            record,
        )

    def rows(self) -> list[tuple[str, str]]:
        params = ", ".join(f"{k}={v}" for k, v in self.parameters.items()) or "none"
        return [
            ("notebook", self.notebook),
            ("started", self.started),
            ("user", f"{self.user} on {self.machine}"),
            ("deployment", self.deployment),
            ("parameters", params),
            ("opsbook", self.version),
            ("record", self.record),
        ]

    def _repr_html_(self) -> str:
        cells = "".join(
            f"<tr><th style='text-align:left'>{k}</th><td style='text-align:left'>"
            f"{html.escape(v)}</td></tr>"
            for k, v in self.rows()
        )
        return f"<table class='opsbook-header'>{cells}</table>"

    def __repr__(self) -> str:
        return "\n".join(f"{k:<11} {v}" for k, v in self.rows())


def file_gate(session: session_records.Session) -> Gate:
    """The "File this run" button of a session."""
    return Gate(
        "File this run",
        session.file,
        unavailable=lambda: f"filed: {session.folder} is read-only" if session.filed else "",
    )
