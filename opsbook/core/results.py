"""Small result objects shared by every stage: ``ok``, a message, findings, and tables; and
the one vocabulary of per-host states a stage ends in.

Raising is for failures of the tool; a problem found on the host being checked is a
``Finding`` inside a ``Result`` whose ``ok`` is False. A stage run on a set of hosts ends with
one :class:`HostResult` per host, in a :class:`State` taken from Ansible's recap: ok, changed,
skipped, failed, unreachable; and "would change" for a dry run that found something to do,
which is never shown as a green ok.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

SEVERITIES = ("ok", "info", "warning", "error")


@dataclass(frozen=True)
class Finding:
    """One thing a check found.

    Args:
        severity: one of ``ok``, ``info``, ``warning``, ``error``.
        subject: what it is about (a GPU, a file, a flag...).
        message: what was found.
        remedy: what to do, when something should be done.
        source: where the fact behind it comes from.
        code: a stable machine id of what was found (``kv-cache-dtype-unknown``,
            ``pattern-kill``), for code that acts on a kind of finding; the texts are for
            people and may change.
    """

    severity: str
    subject: str
    message: str
    remedy: str = ""
    source: str = ""
    code: str = ""

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity must be one of {SEVERITIES}, not {self.severity!r}")

    @property
    def is_problem(self) -> bool:
        return self.severity == "error"


@dataclass
class Result:
    """The outcome of one check or action: ``ok``, a human message and findings.

    What a check or action found beyond that (its evidence) lives on a subclass with typed
    fields, declared ``@dataclass(kw_only=True, repr=False)`` so that it shows as this verdict.
    """

    ok: bool
    message: str
    findings: list[Finding] = field(default_factory=list)

    def __bool__(self) -> bool:
        return self.ok

    def findings_table(self) -> Table:
        """The findings, problems first, those alike but for their numbers merged into one
        row (eight GPUs held by eight workers of one server are one row, not eight)."""
        return findings_table(self.findings)

    def _repr_html_(self) -> str:
        mark = "&#10004;" if self.ok else "&#10008;"
        colour = "#1a7f37" if self.ok else "#cf222e"
        head = f'<p style="color:{colour}"><b>{mark} {html.escape(shown(self.message))}</b></p>'
        return head + (self.findings_table()._repr_html_() if self.findings else "")

    def __repr__(self) -> str:
        # A subclass's evidence can be large (whole fact sheets); the repr stays the verdict.
        return str(self)

    def __str__(self) -> str:
        mark = "OK" if self.ok else "PROBLEM"
        lines = [f"{mark}: {self.message}"]
        lines += [f"  [{f.severity}] {f.subject}: {f.message}" for f in self.findings]
        return shown("\n".join(lines))


def merge_alike(findings: Iterable[Finding]) -> list[tuple[Finding, list[Finding]]]:
    """Findings grouped when they differ only in their numbers (same severity, same remedy):
    each group's first finding, and the others like it."""
    groups: dict[tuple[str, str, str], list[Finding]] = {}
    for f in findings:
        key = (f.severity, re.sub(r"\d+", "N", f.message), f.remedy)
        groups.setdefault(key, []).append(f)
    return [(group[0], group[1:]) for group in groups.values()]


def findings_table(findings: Iterable[Finding]) -> Table:
    """A findings table: problems first, then warnings, infos and oks; findings alike but for
    their numbers merged into one row naming every subject."""
    order = {"error": 0, "warning": 1, "info": 2, "ok": 3}
    rows = []
    for first, others in sorted(merge_alike(findings), key=lambda g: order[g[0].severity]):
        subject = first.subject
        message = first.message
        if others:
            subject = ", ".join([first.subject, *(o.subject for o in others)])
            message = f"{first.message} (and {len(others)} more alike)"
        rows.append([first.severity, subject, message, first.remedy])
    return Table(["severity", "subject", "message", "remedy"], rows)


