"""The diagnosis types: states, what a log says, earlier startups, kills."""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from opsbook.core.results import Finding, Result, Table
from opsbook.knowledge.logscan.catalogue import CatalogueEntry, Hit
from opsbook.knowledge.logscan.log_lines import LogLine
from opsbook.knowledge.logscan.startup_phases import Phase

READY = "ready"
LOADING = "loading"
FAILED = "failed"
HUNG = "hung"
NO_CONCLUSION = "no-conclusion"


_STATE_WORDS = {NO_CONCLUSION: "stopped without an error"}


@dataclass(frozen=True)
class OomKill:
    """A process the kernel's OOM killer ended, from ``dmesg`` text."""

    pid: int
    process: str
    line_no: int
    line: str
    anon_rss_kb: int | None = None


@dataclass
class LogDiagnosis:
    """What a vLLM log says: state, failure class, the identifying line and the remedy.

    Args:
        state: ``ready``, ``loading``, ``failed``, ``hung`` or ``no-conclusion``.
        phase: the furthest startup phase the log reached.
        failure: the catalogue id of the failure, when failed or hung.
        title: one line for people.
        severity: as ``opsbook.core.results.Finding``.
        line: the line that identifies the state (its ``raw`` text is as in the log).
        wrapper: the wrapper error below the reported root cause, if any.
        remedy: what to do.
        source: where the signature and the remedy come from.
        numbers: values parsed from the identifying lines.
        version: the vLLM version when the log states it.
        phases: the startup phases seen.
        notes: lines worth pointing out that are not failures.
        suspect: for a log that stops without an error, the catalogue id that likely explains it.
        error_class: the catalogue class of the failure when it is reported under a shared
            failure id (an error the catalogue knows, reported as ``unrecognised-error`` with
            its own remedy).
        edit: the remedy as an edit of the deployment (``server.args``/``server.env``/
            ``config``), when the class has one for the release and platform the log shows.
        first_line: where the diagnosed (last) startup begins in the file.
        skipped_lines: lines of interest of that startup left out to bound memory.
        earlier: the startups before it in the same file (the last ``EARLIER_LISTED``).
        earlier_counts: how many earlier startups ended in each state.
    """

    state: str
    phase: str | None
    failure: str | None
    title: str
    severity: str
    line: LogLine | None
    remedy: str
    source: str
    wrapper: LogLine | None = None
    numbers: dict[str, Any] = field(default_factory=dict)
    version: str | None = None
    phases: list[Phase] = field(default_factory=list)
    notes: list[Hit] = field(default_factory=list)
    suspect: str | None = None
    root_cause: LogLine | None = None
    first_line: int = 1
    skipped_lines: int = 0
    earlier: list[EarlierStartup] = field(default_factory=list)
    earlier_counts: dict[str, int] = field(default_factory=dict)
    error_class: str | None = None
    edit: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return self.state in (READY, LOADING)

    @property
    def summary(self) -> str:
        what = f"{self.state}: {self.title}"
        return what + (f" [{self.failure}]" if self.failure else "")

    def to_dict(self) -> dict[str, Any]:
        """Everything as JSON-ready values (for ``opsbook diagnose --json``)."""
        return {
            "state": self.state,
            "phase": self.phase,
            "failure": self.failure,
            "error_class": self.error_class,
            "title": self.title,
            "severity": self.severity,
            "line": _line_dict(self.line),
            "wrapper": _line_dict(self.wrapper),
            "root_cause": _root_dict(self.root_cause),
            "remedy": self.remedy,
            "edit": self.edit,
            "source": self.source,
            "numbers": self.numbers,
            "version": self.version,
            "phases": [
                {"name": p.name, "line_no": p.first_line_no, "timestamp": _iso(p.timestamp)}
                for p in self.phases
            ],
            "notes": [
                {"id": n.entry.id, "title": n.entry.title, "line": _line_dict(n.line)}
                for n in self.notes
            ],
            "suspect": self.suspect,
            "startup_first_line": self.first_line,
            "skipped_lines": self.skipped_lines,
            "earlier_startups": {
                "count": sum(self.earlier_counts.values()),
                "states": self.earlier_counts,
                "summary": self.earlier_summary,
                "startups": [startup.to_dict() for startup in self.earlier],
            },
        }

    @property
    def earlier_summary(self) -> str | None:
        """``3 earlier startups in this file: 2 failed, 1 ready``, or None when there are none."""
        total = sum(self.earlier_counts.values())
        if not total:
            return None
        counts = sorted(self.earlier_counts.items(), key=lambda item: (-item[1], item[0]))
        states = ", ".join(f"{count} {_STATE_WORDS.get(state, state)}" for state, count in counts)
        noun = "startup" if total == 1 else "startups"
        return f"{total} earlier {noun} in this file: {states}"

    def to_result(self) -> Result:
        """The diagnosis as an opsbook ``Result`` with findings."""
        subject = self.failure or self.state
        message = self.title + (f" (line {self.line.number})" if self.line else "")
        findings = [Finding(self.severity, subject, message, self.remedy, self.source)]
        findings += [
            Finding(
                n.entry.severity,
                n.entry.id,
                f"{n.entry.title} (line {n.line.number})",
                n.entry.remedy,
                n.entry.source,
            )
            for n in self.notes
        ]
        if self.earlier_summary:
            findings.append(
                Finding(
                    "info",
                    "earlier startups",
                    f"{self.earlier_summary}; this diagnosis is about the last one (from line "
                    f"{self.first_line})",
                )
            )
        return Result(self.ok, self.summary, findings=findings)

    def __str__(self) -> str:
        return self.describe()

    def describe(self, *, every_source: bool = True) -> str:
        """The diagnosis for people, a row per fact; without ``every_source``, a long source
        list shortened to its first entries and how many more there are."""
        rows = [f"state:   {self.state}" + (f" (phase: {self.phase})" if self.phase else "")]
        if self.failure:
            known = f" ({self.error_class})" if self.error_class else ""
            rows.append(f"failure: {self.failure}{known} - {self.title}")
        else:
            rows.append(f"summary: {self.title}")
        if self.line:
            rows.append(f"line {self.line.number}: {self.line.raw}")
        if self.root_cause:
            process = f" ({self.root_cause.process})" if self.root_cause.process else ""
            rows.append(f"root cause at line {self.root_cause.number}{process}")
        if self.wrapper:
            rows.append(f"wrapper at line {self.wrapper.number}: {self.wrapper.text}")
        if self.numbers:
            rows.append("numbers: " + ", ".join(f"{k}={v}" for k, v in self.numbers.items()))
        rows.append(f"remedy:  {self.remedy}")
        if self.edit:
            rows.append(f"edit:    {self.edit}")
        rows.append(f"source:  {self.source if every_source else first_sources(self.source)}")
        if self.version:
            rows.append(f"vLLM:    {self.version}")
        if self.earlier_summary:
            rows.append(
                f"startup: the last one, from line {self.first_line}; {self.earlier_summary}"
            )
        rows += [f"note line {n.line.number}: {n.entry.title}" for n in self.notes]
        return "\n".join(rows)

    def _repr_html_(self) -> str:
        colour = {READY: "#1a7f37", LOADING: "#9a6700"}.get(self.state, "#cf222e")
        head = f'<p style="color:{colour}"><b>{html.escape(self.summary)}</b></p>'
        rows = [["phase", self.phase], ["vLLM version", self.version]]
        rows.append(["earlier startups", self.earlier_summary])
        if self.line:
            rows.append([f"line {self.line.number}", self.line.raw])
        if self.wrapper:
            rows.append([f"wrapper (line {self.wrapper.number})", self.wrapper.text])
        rows += [[key, value] for key, value in self.numbers.items()]
        rows += [["remedy", self.remedy], ["edit", str(self.edit or "")]]
        rows += [["source", self.source]]
        rows += [[f"note (line {n.line.number})", n.entry.title] for n in self.notes]
        table = Table(["", ""], [row for row in rows if row[1] not in (None, "")])
        return head + table._repr_html_()


