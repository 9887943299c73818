"""Logs read as streams: several startups in one file, and a growing log followed look by look."""

from __future__ import annotations

import io
import re
from collections import Counter, deque
from dataclasses import replace
from typing import BinaryIO

from opsbook.knowledge.logscan.catalogue import load_catalogue, signals
from opsbook.knowledge.logscan.decision import _diagnose_lines
from opsbook.knowledge.logscan.diagnosis import FAILED, READY, EarlierStartup, LogDiagnosis
from opsbook.knowledge.logscan.line_grammar import _ANSI, _COMMENT
from opsbook.knowledge.logscan.log_lines import LineMemo, LogLine, logical_lines
from opsbook.knowledge.logscan.startup_shapes import Lines, Shape, Template, shape_of
from opsbook.knowledge.logscan.stream import LineScreen, screened_batches

_SIGNALS = signals()

# What a failure the log shows means while the server process still runs (LogFollower.judge):
# the startup is over (the error is fatal), it went on past the error (a handled one), or the
# log does not tell yet.
FATAL = "fatal"
WENT_ON = "went-on"
UNDECIDED = "undecided"
# How much of the log's end a follower keeps as written: the screen keeps only the lines of
# interest, and whether a process went on after an error shows in its routine lines.
RECENT_BYTES = 64 * 1024


def diagnose_log(
    text: str, *, running: bool | None = None, kernel_log: str | None = None
) -> LogDiagnosis:
    """Say what state a vLLM log shows, the failure class and what to do.

    Args:
        text: the log, of any vLLM version, possibly mangled by pasting.
        running: whether the server process is known to be alive; a log that stops without
            an error is ``loading`` when True, ``no-conclusion`` otherwise.
        kernel_log: ``dmesg`` text of the host, to recognise an OOM kill.

    Returns:
        The diagnosis of the last startup in the text (see :func:`diagnose_stream`).
    """
    stream = io.BytesIO(text.encode("utf-8", "surrogateescape"))
    return diagnose_stream(stream, running=running, kernel_log=kernel_log)


def diagnose_stream(
    stream: BinaryIO, *, running: bool | None = None, kernel_log: str | None = None
) -> LogDiagnosis:
    """Diagnose a log read as a stream, in bounded memory whatever its size.

    A file that several launches appended to (``>> vllm.log``) holds several startups: the
    diagnosis is about the last one; the earlier ones are counted with their verdicts.

    Args:
        stream: the log, opened in binary mode.
        running: as for :func:`diagnose_log`.
        kernel_log: as for :func:`diagnose_log`.

    Returns:
        The diagnosis.

    Raises:
        LogError: when the stream is not a text log or cannot be read.
    """
    splitter = _StartupSplitter()
    for batch in screened_batches(stream):
        splitter.add_lines(batch, more=True)
    last = splitter.finish()
    memo = splitter.memo
    diagnosis = _diagnose_lines(logical_lines(last.lines(), memo), running, kernel_log, memo)
    diagnosis.first_line = last.first_line
    diagnosis.skipped_lines = last.skipped
    diagnosis.earlier = splitter.earlier
    diagnosis.earlier_counts = dict(splitter.earlier_counts)
    return diagnosis


