"""Small result objects shared by every stage: ``ok``, a message, the data, and tables.

Raising is for failures of the tool; a problem found on the host being checked is a
``Finding`` inside a ``Result`` whose ``ok`` is False.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
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
    """

    severity: str
    subject: str
    message: str
    remedy: str = ""
    source: str = ""

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity must be one of {SEVERITIES}, not {self.severity!r}")

    @property
    def is_problem(self) -> bool:
        return self.severity == "error"


@dataclass
class Result:
    """The outcome of one check or action: ``ok``, a human message, the data and findings."""

    ok: bool
    message: str
    data: dict[str, Any] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)

    def __bool__(self) -> bool:
        return self.ok

    def findings_table(self) -> Table:
        return Table(
            ["severity", "subject", "message", "remedy"],
            [[f.severity, f.subject, f.message, f.remedy] for f in self.findings],
        )

    def _repr_html_(self) -> str:
        mark = "&#10004;" if self.ok else "&#10008;"
        colour = "#1a7f37" if self.ok else "#cf222e"
        head = f'<p style="color:{colour}"><b>{mark} {html.escape(self.message)}</b></p>'
        return head + (self.findings_table()._repr_html_() if self.findings else "")

    def __repr__(self) -> str:
        # The data can be large (whole fact sheets); the repr stays the human summary.
        return str(self)

    def __str__(self) -> str:
        mark = "OK" if self.ok else "PROBLEM"
        lines = [f"{mark}: {self.message}"]
        lines += [f"  [{f.severity}] {f.subject}: {f.message}" for f in self.findings]
        return "\n".join(lines)


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
        head = "".join(f"<th>{html.escape(str(c))}</th>" for c in self.columns)
        body = "".join(
            "<tr>" + "".join(f"<td>{html.escape(_cell(v))}</td>" for v in row) + "</tr>"
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


def _cell(value: Any) -> str:
    return "" if value is None else str(value)
