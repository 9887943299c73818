"""The journal: one entry per remote command, redacted, as data, as a table, as JSON lines.

When the environment variable ``OPSBOOK_JOURNAL`` names a file (``opsbook run`` sets it for the
notebook's kernel), every entry is also appended there, so a run record holds every command.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

from opsbook.redact import Redactor
from opsbook.results import Table

TAIL_CHARS = 2000
JOURNAL_ENV = "OPSBOOK_JOURNAL"


@dataclass(frozen=True)
class JournalEntry:
    """One remote action. Text fields are already redacted."""

    host: str
    kind: str
    command: str
    exit_code: int | None
    duration: float
    stdout_tail: str
    stderr_tail: str
    started: str
    note: str = ""


class Journal:
    """Entries of remote actions, in order; optionally mirrored to a JSON-lines file."""

    def __init__(
        self, redactor: Redactor | None = None, path: str | os.PathLike[str] | None = None
    ):
        self.redactor = redactor or Redactor()
        self.path = Path(path) if path else None
        self.entries: list[JournalEntry] = []
        self._lock = threading.Lock()

    @classmethod
    def from_env(cls, redactor: Redactor | None = None) -> Journal:
        return cls(redactor, os.environ.get(JOURNAL_ENV) or None)

    def record(
        self,
        *,
        host: str,
        kind: str,
        command: str,
        exit_code: int | None,
        duration: float,
        stdout: str = "",
        stderr: str = "",
        started: datetime | None = None,
        note: str = "",
    ) -> JournalEntry:
        """Redact and add one entry; returns it."""
        clean = self.redactor.redact
        entry = JournalEntry(
            host=host,
            kind=kind,
            command=clean(command),
            exit_code=exit_code,
            duration=round(duration, 3),
            stdout_tail=clean(_tail(stdout)),
            stderr_tail=clean(_tail(stderr)),
            started=(started or datetime.now(timezone.utc)).isoformat(timespec="milliseconds"),
            note=clean(note),
        )
        line = json.dumps(asdict(entry)) + "\n"
        # The hosts of a stage share one journal and record from their own threads.
        with self._lock:
            self.entries.append(entry)
            if self.path:
                with self.path.open("a") as f:
                    f.write(line)
        return entry

    def records(self) -> list[dict[str, object]]:
        return [asdict(e) for e in self.entries]

    def table(self, last: int | None = None) -> Table:
        """The journal as a table for a notebook (command text cut to one line)."""
        entries = self.entries[-last:] if last else self.entries
        return Table(
            ["started", "host", "kind", "command", "exit", "seconds"],
            [
                [e.started[11:23], e.host, e.kind, _one_line(e.command), e.exit_code, e.duration]
                for e in entries
            ],
        )

    def __len__(self) -> int:
        return len(self.entries)


def _tail(text: str) -> str:
    return text if len(text) <= TAIL_CHARS else "..." + text[-TAIL_CHARS:]


def _one_line(text: str, width: int = 120) -> str:
    line = " ".join(text.split())
    return line if len(line) <= width else line[: width - 3] + "..."
