"""Read a log of any size as a stream and keep only the lines worth diagnosing.

A long-running vLLM server writes mostly routine ``INFO`` lines (request logs, throughput
metrics); a diagnosis needs the few others: errors, warnings, tracebacks, unprefixed output of
other libraries (NCCL, Ray, the kernel), and the ``INFO`` lines that mark the startup phases.
One combined regular expression tells the routine ``INFO`` lines; its answer is kept per line
text with the digits masked, so a chunk is screened in a few passes in C (mask, split, look
up), and only the remaining lines (and two lines of context each side, for terminal-wrapped
pieces and traceback frames) reach Python code, a list per chunk. Memory stays bounded: the
file is read in chunks and a line longer than :data:`MAX_LINE_BYTES` is cut.

Line numbers are those of ``grep -n``: only ``\\n`` ends a line (a ``\\r`` of a progress bar
does not).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from itertools import repeat
from operator import not_
from typing import BinaryIO, cast

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
# ASCII digits as one digit: what the screen's answer for a line is kept under.
_DIGITS_MASKED = bytes.maketrans(b"0123456789", b"0" * 10)
# Bounds on the kept answers (a log of ever-new texts clears them now and then).
ROUTINE_MEMO_LINES = 4096
ROUTINE_MEMO_KEY_BYTES = 512
# A block whose first PROBE_BYTES hold more than one new text in MOSTLY_NEW is screened by
# the pattern on every line.
PROBE_BYTES = 1 << 16
MOSTLY_NEW = 8
_ROUTINE_MEMO: dict[bytes, bool] = {}
_RUN_OF_INTEREST = re.compile(b"\x01+")


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
    for batch in screened_batches(stream):
        yield from batch


def screened_batches(stream: BinaryIO) -> Iterator[list[tuple[int, str]]]:
    """The lines of :func:`screened_lines`, a list per chunk read (for readers that take
    them in bulk)."""
    yield from _Reader(stream).batches()


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
        return self._reader.feed(data)

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

    def batches(self) -> Iterator[list[tuple[int, str]]]:
        while True:
            chunk = self._read()
            if not chunk:
                break
            yield self.feed(chunk)
        yield self.end()

    def feed(self, chunk: bytes) -> list[tuple[int, str]]:
        """The lines of interest that ``chunk`` completes."""
        if self.overflow:
            cut = chunk.find(b"\n")
            if cut < 0:
                self.overflow = self._count_overflow(self.overflow, len(chunk))
                return []
            chunk, self.overflow = chunk[cut:], 0
        end = chunk.rfind(b"\n")
        if end < 0:
            data = self.carry + chunk
            self.carry = data[:MAX_LINE_BYTES]
            if len(data) > MAX_LINE_BYTES:
                self.overflow = self._count_overflow(0, len(data) - MAX_LINE_BYTES)
            return []
        # The finished lines are copied once, into the block (a chunk is a megabyte).
        finished, self.carry = self.carry, chunk[end + 1 :]
        if len(self.carry) > MAX_LINE_BYTES:
            self.overflow = self._count_overflow(0, len(self.carry) - MAX_LINE_BYTES)
            self.carry = self.carry[:MAX_LINE_BYTES]
        return self._block(finished, memoryview(chunk)[:end])

    def end(self) -> list[tuple[int, str]]:
        """The unfinished last line, then the last line with text if it was not yielded."""
        shown = []
        if self.carry:
            shown = self._block(self.carry)
            self.carry = b""
        if self.last_text and self.last_text[0] > self.emitted:
            self.emitted = self.last_text[0]
            shown.append((self.last_text[0], _decode(self.last_text[1])))
        return shown

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

    def _block(self, *new: bytes | memoryview) -> list[tuple[int, str]]:
        """The interesting lines of ``new``'s pieces joined (complete lines, the final newline
        removed).

        The block's last lines are read again with the next block, so a line of interest's
        context is the same wherever the pieces were cut (a follower's looks, a stream's
        chunks): a line of interest at the end gets its lines after from the next block, one
        at the start its lines before from this one (they were yielded once only).
        """
        block = b"".join((self.before, b"\n", *new) if self.before_count else new)
        number = self.first_number - self.before_count  # the block's first line
        lines = block.split(b"\n")
        self._remember_last_text(lines, self.before_count)
        shown: list[tuple[int, str]] = []
        for first, end in _windows(_interesting(block, lines), len(lines)):
            first = max(first, self.emitted - number + 1)
            if first >= end:
                continue
            numbers = range(number + first, number + end)
            shown += zip(numbers, _decoded(lines[first:end]), strict=True)
            self.emitted = number + end - 1
        self.first_number += len(lines) - self.before_count
        self._keep_last_lines(block)
        return shown

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

    def _remember_last_text(self, lines: list[bytes], new_from: int) -> None:
        """The last line with text among ``lines[new_from:]`` (the new block's lines)."""
        for index in range(len(lines) - 1, new_from - 1, -1):
            text = lines[index].rstrip()
            if text:
                self.last_text = (self.first_number + index - new_from, text[:MAX_LINE_BYTES])
                return


def _interesting(block: bytes, lines: list[bytes]) -> bytes:
    """One byte per line of ``block`` (``lines``): 1 for a line of interest, 0 for a routine
    one.

    Whether a line is routine does not depend on which digits it holds (the screen's pattern
    names none, only digits as a class), so the answer is kept per line with its digits
    masked: the routine lines of a long log, and a crash loop's repeated startups, are few
    texts once masked, and most lines cost a dictionary lookup instead of the pattern. A
    block that begins with texts not seen before (request IDs, say) gets the pattern on
    every line instead, in C.
    """
    if _mostly_new(block):
        return bytes(map(not_, map(ROUTINE_LINE.match, lines)))
    masked = block.translate(_DIGITS_MASKED).split(b"\n")
    known = list(map(_ROUTINE_MEMO.get, masked))
    misses = known.count(None)
    if misses and len(_ROUTINE_MEMO) > ROUTINE_MEMO_LINES:
        _ROUTINE_MEMO.clear()
    at = -1
    for _ in range(misses):
        at = known.index(None, at + 1)
        known[at] = _screen(masked[at])
    return bytes(cast("list[bool]", known))


def _mostly_new(block: bytes) -> bool:
    """Whether the first lines of ``block`` are mostly texts not kept yet; they are then."""
    probe = block[:PROBE_BYTES].translate(_DIGITS_MASKED).split(b"\n")
    if len(block) > PROBE_BYTES:
        probe.pop()  # cut short
    misses = list(map(_ROUTINE_MEMO.get, probe)).count(None)
    if misses <= len(probe) // MOSTLY_NEW:
        return False
    if len(_ROUTINE_MEMO) > ROUTINE_MEMO_LINES:
        _ROUTINE_MEMO.clear()
    answers = map(not_, map(ROUTINE_LINE.match, probe))
    _ROUTINE_MEMO.update(zip(probe, answers, strict=True))
    return True


def _screen(masked: bytes) -> bool:
    """Whether the line (digits masked) is of interest, kept for the next such line."""
    interesting = ROUTINE_LINE.match(masked) is None
    if len(masked) <= ROUTINE_MEMO_KEY_BYTES:
        _ROUTINE_MEMO[masked] = interesting
    return interesting


def _windows(interesting: bytes, count: int) -> Iterator[tuple[int, int]]:
    """The ranges ``[first, end)`` of line indexes to show: each run of lines of interest
    with its context, ranges that touch joined."""
    window: tuple[int, int] | None = None
    for run in _RUN_OF_INTEREST.finditer(interesting):
        first = max(run.start() - CONTEXT_BEFORE, 0)
        end = min(run.end() + CONTEXT_AFTER, count)
        if window is not None and first <= window[1]:
            window = (window[0], end)
            continue
        if window is not None:
            yield window
        window = (first, end)
    if window is not None:
        yield window


def _decoded(raws: list[bytes]) -> list[str]:
    if max(map(len, raws), default=0) > MAX_LINE_BYTES:
        raws = [raw[:MAX_LINE_BYTES] for raw in raws]
    return list(map(bytes.decode, raws, repeat("utf-8"), repeat("replace")))


def _decode(raw: bytes) -> str:
    return raw.decode("utf-8", "replace")
