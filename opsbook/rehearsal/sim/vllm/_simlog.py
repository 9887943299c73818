"""Log lines in vLLM's format: ``(APIServer pid=N) INFO MM-DD HH:MM:SS [file.py:line] text``.

vLLM's logger writes to stdout; tqdm bars, uvicorn and uncaught tracebacks go to stderr.
Each line is written and flushed at once, so that lines of several processes sharing one log
file interleave whole, as they do under ``> vllm.log 2>&1``.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import IO

PACKAGE_DIR = Path(__file__).resolve().parent

Frame = tuple[str, int, str, str]


def stamp() -> str:
    return time.strftime("%m-%d %H:%M:%S")


class Log:
    """A writer for one simulated process's log lines.

    Args:
        label: the process label vLLM prints, e.g. ``APIServer`` or ``Worker_TP0``.
        pid: the process id printed in the prefix.
    """

    def __init__(self, label: str, pid: int | None = None):
        self.label = label
        self.pid = os.getpid() if pid is None else pid

    @property
    def prefix(self) -> str:
        return f"({self.label} pid={self.pid}) " if self.label else ""

    def line(self, text: str, stream: IO[str] | None = None) -> None:
        """Write raw text after the process prefix, one line per text line."""
        out = stream or sys.stdout
        for piece in text.split("\n"):
            _write(out, f"{self.prefix}{piece}\n")

    def _log(self, level: str, where: str, text: str) -> None:
        head = f"{self.prefix}{level} {stamp()} [{where}] "
        for piece in text.split("\n"):
            _write(sys.stdout, head + piece + "\n")

    def info(self, where: str, text: str) -> None:
        self._log("INFO", where, text)

    def warning(self, where: str, text: str) -> None:
        self._log("WARNING", where, text)

    def error(self, where: str, text: str) -> None:
        self._log("ERROR", where, text)

    def uvicorn(self, level: str, text: str) -> None:
        """A uvicorn line (``INFO:     Started server process [N]``), to stderr."""
        _write(sys.stderr, f"{self.prefix}{(level + ':').ljust(10)}{text}\n")

    def access(self, client: str, request_line: str, status: str) -> None:
        _write(sys.stdout, f'{self.prefix}INFO:     {client} - "{request_line}" {status}\n')

    def traceback(
        self, frames: list[Frame], exc_type: str, message: str, where: str | None = None
    ) -> None:
        """A Python traceback, raw (stderr) or through ``logger.exception`` (``where`` given)."""
        lines = ["Traceback (most recent call last):"]
        for path, number, function, code in frames:
            lines.append(f'  File "{path}", line {number}, in {function}')
            lines.append(f"    {code}")
        message_lines = message.split("\n")
        lines.append(f"{exc_type}: {message_lines[0]}")
        lines.extend(message_lines[1:])
        if where is None:
            for piece in lines:
                _write(sys.stderr, f"{self.prefix}{piece}\n")
        else:
            self.error(where, "\n".join(lines))


def source(relative: str) -> str:
    """The path of a vLLM source file as tracebacks would show it in this install."""
    return str(PACKAGE_DIR / relative)


def _write(stream: IO[str], text: str) -> None:
    try:
        stream.write(text)
        stream.flush()
    except (OSError, ValueError):
        pass
