"""SIGINT and SIGTERM as an exception, so that a run can seal its record before it exits.

``opsbook run`` turns the first SIGINT (Ctrl-C) or SIGTERM into :class:`RunInterrupted`, raised
wherever the main thread is (waiting on the notebook's kernel, mostly); the runner catches it,
stops, writes ``run.json`` and the summary with the status "interrupted", and the command exits
128 + the signal number (130, 143), as a shell reports a process killed by it. Signals that
come while the record is being sealed are ignored: a second Ctrl-C must not lose the record.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Iterator

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class RunInterrupted(KeyboardInterrupt):
    """The run got SIGINT or SIGTERM. A KeyboardInterrupt, not only a BaseException: handlers
    of ``Exception`` (a notebook that failed, a host that failed) must not swallow it, and
    neither may asyncio, which logs and drops any other BaseException raised in a callback
    (``Handle._run`` re-raises only SystemExit and KeyboardInterrupt): a SIGTERM that landed in
    the notebook client's ZMQ poll callback left the deploy running."""

    def __init__(self, signum: int):
        self.signum = signum
        super().__init__(f"interrupted by {signal_name(signum)}")

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def signum_of(error: BaseException) -> int:
    """The signal behind an interruption: KeyboardInterrupt is Python's SIGINT."""
    return error.signum if isinstance(error, RunInterrupted) else int(signal.SIGINT)


def quiet_abandoned_tasks() -> None:
    """After an interruption, the notebook client's pending tasks end with "Kernel died" when
    its kernel is shut down mid-cell; asyncio would log each as an unretrieved exception with
    a traceback. The run has been sealed and says it was interrupted: those are expected."""
    logging.getLogger("asyncio").setLevel(logging.CRITICAL + 1)


@contextlib.contextmanager
def raising_on_signals() -> Iterator[None]:
    """Within the block, the first SIGINT or SIGTERM raises :class:`RunInterrupted`; later
    ones are ignored. Only the main thread can take signals; elsewhere this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    fired: list[int] = []

    def interrupt(signum: int, frame: object) -> None:
        if fired:
            return
        fired.append(signum)
        raise RunInterrupted(signum)

    previous = {s: signal.signal(s, interrupt) for s in SIGNALS}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


@contextlib.contextmanager
def sealing() -> Iterator[None]:
    """Within the block, SIGINT and SIGTERM are ignored: a run's record is being written, and
    a signal that came as the stage ended must not leave the folder without it (it was filed
    as "nothing was filed ... before the run began"). Only the main thread can take signals;
    elsewhere this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, signal.SIG_IGN) for s in SIGNALS}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


__all__ = [
    "RunInterrupted",
    "quiet_abandoned_tasks",
    "raising_on_signals",
    "sealing",
    "signal_name",
    "signum_of",
]
