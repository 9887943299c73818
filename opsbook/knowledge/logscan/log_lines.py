"""Logical log lines: physical lines cleaned, their prefixes read, terminal-wrapped pieces
joined; and the memo that lets a follower read each text once."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from opsbook.knowledge.logscan.line_grammar import (
    _BARE_EXCEPTION_LINE,
    _CANN_PLACE,
    _COMMENT,
    _EXCEPTION_LINE,
    _EXCEPTION_REPR,
    _FENCE,
    _HEADING,
    _INNER_PROCESS,
    _MARKERS_ONLY,
    _MIN_WRAP_WIDTH,
    _NOT_A_CAUSE,
    PLACEHOLDER_YEAR,
    _clean,
    _continues,
    _quoted_exception,
    _strip_prefixes,
    _wrap_candidate,
    _year_in,
)


@dataclass(frozen=True)
class LogLine:
    """One logical log line (terminal-wrapped pieces joined).

    Args:
        number: 1-based line number of its first physical line (as ``grep -n`` counts).
        raw: the original text; wrapped pieces joined with newlines.
        text: the message with ANSI codes, quote markers and prefixes removed.
        level: the log level when the line has one (``INFO``, ``ERROR``...).
        timestamp: when the line's prefix carries a time (see ``PLACEHOLDER_YEAR``).
        is_code: a traceback's frame or source line, never a message.
        process: the process prefix (``EngineCore_DP0 pid=7``, ``rank0``) when there is one.
        exception: an exception's line (``Name: message``): a known exception name, or any
            name on the line that ends a traceback's frames.
    """

    number: int
    raw: str
    text: str
    level: str | None = None
    timestamp: datetime | None = None
    is_code: bool = False
    process: str | None = None
    exception: bool = False


def normalise_line(line: str) -> str:
    """Strip ANSI codes, quote markers and every known prefix from one physical line.

    Args:
        line: a line as it appears in a log or a pasted issue.

    Returns:
        The bare message, e.g. ``ValueError: ...`` for
        ``> (EngineCore_DP0 pid=7) ERROR 03-12 10:11:12 [core.py:1] ValueError: ...``.
    """
    return _strip_prefixes(_clean(line), PLACEHOLDER_YEAR)[0].strip()


def read_log_lines(text: str) -> list[LogLine]:
    """Split a log into logical lines, joining pieces a terminal wrapped.

    Args:
        text: the whole log.

    Returns:
        One ``LogLine`` per logical line, numbered like ``grep -n``.
    """
    return logical_lines(list(enumerate(text.split("\n"), 1)))


def logical_lines(
    physical: Sequence[tuple[int, str]], memo: LineMemo | None = None
) -> list[LogLine]:
    """Logical lines from numbered physical lines (a gap in the numbers breaks any joining).

    Args:
        physical: ``(line number, text)`` in file order, e.g. from
            :func:`opsbook.knowledge.logscan.stream.screened_lines`.
        memo: what earlier looks at the same growing log read each text as (see
            :class:`LineMemo`); the lines come out the same with it or without.

    Returns:
        One ``LogLine`` per logical line.
    """
    memo = memo or LineMemo()
    pieces = [piece for number, text in physical for piece in _lost_breaks(number, text)]
    numbers = [number for number, _ in pieces]
    raws = [text.rstrip("\r") for _, text in pieces]
    cleaned = [memo.cleaned.get(line, _clean) for line in raws]
    year = _first_year(raws, memo)
    lines: list[LogLine] = []
    after_frame = after_code = False
    for members in _wrapped_groups(numbers, cleaned, memo):
        joined = "".join(cleaned[i] for i in members)
        read = memo.read.get((joined, year), _read_message)
        body = read.body
        is_code = (
            read.code
            or (after_frame and read.indented)
            or (len(members) == 1 and read.relayed_source)
        ) and not read.cann_place
        after_frame = read.frame
        exception = not is_code and (read.exception or (after_code and read.bare_exception))
        if body:
            after_code = is_code
        raw = "\n".join(raws[i] for i in members)
        lines.append(
            LogLine(
                numbers[members[0]], raw, body, read.level, read.stamp, is_code, read.process,
                exception,
            )
        )  # fmt: skip
    return _roll_years(lines)


@dataclass(frozen=True)
class _ReadMessage:
    """What one logical line's text says on its own, whatever lines surround it."""

    body: str
    level: str | None
    stamp: datetime | None
    process: str | None
    code: bool  # a frame, a ``raise`` or a marker line: code wherever it stands
    indented: bool  # code when it follows a frame
    relayed_source: bool  # code when it is a single physical line
    cann_place: bool  # never code
    frame: bool
    exception: bool
    bare_exception: bool  # an exception line when it follows code


def _read_message(key: tuple[str, int]) -> _ReadMessage:
    joined, year = key
    if _COMMENT.match(joined) or _FENCE.match(joined.strip()):
        joined = ""
    joined = _HEADING.sub("", joined, count=1)
    message, level, stamp, process = _strip_prefixes(joined, year)
    body = _EXCEPTION_REPR.sub(r"\g<name>: \g<message>", message.strip(), count=1)
    if level is None and process is None:
        body = _quoted_exception(body)
    return _ReadMessage(
        body=body,
        level=level,
        stamp=stamp,
        process=process,
        code=body.startswith(("raise ", 'File "')) or bool(_MARKERS_ONLY.fullmatch(body) and body),
        indented=message[:1].isspace(),
        relayed_source=_relayed_source_line(message, level, body),
        cann_place=bool(_CANN_PLACE.search(body)),
        frame=body.startswith('File "'),
        exception=bool(_EXCEPTION_LINE.match(body)),
        bare_exception=bool(_BARE_EXCEPTION_LINE.match(body)),
    )