# A shortened source list keeps its entries while they fit in this many characters (the
# first always: a catalogue source names the vLLM release first).
SHORT_SOURCES = 200


def first_sources(source: str, budget: int = SHORT_SOURCES) -> str:
    """``source``'s first entries (``;``-separated, outside brackets and quotes) that fit in
    ``budget`` characters, then how many were left out."""
    entries = source_entries(source)
    kept = entries[:1]
    for entry in entries[1:]:
        if len("; ".join([*kept, entry])) > budget:
            break
        kept.append(entry)
    left = len(entries) - len(kept)
    if not left:
        return source
    return "; ".join(kept) + f"; and {left} more (-v shows them)"


def source_entries(source: str) -> list[str]:
    """The entries of a source list: split at ``;`` outside brackets and double quotes
    (a quoted log message may hold one)."""
    entries, depth, quoted, start = [], 0, False, 0
    for i, char in enumerate(source):
        if char == '"':
            quoted = not quoted
        elif not quoted and char in "([":
            depth += 1
        elif not quoted and char in ")]":
            depth = max(0, depth - 1)
        elif char == ";" and not quoted and depth == 0:
            entries.append(source[start:i].strip())
            start = i + 1
    entries.append(source[start:].strip())
    return [e for e in entries if e]


@dataclass(frozen=True)
class EarlierStartup:
    """The verdict on a startup that a later one in the same file followed."""

    first_line: int
    last_line: int
    state: str
    failure: str | None
    line: int | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "first_line": self.first_line,
            "last_line": self.last_line,
            "state": self.state,
            "failure": self.failure,
            "line": self.line,
        }


@dataclass(frozen=True)
class RootCause:
    """The first error of the process that failed, under a wrapper error."""

    line: LogLine
    entry: CatalogueEntry | None


def _line_dict(line: LogLine | None) -> dict[str, Any] | None:
    if line is None:
        return None
    return {"number": line.number, "raw": line.raw, "text": line.text}


def _root_dict(line: LogLine | None) -> dict[str, Any] | None:
    found = _line_dict(line)
    if found is not None and line is not None:
        found["process"] = line.process
    return found


def _iso(stamp: datetime | None) -> str | None:
    return stamp.isoformat() if stamp else None
