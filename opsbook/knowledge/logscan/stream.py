"""Read a log of any size as a stream and keep only the lines worth diagnosing.

A long-running vLLM server writes mostly routine ``INFO`` lines (request logs, throughput
metrics); a diagnosis needs the few others: errors, warnings, tracebacks, unprefixed output of
other libraries (NCCL, Ray, the kernel), and the ``INFO`` lines that mark the startup phases.
One combined regular expression finds, at each line start, the routine ``INFO`` lines and skips
them in C; only the remaining lines (and two lines of context each side, for terminal-wrapped
pieces and traceback frames) reach Python code. Memory stays bounded: the file is read in
chunks and a line longer than :data:`MAX_LINE_BYTES` is cut.

Line numbers are those of ``grep -n``: only ``\\n`` ends a line (a ``\\r`` of a progress bar
does not).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import BinaryIO

from opsbook.core.exceptions import LogError

CHUNK_BYTES = 1 << 20
# A longer line is cut here: no vLLM message is near this long, and the cut bounds memory.
MAX_LINE_BYTES = 1 << 16
# So much data without a line break is no log (``/dev/zero``, a binary file): refuse it.
MAX_RUN_WITHOUT_NEWLINE = 1 << 28
CONTEXT_BEFORE = 2
CONTEXT_AFTER = 2

# The message starts of routine INFO lines that still matter: the startup markers and phases
# of opsbook.knowledge.logscan (PHASE_PATTERNS, the version lines, the notes of the catalogue).
INTERESTING_INFO_STARTS = (
    "vLLM API server version",
    "non-default args",
    "args: Namespace",
    "Initializing a",
    "Using ",
    "Valid backends",
    "Starting",
    "Loading ",
    "Model loading took",
    "torch.compile",
    "Dynamo bytecode",
    "Compiling a graph",
    "Directly load",
    "Available ",
    "GPU KV cache size",
    "Maximum concurrency",
    "# GPU blocks",
    "# gpu blocks",
    "Memory profiling",
    "Capturing",
    "Graph capturing",
    "init engine",
    "Core engine process",
    "Route: /",
    "Started server",
    "Application startup",
    "Uvicorn running",
    "vLLM gRPC server started",
    "Server is ready to accept",
    "Free memory on",
    "Custom allreduce",
    "SymmMemCommunicator",
    "vLLM is using nccl",
    "Found nccl",
    "Waiting for",
    "No available",
    "No platform detected",  # no-device: logged at INFO by vLLM 0.10.2
    " ",  # the banner's block letters and other indented text
)
_ANSI = rb"(?:\x1b\[[\d;]*m)?"
# What a log's carrier puts before each line, skipped with the routine line behind it: a
# container runtime's RFC 3339 time (docker logs -t), journald's time, host and unit, a
# compose container's name (opsbook.knowledge.logscan removes the same prefixes).
_CARRIER = (
    rb"(?:\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)? "
    rb"|[A-Z][a-z]{2} +\d{1,2} \d\d:\d\d:\d\d \S+ [\w.@/:-]+(?:\[\d+\])?: "
    rb"|[\w.-]{1,40} +\| ?)?"
)
_ROUTINE = (
    _CARRIER
    + _ANSI
    + rb"(?:\([^()\n]{1,80}pid=\d+[^()\n]{0,40}\)"
    + _ANSI
    + rb" )?"
    + _ANSI
    + rb"(?:(?:INFO|DEBUG) \d\d-\d\d \d\d:\d\d:\d\d(?:[.,]\d+)? \[?[\w./<>-]+:\d+\] (?!"
    + b"|".join(re.escape(start.encode()) for start in INTERESTING_INFO_STARTS)
    + rb")"
    + rb"|INFO:     \d+\.\d+\.\d+\.\d+:\d+ - \")"  # uvicorn's access log
)
ROUTINE_LINE = re.compile(_ROUTINE)
# A line start that is not routine: the one combined expression of the screen.
INTERESTING_LINE_START = re.compile(rb"\n(?!" + _ROUTINE + rb")")


def is_routine(line: str) -> bool:
    """Whether the screen skips this physical line (a routine ``INFO`` line)."""
    return ROUTINE_LINE.match(line.encode("utf-8", "replace")) is not None


def screened_lines(stream: BinaryIO) -> Iterator[tuple[int, str]]:
    """The physical lines worth diagnosing, with their context, in file order.

    Args:
        stream: the log, opened in binary mode.

    Yields:
        ``(line number, text)``; numbers increase, with gaps where routine lines were skipped.
        The last line with text is always among them.

    Raises:
        LogError: when the stream holds more than ``MAX_RUN_WITHOUT_NEWLINE`` bytes without a
            line break (not a text log), or cannot be read.
    """
    reader = _Reader(stream)
    yield from reader.lines()


class LineScreen:
    """The same screen over a growing log, pushed in piece by piece as it is written: each
    piece is screened once (a watcher never re-reads what it has seen)."""

    def __init__(self) -> None:
        self._reader = _Reader()

    def feed(self, data: bytes) -> list[tuple[int, str]]:
        """The lines of interest that ``data`` completes, with their numbers.

        Raises:
            LogError: the log runs over ``MAX_RUN_WITHOUT_NEWLINE`` bytes without a line break.
        """
        return list(self._reader.feed(data))

    def pending(self) -> list[tuple[int, str]]:
        """The last line with text if the screen skipped it, and the line still being written
        (diagnosed as they are now, not kept)."""
        return self._reader.pending()


class _Reader:
    """The screen over a stream read in chunks, or over bytes pushed in as they come
    (:meth:`feed`, then :meth:`end`): the same lines either way."""

    def __init__(self, stream: BinaryIO | None = None) -> None:
        self.stream = stream
        self.first_number = 1  # the number of the next block's first line
        self.emitted = 0  # the last line number yielded
        self.last_text: tuple[int, bytes] | None = None
        self.carry = b""  # the unfinished last line (its first MAX_LINE_BYTES)
        self.overflow = 0  # bytes of an over-long line dropped so far
        # The last lines of the block before: the context of a line of interest on either
        # side of where one piece ended and the next began.
        self.before = b""
        self.before_count = 0

    def lines(self) -> Iterator[tuple[int, str]]:
        while True:
            chunk = self._read()
            if not chunk:
                break
            yield from self.feed(chunk)
        yield from self.end()

    def feed(self, chunk: bytes) -> Iterator[tuple[int, str]]:
        """The lines of interest that ``chunk`` completes."""
        if self.overflow:
            cut = chunk.find(b"\n")
            if cut < 0:
                self.overflow = self._count_overflow(self.overflow, len(chunk))
                return
            chunk, self.overflow = chunk[cut:], 0
        data = self.carry + chunk
        end = data.rfind(b"\n")
        if end < 0:
            self.carry = data[:MAX_LINE_BYTES]
            if len(data) > MAX_LINE_BYTES:
                self.overflow = self._count_overflow(0, len(data) - MAX_LINE_BYTES)
            return
        self.carry = data[end + 1 :]
        if len(self.carry) > MAX_LINE_BYTES:
            self.overflow = self._count_overflow(0, len(self.carry) - MAX_LINE_BYTES)
            self.carry = self.carry[:MAX_LINE_BYTES]
        yield from self._block(data[:end])

    def end(self) -> Iterator[tuple[int, str]]:
        """The unfinished last line, then the last line with text if it was not yielded."""
        if self.carry:
            yield from self._block(self.carry)
            self.carry = b""
        if self.last_text and self.last_text[0] > self.emitted:
            self.emitted = self.last_text[0]
            yield self.last_text[0], _decode(self.last_text[1])

    def pending(self) -> list[tuple[int, str]]:
        """What :meth:`end` would yield now, without ending: the last line with text when it
        was screened out, and the unfinished line being written."""
        shown = []
        if self.last_text and self.last_text[0] > self.emitted:
            shown.append((self.last_text[0], _decode(self.last_text[1])))
        if self.carry.strip():
            shown.append((self.first_number, _decode(self.carry)))
        return shown

    def _read(self) -> bytes:
        if self.stream is None:
            return b""
        try:
            return self.stream.read(CHUNK_BYTES)
        except OSError as e:
            raise LogError(
                f"cannot read the log: {e.strerror or e}", remedy="check the path"
            ) from None

    def _count_overflow(self, overflow: int, more: int) -> int:
        overflow += more
        if overflow > MAX_RUN_WITHOUT_NEWLINE:
            raise LogError(
                f"line {self.first_number} runs over {MAX_RUN_WITHOUT_NEWLINE >> 20} MiB without"
                " a line break: this is not a text log",
                remedy="give the vLLM server's log file (text, one message a line)",
            )
        return overflow

    def _block(self, new: bytes) -> Iterator[tuple[int, str]]:
        """The interesting lines of ``new`` (complete lines, the final newline removed).

        The block's last lines are read again with the next block, so a line of interest's
        context is the same wherever the pieces were cut (a follower's looks, a stream's
        chunks): a line of interest at the end gets its lines after from the next block, one
        at the start its lines before from this one (they were yielded once only).
        """
        self._remember_last_text(new)
        block = self.before + b"\n" + new if self.before_count else new
        starts = self._interesting_starts(block)
        number = self.first_number - self.before_count
        counted = 0
        windows: list[tuple[int, int, int]] = []  # first line number, start and end offsets
        for start in starts:
            number += block.count(b"\n", counted, start)
            counted = start
            first, first_at = _lines_back(block, start, number, CONTEXT_BEFORE)
            last_end = _lines_forward(block, start, CONTEXT_AFTER)
            if windows and first_at <= windows[-1][2] + 1:
                windows[-1] = (windows[-1][0], windows[-1][1], last_end)
            else:
                windows.append((first, first_at, last_end))
        for first, first_at, last_end in windows:
            for offset, piece in enumerate(block[first_at:last_end].split(b"\n")):
                if first + offset > self.emitted:
                    self.emitted = first + offset
                    yield self.emitted, _decode(piece[:MAX_LINE_BYTES])
        self.first_number += new.count(b"\n") + 1
        self._keep_last_lines(block)

    def _keep_last_lines(self, block: bytes) -> None:
        count = max(CONTEXT_BEFORE, CONTEXT_AFTER)
        start = len(block)
        for _ in range(count):
            start = block.rfind(b"\n", 0, start)
            if start < 0:
                break
        kept = block[start + 1 :]
        self.before = b"\n".join(line[:MAX_LINE_BYTES] for line in kept.split(b"\n"))
        self.before_count = self.before.count(b"\n") + 1

    def _interesting_starts(self, block: bytes) -> list[int]:
        starts = [] if ROUTINE_LINE.match(block) else [0]
        position = 0
        while True:
            found = INTERESTING_LINE_START.search(block, position)
            if found is None:
                return starts
            starts.append(found.start() + 1)
            position = block.find(b"\n", found.start() + 1)
            if position < 0:
                return starts

    def _remember_last_text(self, block: bytes) -> None:
        stripped = block.rstrip()
        if not stripped:
            return
        start = stripped.rfind(b"\n") + 1
        number = self.first_number + stripped.count(b"\n")
        self.last_text = (number, stripped[start : start + MAX_LINE_BYTES])


def _lines_back(block: bytes, start: int, number: int, count: int) -> tuple[int, int]:
    """The number and offset of the line ``count`` lines above the one at ``start``."""
    for _ in range(count):
        if start == 0:
            break
        start = block.rfind(b"\n", 0, start - 1) + 1
        number -= 1
    return number, start


def _lines_forward(block: bytes, start: int, count: int) -> int:
    """The end offset of the line ``count`` lines below the one at ``start``."""
    end = block.find(b"\n", start)
    for _ in range(count):
        if end < 0:
            break
        end = block.find(b"\n", end + 1)
    return len(block) if end < 0 else end


def _decode(raw: bytes) -> str:
    return raw.decode("utf-8", "replace")