class Table:
    """A plain table that shows as HTML in a notebook and as aligned text elsewhere."""

    def __init__(self, columns: Sequence[str], rows: Iterable[Sequence[Any]]):
        self.columns = list(columns)
        self.rows = [list(row) for row in rows]

    @classmethod
    def from_records(cls, records: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> Table:
        return cls(columns, [[record.get(c, "") for c in columns] for record in records])

    def records(self) -> list[dict[str, Any]]:
        return [dict(zip(self.columns, row, strict=True)) for row in self.rows]

    def _repr_html_(self) -> str:
        # Left-aligned: JupyterLab right-aligns table cells, which suits numbers, not text.
        head = "".join(f"<th{LEFT}>{html.escape(str(c))}</th>" for c in self.columns)
        body = "".join(
            "<tr>" + "".join(f"<td{LEFT}>{html.escape(_cell(v))}</td>" for v in row) + "</tr>"
            for row in self.rows
        )
        return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"

    def __str__(self) -> str:
        cells = [self.columns] + [[_cell(v) for v in row] for row in self.rows]
        widths = [max(len(r[i]) for r in cells) for i in range(len(self.columns))]
        lines = ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in cells]
        lines.insert(1, "  ".join("-" * w for w in widths))
        return "\n".join(line.rstrip() for line in lines)

    def __repr__(self) -> str:
        return str(self)

    def __len__(self) -> int:
        return len(self.rows)


LEFT = ' style="text-align:left"'


def _cell(value: Any) -> str:
    return "" if value is None else shown(str(value))


def shown(text: str) -> str:
    """``text`` as a display may show it: token-shaped secrets masked.

    What a notebook displays is saved with it, interactive or headless; a table of the host's
    processes holds other people's command lines (``--api-key sk-...``), so every display of
    the library masks what looks like a secret before it reaches the page.
    """
    from opsbook.core.redact import Redactor

    return Redactor().redact(text)


class State(str, Enum):
    """How a stage ended on one host."""

    OK = "ok"  # nothing to do, or the check passed
    CHANGED = "changed"  # the stage changed the host, and the change was checked
    WOULD_CHANGE = "would change"  # a dry run (apply=False) that found something to change
    SKIPPED = "skipped"  # not run on this host (dropped earlier, or nothing applies)
    FAILED = "failed"  # the check found a problem, or the step failed on the host
    UNREACHABLE = "unreachable"  # the host could not be reached

    @property
    def goes_on(self) -> bool:
        """Whether the host takes part in the next stages of the run."""
        return self in (State.OK, State.CHANGED)

    @property
    def counted_as(self) -> str:
        """Its column in the recap: a dry run's change counts as changed, as Ansible's does."""
        return State.CHANGED.value if self is State.WOULD_CHANGE else self.value

    @property
    def colour(self) -> str:
        return STATE_COLOURS[self]


STATE_COLOURS = {
    State.OK: "#1a7f37",
    State.CHANGED: "#bf8700",
    State.WOULD_CHANGE: "#8250df",
    State.SKIPPED: "#6e7781",
    State.FAILED: "#cf222e",
    State.UNREACHABLE: "#82071e",
}
RECAP_COLUMNS = ("ok", "changed", "failed", "unreachable", "skipped")

# Exit codes of `opsbook run`, documented in the README; a run's is its worst host's.
EXIT_OK = 0
EXIT_PROBLEM = 1  # a check found a problem on a host, or a dry run found something to change
EXIT_USAGE = 2  # bad arguments or deployment file
EXIT_TOOL_FAILED = 3  # opsbook or the notebook itself failed
EXIT_UNREACHABLE = 4  # a host could not be reached
EXIT_LOCKED = 5  # another deploy run holds a host's deploy lock (opsbook.runner.lock)
EXIT_BUSY = 6  # 06_qualify skipped a host whose server was serving requests (not idle)
# The worst first: a run's exit code is its worst host's.
EXIT_ORDER = (EXIT_OK, EXIT_BUSY, EXIT_PROBLEM, EXIT_TOOL_FAILED, EXIT_UNREACHABLE)


