"""A unified diff as people read it: monospace, added lines green, removed red, the ``@@``
headers of each hunk marked, in a notebook (its HTML, kept by the HTML copy of a run record)
and in a terminal.

A stage shows the changes it plans or makes (the config patch's plan, the launch script on
upload) as a :class:`Diff`; the stage runner keeps each in the run record, where
``opsbook records show RUN --diff`` prints them again.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from dataclasses import dataclass

# The line kinds of a unified diff.
FILE = "file"  # ---/+++ before a hunk
HUNK = "hunk"  # @@ -a,b +c,d @@
ADDED = "added"
REMOVED = "removed"
CONTEXT = "context"
OTHER = "other"  # "\ No newline at end of file", text around the diff

_HUNK = re.compile(r"^@@ -\d+(?:,(\d+))? \+\d+(?:,(\d+))? @@")

# Inline styles: a notebook saved to HTML keeps them without a stylesheet, and JupyterLab's
# sanitizer lets style attributes through.
_BLOCK_STYLE = (
    "font-family:SFMono-Regular,Menlo,Consolas,'Liberation Mono',monospace;font-size:12px;"
    "line-height:1.45;margin:4px 0;padding:6px 0;border:1px solid #d0d7de;border-radius:6px;"
    "overflow-x:auto;white-space:pre;background:#ffffff;color:#1f2328"
)
_LINE_STYLES = {
    FILE: "font-weight:bold",
    HUNK: "color:#0550ae;background:#ddf4ff",
    ADDED: "color:#116329;background:#dafbe1",
    REMOVED: "color:#82071e;background:#ffebe9",
    CONTEXT: "",
    OTHER: "color:#59636e;font-style:italic",
}
# ANSI SGR codes of a colour terminal.
_ANSI = {FILE: "1", HUNK: "36", ADDED: "32", REMOVED: "31", OTHER: "2"}


@dataclass(frozen=True)
class Diff:
    """A unified diff for a notebook; prints (and is filed as text) as the diff itself.

    Args:
        text: the diff (``git diff`` style).
        title: what it changes, for the record (``config patch of /models/x``).
    """

    text: str
    title: str = ""

    def _repr_html_(self) -> str:
        return diff_html(self.text)

    def __str__(self) -> str:
        return self.text

    def __repr__(self) -> str:
        # A notebook's text/plain output (and nbval) holds the diff, not its markup.
        return self.text


def line_kinds(text: str) -> Iterator[tuple[str, str]]:
    """Each line of a unified diff (without its newline) with its kind.

    The hunk headers' line counts say where a hunk ends, so a removed line that reads
    ``-- x`` is not taken for a file header.
    """
    old = new = 0
    for line in text.splitlines():
        if old > 0 or new > 0:
            kind = _in_hunk(line)
            old -= kind in (CONTEXT, REMOVED)
            new -= kind in (CONTEXT, ADDED)
            yield kind, line
            continue
        found = _HUNK.match(line)
        if found:
            old, new = (int(n) if n is not None else 1 for n in found.groups())
            yield HUNK, line
        elif line.startswith(("--- ", "+++ ")):
            yield FILE, line
        else:
            yield OTHER, line


def _in_hunk(line: str) -> str:
    if line.startswith("+"):
        return ADDED
    if line.startswith("-"):
        return REMOVED
    if line.startswith("\\"):
        return OTHER
    return CONTEXT


def diff_html(text: str) -> str:
    """The diff as a monospace block, one coloured line per line of the diff."""
    lines = []
    for kind, line in line_kinds(text):
        style = _LINE_STYLES[kind]
        # A block per line: its background spans the width, as in a code review.
        lines.append(
            f'<span class="opsbook-diff-{kind}" style="display:block;padding:0 8px;{style}">'
            f"{html.escape(line) or ' '}</span>"
        )
    return f'<pre class="opsbook-diff" style="{_BLOCK_STYLE}">' + "".join(lines) + "</pre>"


def diff_terminal(text: str, colour: bool = False) -> str:
    """The diff for a terminal: as it is, or with ANSI colours when ``colour``."""
    if not colour:
        return text.rstrip("\n")
    return "\n".join(
        f"\033[{_ANSI[kind]}m{line}\033[0m" if kind in _ANSI else line
        for kind, line in line_kinds(text)
    )