class LogFollower:
    """A growing log diagnosed look after look, as a watcher sees it: each look pushes only
    the bytes written since the last (:meth:`feed`); they are screened once and the lines of
    interest kept per startup, and each text is read once (:class:`LineMemo`), so a look costs
    about the same whether the log holds 10 kB or 1 GB of routine lines, early in the startup
    or late.
    """

    def __init__(self) -> None:
        self._screen = LineScreen()
        self._splitter = _StartupSplitter()
        self.size = 0
        self._last: tuple[tuple[object, ...], LogDiagnosis] | None = None
        self._memo = LineMemo()
        self._recent = bytearray()
        self._recent_first = 1  # the number of the first line in _recent
        self._gone_past: set[int] = set()  # error lines a process logged on after

    def feed(self, data: bytes) -> None:
        """Take the bytes the log grew by.

        Raises:
            LogError: the log runs over ``MAX_RUN_WITHOUT_NEWLINE`` bytes without a line break.
        """
        self.size += len(data)
        self._splitter.add_lines(self._screen.feed(data))
        self._keep_recent(data)

    def judge(self, diagnosis: LogDiagnosis) -> str:
        """What a failed diagnosis of a server process that still runs means for its startup.

        A startup is over when vLLM says a process of the server died (an engine's death
        notice: the diagnosis has a wrapper, or is one), or when the failure is one vLLM only
        waits on (a class that ``stalls``: Ray's placement group); it went on past the error
        when the process that logged it logged a record after it that is no error: vLLM logs a
        handled exception with its traceback and carries on (vLLM 0.32.0 vllm/plugins/__init__.py
        load_plugins_by_group: ``logger.exception("Failed to load plugin %s", ...)``).

        Returns:
            :data:`FATAL`, :data:`WENT_ON` or :data:`UNDECIDED` (nothing after it yet: the
            caller gives the startup a while, then takes the error as its end).
        """
        if diagnosis.state != FAILED or diagnosis.line is None:
            return UNDECIDED
        if _ends_the_startup(diagnosis):
            return FATAL
        number = diagnosis.line.number
        # Once gone past, an error stays so: the log's end is not read again at every look.
        if number in self._gone_past or self._went_on_after(diagnosis.line):
            self._gone_past.add(number)
            return WENT_ON
        return UNDECIDED

    def error_before_ready(self, ready: LogDiagnosis) -> LogDiagnosis | None:
        """For a diagnosis that says the server is ready: the error the log showed before the
        line that proves it ready, as a still-starting server's diagnosis would have reported
        it (an uncatalogued error the startup went past included); None when there was none.
        The server survived it: worth a warning, not a failure."""
        if ready.state != READY or ready.line is None:
            return None
        startup = self._splitter.current
        cut = ready.line.number
        before = [(n, t) for n, t in startup.lines() + self._screen.pending() if n < cut]
        found = _diagnose_lines(logical_lines(before), True, None, keep_survived=True)
        return found if found.state == FAILED and found.line is not None else None

    def _keep_recent(self, data: bytes) -> None:
        self._recent += data
        excess = len(self._recent) - RECENT_BYTES
        if excess <= 0:
            return
        cut = self._recent.find(b"\n", excess)
        cut = excess if cut < 0 else cut + 1
        self._recent_first += self._recent.count(b"\n", 0, cut)
        del self._recent[:cut]

    def _went_on_after(self, error: LogLine) -> bool:
        text = self._recent.decode("utf-8", "surrogateescape")
        physical = list(enumerate(text.split("\n"), self._recent_first))
        later = [line for line in logical_lines(physical) if line.number > error.number]
        return any(_goes_on(line, error.process) for line in later)

    def diagnose(
        self, *, running: bool | None = None, kernel_log: str | None = None
    ) -> LogDiagnosis:
        """The diagnosis of the last startup so far (as :func:`diagnose_stream` of the log).

        A look that brought no line of interest (a serving server's routine lines only) gets
        the last answer again: it is the same lines' diagnosis.
        """
        last = self._splitter.current
        pending = self._screen.pending()
        key = (
            id(last), last.last_line, len(last.head), len(last.tail), last.skipped,
            tuple(pending), len(self._splitter.earlier), running, kernel_log,
        )  # fmt: skip
        if self._last is None or self._last[0] != key:
            self._last = (key, self._diagnosed(last, pending, running, kernel_log))
        kept = self._last[1]
        # The caller's own copy: the kept one answers the next quiet look.
        return replace(kept, earlier=list(kept.earlier), earlier_counts=dict(kept.earlier_counts))

    def _diagnosed(
        self,
        startup: _Startup,
        pending: list[tuple[int, str]],
        running: bool | None,
        kernel_log: str | None,
    ) -> LogDiagnosis:
        lines = logical_lines(startup.lines() + pending, self._memo)
        diagnosis = _diagnose_lines(lines, running, kernel_log, self._memo)
        self._memo.turn()
        diagnosis.first_line = startup.first_line
        diagnosis.skipped_lines = startup.skipped
        diagnosis.earlier = list(self._splitter.earlier)
        diagnosis.earlier_counts = dict(self._splitter.earlier_counts)
        return diagnosis


def _ends_the_startup(diagnosis: LogDiagnosis) -> bool:
    if diagnosis.wrapper is not None or diagnosis.root_cause is not None:
        return True
    known = diagnosis.error_class or diagnosis.failure
    entry = next((e for e in load_catalogue() if e.id == known), None)
    return entry is not None and (entry.kind == "wrapper" or entry.walks_back or entry.stalls)