@dataclass(frozen=True)
class HostResult:
    """How one stage ended on one host.

    Args:
        host: the host's name (``user@address:port``).
        stage: the stage's name, e.g. ``download``.
        state: how it ended.
        message: one line for people.
        failure_id: the catalogue id of the failure (``opsbook/knowledge/data/failures.yaml``), or
            ``tool-failed`` when opsbook itself raised; empty when there is none.
        findings: what the stage found.
        duration: seconds it took on this host.
        script_sha256: the launch script's hash, where the stage knows which one runs.
    """

    host: str
    stage: str
    state: State
    message: str
    failure_id: str = ""
    findings: tuple[Finding, ...] = ()
    duration: float = 0.0
    script_sha256: str = ""

    @property
    def ok(self) -> bool:
        return self.state in (State.OK, State.CHANGED, State.SKIPPED)

    @property
    def exit_code(self) -> int:
        if self.state is State.UNREACHABLE:
            return EXIT_UNREACHABLE
        if self.failure_id == TOOL_FAILED:
            return EXIT_TOOL_FAILED
        if self.state in (State.FAILED, State.WOULD_CHANGE):
            return EXIT_PROBLEM
        if self.state is State.SKIPPED and self.failure_id == SERVER_BUSY:
            return EXIT_BUSY
        return EXIT_OK

    @property
    def remedy(self) -> str:
        """The first remedy among the problems found, for a terminal line."""
        return next((f.remedy for f in self.findings if f.is_problem and f.remedy), "")

    def line(self) -> str:
        """``download  gpu-01  failed  0.4 s  message``: what the terminal prints as it ends."""
        state, took = self.state.value, f"{self.duration:6.1f} s"
        return f"{self.stage:<14} {self.host:<32} {state:<12} {took}  {self.message}"

    def _repr_html_(self) -> str:
        badge = (
            f'<span style="background:{self.state.colour};color:white;padding:1px 6px">'
            f"{html.escape(self.state.value)}</span>"
        )
        head = f"<p>{badge} <b>{html.escape(self.host)}</b> {html.escape(shown(self.message))}</p>"
        problems = [f for f in self.findings if f.severity != "ok"]
        if not problems:
            return head
        return head + findings_table(problems)._repr_html_()

    def __str__(self) -> str:
        return self.line()


TOOL_FAILED = "tool-failed"
# A stage that measures the server (06_qualify) skipped it: it was serving requests.
SERVER_BUSY = "server-busy"


def host_anchor(host: str) -> str:
    """The id of a host's section in a stage notebook's HTML copy (``host-ops-gpu-01-22``)."""
    return "host-" + "".join(c if c.isalnum() else "-" for c in host)


@dataclass(frozen=True)
class HostRecap:
    """One host's line of the recap: its states counted over the stages of a run."""

    host: str
    counts: dict[str, int]
    first_failure: HostResult | None
    exit_code: int = EXIT_OK

    def line(self, width: int = 32) -> str:
        counts = "  ".join(f"{name}={self.counts.get(name, 0)}" for name in RECAP_COLUMNS)
        where = ""
        if self.first_failure is not None:
            f = self.first_failure
            where = f"  ({f.state.value} at {f.stage}: {f.message})"
        return f"{self.host:<{width}} {counts}{where}"


def recap(results: Sequence[HostResult]) -> list[HostRecap]:
    """Per host, in the order hosts first appear: its states counted, and where it first
    failed or was unreachable."""
    hosts = list(dict.fromkeys(r.host for r in results))
    lines = []
    for host in hosts:
        mine = [r for r in results if r.host == host]
        counts = {name: 0 for name in RECAP_COLUMNS}
        for r in mine:
            counts[r.state.counted_as] += 1
        bad = next((r for r in mine if r.state in (State.FAILED, State.UNREACHABLE)), None)
        bad = bad or next((r for r in mine if r.state is State.WOULD_CHANGE), None)
        lines.append(HostRecap(host, counts, bad, worst_exit_code(mine)))
    return lines


def worst_exit_code(results: Sequence[HostResult]) -> int:
    """The exit code of a run: its worst host's (unreachable > tool failed > problem > busy >
    ok)."""
    return max((r.exit_code for r in results), key=EXIT_ORDER.index, default=EXIT_OK)


def results_table(results: Sequence[HostResult]) -> Table:
    """One row per host and stage: state, time, message."""
    return Table(
        ["host", "stage", "state", "time", "message"],
        [[r.host, r.stage, r.state.value, f"{r.duration:.1f} s", r.message] for r in results],
    )