def _lost_breaks(number: int, text: str) -> list[tuple[int, str]]:
    """A physical line that holds several lines of a prefixed log (a paste that lost its
    line breaks) as those lines, all with its number; any other line as it is."""
    if text.count("pid=") < 2:
        return [(number, text)]
    inner = [found.start() for found in _INNER_PROCESS.finditer(text)]
    if not inner:
        return [(number, text)]
    bounds = [0, *inner, len(text)]
    return [(number, text[start:end]) for start, end in zip(bounds, bounds[1:], strict=False)]


def _relayed_source_line(message: str, level: str | None, body: str) -> bool:
    """A traceback's indented source line relayed line by line at ERROR level (vLLM's
    ``logger.exception`` of a worker's or an engine core's failure prefixes every line of
    the traceback): code even in an excerpt that starts below its ``File`` line."""
    return (
        level in ("ERROR", "CRITICAL")
        and message.startswith("  ")
        and not _EXCEPTION_LINE.match(body)
        and not _NOT_A_CAUSE.match(body)
    )


def _wrapped_groups(numbers: list[int], cleaned: list[str], memo: LineMemo) -> list[list[int]]:
    # Indexes of the physical lines that make up each logical line.
    width = _wrap_width(cleaned, memo)
    groups: list[list[int]] = []
    for index, line in enumerate(cleaned):
        adjacent = index > 0 and numbers[index] == numbers[index - 1] + 1
        if (
            groups
            and adjacent
            and memo.continues.get((cleaned[index - 1], line, width), _continues_key)
        ):
            groups[-1].append(index)
        else:
            groups.append([index])
    return groups


def _continues_key(key: tuple[str, str, int | None]) -> bool:
    return _continues(*key)


class _Kept:
    """Values computed from a key, kept from one look at a growing log to the next: a look
    computes only those of keys it has not met. Each look keeps only the values it used
    (:meth:`turn`), so what is kept never outgrows the lines the follower itself keeps."""

    def __init__(self) -> None:
        self._used: dict[Any, Any] = {}
        self._earlier: dict[Any, Any] = {}

    def get(self, key: Any, compute: Any) -> Any:
        value = self._used.get(key, _UNSET)
        if value is _UNSET:
            value = self._earlier.pop(key, _UNSET)
            if value is _UNSET:
                value = compute(key)
            self._used[key] = value
        return value

    def turn(self) -> None:
        self._earlier, self._used = self._used, {}


_UNSET = object()


class LineMemo:
    """What each text of a log was read as: how it was cleaned, its prefixes and message,
    whether it continues the line above, which catalogue patterns and phase it matches. All
    of these depend on the text alone, so a follower that keeps them between looks reads each
    new line once and the lines it has seen at the cost of a lookup; the diagnosis is the same
    with the memo or without it."""

    def __init__(self) -> None:
        self.cleaned = _Kept()
        self.read = _Kept()
        self.wrap_candidate = _Kept()
        self.continues = _Kept()
        self.matches = _Kept()
        self.caseless = _Kept()
        self.phase = _Kept()
        self.year = _Kept()

    def turn(self) -> None:
        """End a look: forget what it did not use."""
        for kept in vars(self).values():
            kept.turn()


def _first_year(lines: Iterable[str], memo: LineMemo) -> int:
    years = (memo.year.get(line, _year_in) for line in lines)
    return next((year for year in years if year is not None), PLACEHOLDER_YEAR)


def _roll_years(lines: list[LogLine]) -> list[LogLine]:
    # A log that runs over New Year goes from 12-31 to 01-01; keep its times increasing. Only
    # that step adds a year: logs appended to one file also step back in time, and a stamp
    # that would leave the calendar keeps its year.
    years = 0
    previous: datetime | None = None
    rolled = []
    for line in lines:
        stamp = line.timestamp
        if stamp is not None:
            if previous is not None and previous.month == 12 and stamp.month == 1:
                years += 1
            if years:
                line = replace(line, timestamp=_add_years(stamp, years))
            previous = stamp
        rolled.append(line)
    return rolled


def _add_years(stamp: datetime, years: int) -> datetime:
    try:
        return stamp.replace(year=stamp.year + years)
    except ValueError:  # past year 9999, or 02-29 in a year that has none
        return stamp


def _wrap_width(cleaned: list[str], memo: LineMemo) -> int | None:
    # A terminal cuts every long line at the same column: that column, seen twice, is the width.
    widths = Counter(
        len(previous)
        for previous, line in zip(cleaned, cleaned[1:], strict=False)
        if len(previous) >= _MIN_WRAP_WIDTH and memo.wrap_candidate.get(line, _wrap_candidate)
    )
    if not widths:
        return None
    width, count = widths.most_common(1)[0]
    return width if count >= 2 else None


def _position(lines: Sequence[LogLine], line: LogLine) -> int:
    """Where ``line`` (that very line, not an equal one) is in ``lines``."""
    return next(i for i, each in enumerate(lines) if each is line)


def _number_of(line: LogLine) -> int:
    return line.number