def _goes_on(line: LogLine, process: str | None) -> bool:
    """Whether ``line`` is a record of ``process`` that is no error, no traceback and no
    shutdown: the process carried on. A line without a process prefix counts only with a log
    level of its own (a traceback printed raw has none)."""
    if line.process != process or not line.text or line.is_code or line.exception:
        return False
    if line.level in ("ERROR", "CRITICAL") or (line.level is None and process is None):
        return False
    text = line.text
    return not (
        _SIGNALS.run_error.search(text)
        or _SIGNALS.shutdown.search(text)
        or _SIGNALS.exit_warning.search(text)
    )


# Bounds on what one startup keeps: its first and its last lines of interest.
STARTUP_HEAD_LINES = 10_000
STARTUP_TAIL_LINES = 10_000
EARLIER_LISTED = 1_000


class _Startup:
    """The lines of interest of one startup: the first ones and, bounded, the last ones."""

    def __init__(self, first_line: int) -> None:
        self.first_line = first_line
        self.last_line = first_line
        self.head: list[tuple[int, str]] = []
        self.tail: deque[tuple[int, str]] = deque(maxlen=STARTUP_TAIL_LINES)
        self.skipped = 0
        self.marker = -1
        self.api_pid: str | None = None
        self.api_pid_at: int | None = None  # the index of the line that gave api_pid
        self.errored = False

    def add(self, number: int, text: str) -> None:
        self.last_line = number
        if len(self.head) < STARTUP_HEAD_LINES:
            self.head.append((number, text))
            return
        if len(self.tail) == self.tail.maxlen:
            self.skipped += 1
        self.tail.append((number, text))

    def lines(self) -> list[tuple[int, str]]:
        return self.head + list(self.tail)


# Where _ANSI can match at all: an escape, or a bracket before a digit (a pasted colour code).
_ANSI_HINT = re.compile(r"\x1b|\[\d")
# One search over all startup markers first: most screened lines hold none.
_ANY_MARKER = re.compile("|".join(f"(?:{p.pattern})" for p in _SIGNALS.startup_markers))


# Words one of which every startup marker holds (tested against failures.yaml's markers): a
# substring test per line, then the regular expression only where one is found, because a
# crash-looping server's log is hundreds of thousands of lines and Python's regex tries the
# markers' alternatives at every position.
MARKER_WORDS = ("usage: vllm", "version", "args: ")


def _startup_marker(text: str) -> int | None:
    """The index of the first startup marker the line holds, or None."""
    if not any(word in text for word in MARKER_WORDS) or not _ANY_MARKER.search(text):
        return None
    return next((i for i, p in enumerate(_SIGNALS.startup_markers) if p.search(text)), None)


def _may_be_error(text: str) -> bool:
    # Substring tests first: the splitter sees every screened line of a long log.
    return "rror" in text or "xception" in text or "Traceback" in text


