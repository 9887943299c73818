"""Progress display for long steps: a progress bar in JupyterLab, occasional lines elsewhere.

:func:`progress_reporter` returns a callable ``report(done, line)``. In a Jupyter kernel with
a frontend it draws an ``ipywidgets.IntProgress`` and a label; headless (papermill, which
``opsbook run`` marks with ``OPSBOOK_HEADLESS=1``, or plain Python) it writes at most one line
every ``interval`` seconds, plus the last, so that a run's stored output stays short.

This module and :mod:`opsbook.steps.plots` are the display side of the package: writing to the
notebook's output is their purpose.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

from opsbook.core.channel import HEADLESS_ENV

DEFAULT_INTERVAL = 10.0


class Reporter:
    """Shows progress: call it with the work done so far and a line describing it."""

    def __call__(self, done: int, line: str) -> None:
        raise NotImplementedError

    def finish(self) -> None:
        """Show the last line if it was held back (a step that ended before its total)."""


class LineReporter(Reporter):
    """Writes ``label: line`` at most once every ``interval`` seconds, plus the last.

    Args:
        total: the amount of work that means done.
        label: what is being done, put before each line.
        interval: least seconds between two lines (the first and the last always show).
        stream: where lines go (default: standard output at the time of each call).
        clock: time source (for tests).
    """

    def __init__(
        self,
        total: int,
        label: str,
        *,
        interval: float = DEFAULT_INTERVAL,
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.total = total
        self.label = label
        self.interval = interval
        self.stream = stream
        self.clock = clock
        self.last_shown: float | None = None
        self.held: str | None = None
        self.finished = False

    def __call__(self, done: int, line: str) -> None:
        if self.finished:
            return
        now = self.clock()
        complete = done >= self.total
        due = self.last_shown is None or now - self.last_shown >= self.interval
        if complete or due:
            self.write(line)
            self.last_shown = now
            self.finished = complete
        else:
            self.held = line

    def finish(self) -> None:
        if self.held is not None and not self.finished:
            self.write(self.held)
        self.finished = True

    def write(self, line: str) -> None:
        stream = self.stream or sys.stdout
        stream.write(f"{self.label}: {line}\n")
        stream.flush()
        self.held = None


class WidgetReporter(Reporter):
    """An ``IntProgress`` bar with a label under it, updated on every call.

    Args:
        total: the bar's maximum.
        label: the bar's description.
    """

    def __init__(self, total: int, label: str):
        import ipywidgets
        from IPython.display import display

        self.bar = ipywidgets.IntProgress(value=0, min=0, max=max(total, 1), description=label)
        self.text = ipywidgets.Label(value="")
        self.total = total
        display(ipywidgets.VBox([self.bar, self.text]))

    def __call__(self, done: int, line: str) -> None:
        self.bar.value = min(max(done, 0), self.bar.max)
        self.text.value = line
        if done >= self.total:
            self.bar.bar_style = "success"

    def finish(self) -> None:
        if self.bar.value < self.bar.max:
            self.bar.bar_style = "warning"


def progress_reporter(
    total: int,
    label: str,
    *,
    interval: float = DEFAULT_INTERVAL,
    widgets: bool | None = None,
    stream: TextIO | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> Reporter:
    """A progress display suited to where the code runs.

    Args:
        total: the amount of work that means done (shards, bytes, per mille...).
        label: what is being done, e.g. ``"sha256"``.
        interval: for lines, least seconds between two of them.
        widgets: force the bar (True) or lines (False); by default a bar only in a Jupyter
            kernel with a frontend, and never when ``OPSBOOK_HEADLESS=1``.
        stream: for lines, where they go (default: standard output).
        clock: for lines, the time source (for tests).

    Returns:
        A :class:`Reporter`: call ``report(done, line)`` after each piece of work and
        ``report.finish()`` at the end.
    """
    use_widgets = has_frontend() if widgets is None else widgets
    if use_widgets:
        try:
            return WidgetReporter(total, label)
        except ImportError:
            pass
    return LineReporter(total, label, interval=interval, stream=stream, clock=clock)


def has_frontend(environ: dict[str, str] | None = None) -> bool:
    """Whether a progress bar can be seen: inside a Jupyter kernel, and not headless.

    papermill and nbval run a kernel with nobody looking at it; ``opsbook run`` says so
    with ``OPSBOOK_HEADLESS=1``.
    """
    env = os.environ if environ is None else environ
    if env.get(HEADLESS_ENV, "") not in ("", "0"):
        return False
    return in_kernel()


def in_kernel() -> bool:
    """Whether this code runs in an IPython kernel (not a terminal IPython or plain Python)."""
    if "IPython" not in sys.modules:
        # A kernel has always imported IPython; importing it here would only cost time.
        return False
    from IPython import get_ipython

    shell: Any = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None
