"""Run records: the folder a run leaves behind, its summary, its index page, and listing.

A closed run folder is made read-only: an incident record is not edited after the fact.
"""

from __future__ import annotations

import html
import json
import os
import stat
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from opsbook.exceptions import RunError
from opsbook.results import Table

SUMMARY = "summary.json"
INDEX = "index.html"
STATUS_COLOURS = {"ok": "#1a7f37", "problem found": "#bf8700", "skipped": "#6e7781"}


@dataclass
class StageSummary:
    """One stage of a run, as the summary records it."""

    stage: str
    notebook: str
    status: str
    exit_code: int | None
    duration: float
    message: str
    html: str | None = None


def export_html(notebook: Path) -> Path | None:
    """An HTML copy next to the executed notebook (widget state included when saved)."""
    from nbconvert import HTMLExporter

    if not notebook.exists():
        return None
    body, _ = HTMLExporter().from_filename(str(notebook))
    target = notebook.with_suffix(".html")
    target.write_text(body)
    return target


def write_summary(folder: Path, run: dict[str, Any], stages: list[StageSummary]) -> Path:
    """``summary.json`` and ``index.html`` of a run folder."""
    doc = {**run, "stages": [asdict(s) for s in stages]}
    (folder / SUMMARY).write_text(json.dumps(doc, indent=2, default=str) + "\n")
    (folder / INDEX).write_text(index_page(doc))
    return folder / SUMMARY


def index_page(doc: dict[str, Any]) -> str:
    """A self-contained status page linking every stage's notebook and HTML copy."""
    rows = []
    for s in doc["stages"]:
        colour = STATUS_COLOURS.get(s["status"], "#cf222e")
        links = f'<a href="{html.escape(s["notebook"])}">notebook</a>'
        if s.get("html"):
            links += f' · <a href="{html.escape(s["html"])}">html</a>'
        rows.append(
            f"<tr><td>{html.escape(s['stage'])}</td>"
            f'<td style="background:{colour};color:white">{html.escape(s["status"])}</td>'
            f"<td>{s['duration']:.1f} s</td><td>{html.escape(s['message'])}</td>"
            f"<td>{links}</td></tr>"
        )
    title = f"opsbook run {doc.get('name', '')}: {doc.get('status', '')}"
    return (
        "<!doctype html><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title>"
        "<style>body{font-family:sans-serif}td,th{padding:4px 10px;border-bottom:1px solid #ddd}"
        "</style>"
        f"<h1>{html.escape(title)}</h1>"
        f"<p>deployment {html.escape(str(doc.get('deployment', '')))}"
        f" · host {html.escape(str(doc.get('host', '')))}"
        f" · started {html.escape(str(doc.get('started', '')))}"
        " · <a href='journal.jsonl'>journal</a></p>"
        "<table><tr><th>stage</th><th>status</th><th>time</th><th>message</th><th>record</th></tr>"
        + "".join(rows)
        + "</table>"
    )


def close(folder: Path) -> None:
    """Make a finished run folder read-only, files and folders alike."""
    for root, dirs, files in os.walk(folder, topdown=False):
        for name in [*files, *dirs]:
            _drop_write_bits(Path(root) / name)
    _drop_write_bits(folder)


def _drop_write_bits(path: Path) -> None:
    path.chmod(path.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))


def list_runs(runs_dir: Path) -> Table:
    """Every run folder under ``runs_dir``, newest first."""
    rows = []
    for folder in sorted(runs_dir.glob("*"), reverse=True):
        doc = _read_record(folder)
        if doc is None:
            continue
        rows.append(
            [
                folder.name,
                doc.get("status", "?"),
                doc.get("exit_code", ""),
                doc.get("message", "")[:100],
            ]
        )
    return Table(["run", "status", "exit", "message"], rows)


def show_run(folder: Path) -> dict[str, Any]:
    """What a run folder records.

    Raises:
        RunError: it is not a run folder.
    """
    doc = _read_record(folder)
    if doc is None:
        raise RunError(f"{folder} is not a run folder", remedy="see `opsbook records list`")
    return doc


def _read_record(folder: Path) -> dict[str, Any] | None:
    for name in (SUMMARY, "run.json"):
        path = folder / name
        if path.is_file():
            try:
                loaded: dict[str, Any] = json.loads(path.read_text())
                return loaded
            except json.JSONDecodeError:
                return None
    return None