class _StartupSplitter:
    def __init__(self) -> None:
        self.current = _Startup(1)
        self.earlier: list[EarlierStartup] = []
        self.earlier_counts: Counter[str] = Counter()
        # A crash-looping server's log repeats one startup's texts: read once, each next
        # startup of the same shape costs a lookup, not a diagnosis.
        self.memo = LineMemo()
        self._verdicts: dict[Shape, _Verdict] = {}
        # The last startup closed line by line, with what its lines left the splitter at: a
        # next startup that repeats it is taken whole (add_lines).
        self._template: Template | None = None
        self._template_end: tuple[int, bool, int | None] = (-1, False, None)
        self._waiting: list[tuple[int, str]] = []

    def add_lines(self, lines: list[tuple[int, str]], *, more: bool = False) -> None:
        """Take lines in file order, as :meth:`add` one by one would, but a startup that
        repeats the last one closed line by line (a crash loop's) at once.

        Args:
            lines: the lines.
            more: more lines follow: the lines that may be a repeat too short yet to tell
                wait for them (:meth:`finish` takes what still waits).
        """
        if self._waiting:
            lines, self._waiting = self._waiting + lines, []
        at = 0
        while at < len(lines):
            template = self._template
            if template is not None and len(self.current.head) == 1:
                end = at + template.size
                if end > len(lines) and more:
                    self._waiting = lines[at:]
                    return
                if end <= len(lines) and template.repeats(self.current.head[0], lines[at:end]):
                    self._take_repeat(template, lines[at:end])
                    at = end
                    continue
            self.add(*lines[at])
            at += 1

    def _take_repeat(self, template: Template, rest: list[tuple[int, str]]) -> None:
        """The current startup's other lines, as the template's were taken, then the first
        line of the next: it begins the next startup, as it did after the template."""
        current = self.current
        current.head += rest[:-1]
        current.last_line = rest[-2][0] if len(rest) > 1 else current.last_line
        current.marker, current.errored, current.api_pid_at = self._template_end
        if current.api_pid_at is not None:
            current.api_pid = _api_pid(current.head[current.api_pid_at][1])
        self.add(*rest[-1], shape=template.shape)

    def add(self, number: int, text: str, *, shape: Shape | None = None) -> None:
        plain = _plain(text)
        marker = _startup_marker(plain)
        pid_found = _SIGNALS.api_server_pid.search(plain)
        pid = pid_found.group(1) if pid_found else None
        current = self.current
        restarted = marker is not None and (current.marker >= marker or current.errored)
        if restarted or self._new_api_server(pid):
            self._close(number, text, shape)
            current = self.current
        if marker is not None:
            current.marker = max(current.marker, marker)
        if pid and current.api_pid is None:
            current.api_pid = pid
            current.api_pid_at = len(current.head) + len(current.tail)
        # A comment pasted with the log (a shell's, a provenance note) is not a run's error.
        if (
            not current.errored
            and _may_be_error(plain)
            and not _COMMENT.match(plain)
            and _SIGNALS.run_error.search(plain)
        ):
            current.errored = True
        current.add(number, text)

    def _new_api_server(self, pid: str | None) -> bool:
        # One run's lines all carry the API server's PID prefix or none do: a PID prefix after
        # a started run without one, or another PID, is the next run.
        current = self.current
        if pid is None:
            return False
        return pid != current.api_pid if current.api_pid else current.marker >= 0

    def finish(self) -> _Startup:
        waiting, self._waiting = self._waiting, []
        self.add_lines(waiting)
        return self.current

    def _close(self, next_first: int, next_text: str, shape: Shape | None) -> None:
        """End the current startup at the line ``next_first`` (``next_text``); ``shape`` is
        its shape when it repeated the template."""
        startup = self.current
        kept = startup.lines()
        if shape is None:
            shape = self._remember(startup, kept, (next_first, next_text))
        state, failure, at = self._verdict(kept, shape)
        self.earlier_counts[state] += 1
        self.earlier.append(
            EarlierStartup(
                startup.first_line,
                startup.last_line,
                state,
                failure,
                kept[at][0] if at is not None else None,
            )
        )
        del self.earlier[:-EARLIER_LISTED]
        self.current = _Startup(next_first)

    def _remember(self, startup: _Startup, kept: Lines, following: tuple[int, str]) -> Shape:
        """The startup's shape; it becomes the template when it was kept whole."""
        if not kept or startup.skipped or len(startup.head) >= STARTUP_HEAD_LINES:
            self._template = None
            return shape_of(kept)
        self._template = Template(kept, following)
        self._template_end = (startup.marker, startup.errored, startup.api_pid_at)
        return self._template.shape

    def _verdict(self, kept: list[tuple[int, str]], shape: Shape) -> _Verdict:
        """An earlier startup's state, failure and the index of its key line among ``kept``:
        the verdict of the same startup met before (a crash loop's), else diagnosed."""
        known = self._verdicts.pop(shape, None)
        if known is None:
            lines = logical_lines(kept, self.memo)
            found = _diagnose_lines(lines, False, None, self.memo)
            self.memo.turn()
            number = found.line.number if found.line else None
            at = next((i for i, (n, _) in enumerate(kept) if n == number), None)
            known = (found.state, found.failure, at)
        self._verdicts[shape] = known
        if len(self._verdicts) > KNOWN_SHAPES:
            del self._verdicts[next(iter(self._verdicts))]
        return known


def _plain(text: str) -> str:
    return _ANSI.sub("", text) if _ANSI_HINT.search(text) else text


def _api_pid(text: str) -> str | None:
    found = _SIGNALS.api_server_pid.search(_plain(text))
    return found.group(1) if found else None


# The startup shapes whose verdicts are kept (a crash loop repeats one, or a few in turn).
KNOWN_SHAPES = 32
_Verdict = tuple[str, "str | None", "int | None"]
