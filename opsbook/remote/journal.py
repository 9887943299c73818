"""The journal: one entry per remote command, redacted, as data, as a table, as JSON lines.

When the environment variable ``OPSBOOK_JOURNAL`` names a file (``opsbook run`` sets it for the
notebook's kernel), every entry is also appended there, so a run record holds every command.
"""

from __future__ import annotations

import html
import json
import os
import re
import threading
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

from opsbook.core.channel import JOURNAL_ENV
from opsbook.core.redact import Redactor
from opsbook.core.results import LEFT, Table, shown
from opsbook.remote import probes

TAIL_CHARS = 2000


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
        """Redact and add one entry; returns it.

        Args:
            started: when the action began (default: ``duration`` seconds ago, as an entry is
                recorded when its action ends).
        """
        clean = self.redactor.redact
        if started is None:
            started = datetime.now(timezone.utc) - timedelta(seconds=max(duration, 0.0))
        entry = JournalEntry(
            host=host,
            kind=kind,
            command=clean(command),
            exit_code=exit_code,
            duration=round(duration, 3),
            stdout_tail=clean(_tail(probes.readable(stdout))),
            stderr_tail=clean(_tail(stderr)),
            started=started.isoformat(timespec="milliseconds"),
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

    def table(self, last: int | None = None) -> JournalTable:
        """The journal as a table for a notebook: in time order, each command whole."""
        entries = self.entries[-last:] if last else self.entries
        return JournalTable(entries)

    def __len__(self) -> int:
        return len(self.entries)


class JournalTable(Table):
    """A notebook's journal: a row per command in time order, the command whole (wrapped,
    monospace) in HTML; as text, the terminal's lines (:func:`journal_lines`). A ticket
    takes the command as it ran, not its first 120 characters; secrets were masked when
    the entry was recorded, and the table masks what looks like one again."""

    def __init__(self, entries: Sequence[JournalEntry]):
        self.entries = in_time_order(entries)
        super().__init__(
            ["started", "host", "kind", "command", "exit", "seconds"],
            [
                [e.started[11:23], e.host, e.kind, e.command, e.exit_code, e.duration]
                for e in self.entries
            ],
        )

    def _repr_html_(self) -> str:
        esc = html.escape
        head = "".join(f"<th{LEFT}>{esc(c)}</th>" for c in self.columns)
        body = "".join(
            "<tr>"
            + "".join(
                f"<td{LEFT}><pre style='{COMMAND_STYLE}'>{esc(shown(v))}</pre></td>"
                if column == "command"
                else f"<td{LEFT}>{esc(shown('' if v is None else str(v)))}</td>"
                for column, v in zip(self.columns, row, strict=True)
            )
            + "</tr>"
            for row in self.rows
        )
        return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"

    def __str__(self) -> str:
        return "\n".join(shown(line) for line in journal_lines(self.entries))


# A command cell: monospace, its line breaks kept, wrapped anywhere rather than cut or scrolled.
COMMAND_STYLE = (
    "font-family:monospace;white-space:pre-wrap;overflow-wrap:anywhere;margin:0;text-align:left"
)


def _tail(text: str) -> str:
    return text if len(text) <= TAIL_CHARS else "..." + text[-TAIL_CHARS:]


def _one_line(text: str, width: int) -> str:
    line = " ".join(text.split())
    return line if len(line) <= width else line[: width - 3] + "..."


# Operations that change the host; everything else a journal holds only reads it.
WRITE_OPERATIONS = ("stop", "start", "clean_shm", "apply", "restore", "upload")
WRITE_LABELS = ("write ", "record ", "prepare ", "stop ", "start ", "sftp put")
_PROBE = re.compile(r"^probe (\w+) \([^)]*\) args=(.*)$", re.S)


@dataclass(frozen=True)
class Operation:
    """A journal entry for people: what was done (first), read or write, when, how long."""

    what: str
    writes: bool
    entry: JournalEntry


def operation(entry: JournalEntry) -> Operation:
    """Name a journal entry by what it did: ``launch stop``, ``configs read``, ``bash -n
    /path``; a probe's arguments and the full command stay in the entry."""
    found = _PROBE.match(entry.command)
    if found:
        name, args = found.group(1), found.group(2)
        step = _argument(args, "op") or _argument(args, "action") or "look"
        detail = _argument(args, "path") if step == "http" else ""
        what = " ".join(filter(None, (name, step, detail)))
        return Operation(what, step in WRITE_OPERATIONS, entry)
    text = _one_line(entry.command, 80)
    writes = entry.kind == "upload" or text.startswith(WRITE_LABELS)
    return Operation(text, writes, entry)


def _argument(args: str, key: str) -> str:
    found = re.search(rf"'{key}': '([^']*)'", args)
    return found.group(1) if found else ""


def in_time_order(entries: Sequence[JournalEntry]) -> list[JournalEntry]:
    """The entries by the time their action began.

    An entry is written when its action ends, and the hosts of a stage (and the stages of a
    deploy) write from their own threads: the file's order is the order of the endings.
    Entries that began together keep the file's order.
    """
    return sorted(entries, key=lambda e: _instant(e.started))


def _instant(started: str) -> datetime:
    try:
        moment = datetime.fromisoformat(started)
    except ValueError:  # an entry of an older format: first, as it cannot be placed
        return datetime.min.replace(tzinfo=timezone.utc)
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


def journal_page(entries: Sequence[JournalEntry], title: str = "journal") -> str:
    """The journal as a self-contained HTML page, in time order: one row per operation (what,
    read or write, UTC time, seconds, exit, host) with its whole command under it, the output
    tails on demand."""
    esc = html.escape
    entries = in_time_order(entries)
    rows = []
    for e in entries:
        op = operation(e)
        failed = e.exit_code not in (0, None)
        outputs = (
            (f"<pre>{esc(e.stdout_tail)}</pre>" if e.stdout_tail else "")
            + (f"<pre style='color:#cf222e'>{esc(e.stderr_tail)}</pre>" if e.stderr_tail else "")
            + (f"<p>{esc(e.note)}</p>" if e.note else "")
        )
        details = f"<details><summary>output</summary>{outputs}</details>" if outputs else ""
        rows.append(
            f"<tr{' style=background:#ffebe9' if failed else ''}>"
            f"<td>{esc(op.what)}</td><td>{'write' if op.writes else 'read'}</td>"
            f"<td>{esc(e.started[11:19])}</td><td>{e.duration:.2f} s</td>"
            f"<td>{'' if e.exit_code is None else e.exit_code}</td><td>{esc(e.host)}</td></tr>"
            f"<tr class='command'><td colspan='6'><pre class='command'>{esc(e.command)}</pre>"
            f"{details}</td></tr>"
        )
    day = entries[0].started[:10] if entries else ""
    writes = sum(operation(e).writes for e in entries)
    return (
        "<!doctype html><meta charset='utf-8'>"
        f"<title>{esc(title)}</title>"
        "<style>body{font-family:sans-serif}td,th{padding:3px 8px;text-align:left;"
        "vertical-align:top;border-bottom:1px solid #ddd}pre{white-space:pre-wrap;margin:2px}"
        "tr.command td{border-bottom:2px solid #bbb;padding-left:24px}"
        "pre.command{font-family:monospace;overflow-wrap:anywhere}</style>"
        f"<h1>{esc(title)}</h1><p>{len(entries)} operation(s), {writes} of them writing to a "
        f"host; times are UTC, {esc(day)}</p>"
        "<table><tr><th>operation</th><th>read/write</th><th>UTC</th><th>took</th>"
        "<th>exit</th><th>host</th></tr>" + "".join(rows) + "</table>"
    )


def journal_lines(entries: Sequence[JournalEntry]) -> list[str]:
    """The journal for a terminal, in time order: a line per operation (UTC time, host, read
    or write, exit, seconds, what), then its whole command, indented."""
    lines = []
    for e in in_time_order(entries):
        op = operation(e)
        code = "-" if e.exit_code is None else str(e.exit_code)
        lines.append(
            f"{e.started[11:23]}  {e.host}  {'write' if op.writes else 'read '}  exit {code}"
            f"  {e.duration:.2f} s  {op.what}"
        )
        lines += ["    " + line for line in e.command.splitlines() or [""]]
        if e.note:
            lines.append(f"    ({e.note})")
    return lines


def read_journal(path: Path) -> list[JournalEntry]:
    """The entries of a ``journal.jsonl`` file (lines that are not entries are skipped)."""
    entries = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            entries.append(JournalEntry(**json.loads(line)))
        except (ValueError, TypeError):
            continue
    return entries
