"""What the command prints as a run goes: each host's result, live lines, the recap.

Where standard output is not a terminal (CI, cron, a pipe, a file) the lines are plain and
byte for byte what the command always printed: scripts and tests parse them. On a terminal
they are fitted to its width and coloured by rich, imported only then, so that a command that
prints nothing of this (``opsbook --help``) does not pay for it. rich honours ``NO_COLOR`` and
``TERM=dumb``.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, TextIO

from opsbook.core.channel import StageProgress
from opsbook.core.results import HostRecap, HostResult, State, Table

if TYPE_CHECKING:
    from opsbook.runner.history import FactsDiff

if TYPE_CHECKING:
    from opsbook.steps.plan import CapacityPlan

# Columns of a result line before its message (results.HostResult.line): stage, host, state,
# time; a message that does not fit beside them goes under them, indented as the remedy is.
INDENT = 15
STATE_STYLES = {
    State.OK: "green",
    State.CHANGED: "yellow",
    State.WOULD_CHANGE: "magenta",
    State.SKIPPED: "dim",
    State.FAILED: "bold red",
    State.UNREACHABLE: "bold red",
}
RECAP_STYLES = {
    r"\bok=[1-9]\d*": "green",
    r"\bchanged=[1-9]\d*": "yellow",
    r"\b(failed|unreachable)=[1-9]\d*": "bold red",
    r"\(\S+ at \S+:.*\)": "red",
    r"\[rolled back\]$": "bold yellow",
}


class Terminal:
    """Prints the lines of a run to ``stream`` (standard output at the time of each call by
    default): plain unless it is a terminal.

    Args:
        stream: where lines go.
        tty: whether it is a terminal (default: ``stream.isatty()``).
        width: its width in columns (default: what the terminal says).
    """

    def __init__(
        self, stream: TextIO | None = None, *, tty: bool | None = None, width: int | None = None
    ):
        self.stream = stream
        self.tty = tty
        self.width = width
        self._console: Any = None

    @property
    def out(self) -> TextIO:
        return self.stream or sys.stdout

    def is_tty(self) -> bool:
        if self.tty is not None:
            return self.tty
        try:
            return self.out.isatty()
        except (AttributeError, ValueError):  # a closed or file-less stream
            return False

    def console(self) -> Any:
        """The rich console over the stream (made on first use: rich is imported here)."""
        if self._console is None or self._console.file is not self.out:
            from rich.console import Console

            self._console = Console(
                file=self.out, force_terminal=True, width=self.width, highlight=False
            )
        return self._console

    def result(self, result: HostResult) -> None:
        """A host's result as its stage ends, with its remedy when it did not end well."""
        remedy = result.remedy if result.remedy and not result.ok else ""
        if not self.is_tty():
            self.plain(result.line())
            if remedy:
                self.plain(f"{'':<{INDENT}}remedy: {remedy}")
            return
        from rich.padding import Padding
        from rich.text import Text

        console = self.console()
        head = Text.assemble(
            f"{result.stage:<14} {result.host:<32} ",
            (f"{result.state.value:<12}", STATE_STYLES[result.state]),
            f" {result.duration:6.1f} s",
        )
        message = Text(result.message)
        if head.cell_len + 2 + message.cell_len <= console.width:
            console.print(Text.assemble(head, "  ", message), no_wrap=True)
        else:
            console.print(head, no_wrap=True, overflow="ellipsis")
            if result.message:
                console.print(Padding(message, (0, 0, 0, INDENT), expand=False))
        if remedy:
            said = Text.assemble(("remedy: ", "bold"), remedy)
            console.print(Padding(said, (0, 0, 0, INDENT), expand=False))
        self.out.flush()

    def progress(self, progress: StageProgress) -> None:
        """A live line of a long stage: on a terminal dimmed, its host not padded (the log's
        words come sooner) and cut to one line."""
        if not self.is_tty():
            self.plain(progress.line())
            return
        from rich.text import Text

        p = progress
        line = Text(f"{p.stage:<14} {p.host} ... {p.seconds:5.0f} s  {p.text}", style="dim")
        self.console().print(line, no_wrap=True, overflow="ellipsis")
        self.out.flush()

    def recap(
        self,
        lines: Sequence[HostRecap],
        status: str,
        message: str,
        ok: bool,
        notes: Mapping[str, str] | None = None,
    ) -> None:
        """The recap, a line per host (ending with its note, such as "rolled back", when
        ``notes`` has one), then the run's status and message."""
        width = max((len(line.host) for line in lines), default=0)
        notes = notes or {}
        shown = [
            line.line(width) + (f"  [{notes[line.host]}]" if line.host in notes else "")
            for line in lines
        ]
        ending = f"{status}: {message}"
        if not self.is_tty():
            if shown:
                self.plain("RECAP", *shown)
            self.plain(ending)
            return
        from rich.text import Text

        console = self.console()
        if shown:
            console.print(Text("RECAP", style="bold"))
        for line in shown:
            text = Text(line)
            for pattern, style in RECAP_STYLES.items():
                text.highlight_regex(pattern, style)
            console.print(text)
        console.print(Text(ending, style="bold green" if ok else "bold red"))
        self.out.flush()

    def table(self, table: Table, title: str = "") -> None:
        """A table of records (``records list``, ``last-good``, ``search``): aligned text off a
        terminal, a rich table on one."""
        if not self.is_tty():
            self.plain(*([title] if title else []), str(table))
            return
        from rich.table import Table as RichTable

        shown = RichTable(*table.columns, title=title or None, title_justify="left")
        for row in table.rows:
            shown.add_row(*("" if v is None else str(v) for v in row))
        self.console().print(shown)
        self.out.flush()

    def facts_diff(self, diff: FactsDiff) -> None:
        """``records diff``: a head, a line per section with how many facts changed (as
        ``git diff --stat``), then each fact old and new side by side."""
        stat = diff.stat()
        width = max((len(name) for name, _ in stat), default=0)
        lines = [f" {name:<{width}} | {count:>3} {'~' * min(count, 40)}" for name, count in stat]
        if not self.is_tty():
            self.plain(diff.head(), *lines)
            if diff.changes:
                self.plain("", str(diff.table()))
            return
        from rich.text import Text

        console = self.console()
        console.print(Text(diff.head(), style="bold"))
        for line in lines:
            text = Text(line)
            text.stylize("yellow", line.index("|") + 6)
            console.print(text, no_wrap=True)
        if not diff.changes:
            self.out.flush()
            return
        from rich.table import Table as RichTable

        shown = RichTable("host", "fact", "old", "new", "moved")
        for row in diff.table().rows:
            host, key, old, new, moved = (str(v) for v in row)
            shown.add_row(host, key, Text(old, style="red"), Text(new, style="green"), moved)
        console.print(shown)
        self.out.flush()

    def plain(self, *lines: str) -> None:
        for line in lines:
            print(line, file=self.out, flush=True)

    def capacity_plan(self, plan: CapacityPlan, where: str) -> str:
        """A capacity plan as the command prints it: where, the verdict, the figures, the
        knobs (the exact edits of the deployment file), plain text."""
        lines = [f"{where}: {plan.message}", "", str(plan.table())]
        if plan.knobs:
            lines += ["", "knobs, best first:", str(plan.knobs_table())]
        return "\n".join(lines) + "\n"
