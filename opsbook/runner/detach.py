"""``opsbook run ... --detach``: a run that outlives the terminal and the SSH session it was
started from (spark-vllm-docker issue 195: "when connection drops instance dies").

The run is the same ``opsbook run`` command started again as a child in a session of its own
(``setsid``): it has no controlling terminal, so the hangup of the terminal or of the SSH
session is not its signal, and it is in no process group a shell signals. Until its run folder
exists its output goes to a temporary file the starting command shows when the run ends that
early (a bad deployment file, a host another deploy holds); once the folder is made and the
hosts are locked, the run points its output at ``console.log`` in the folder (0600, like the
rest of it), writes ``detached.json`` (its PID and start time), and names the folder to the
starting command over a pipe, which then ends. ``opsbook records show RUN --follow`` follows it.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

# The option by which the starting command gives the run the pipe to name its folder on; the
# run's own argument list, never typed by a user.
REPORT_OPTION = "--detached-report"
CONSOLE_LOG = "console.log"
DETACHED_FILE = "detached.json"
# The run folder's files are the operator's alone (see records.FOLDER_MODE).
PRIVATE_FILE_MODE = 0o600


@dataclass(frozen=True)
class Detached:
    """A detached run as its starting command saw it: its PID, and its run folder; or, when it
    ended before making one, its exit code. ``said`` is what it printed before either."""

    pid: int
    folder: Path | None
    exit_code: int | None
    said: str


def start_detached(run_argv: Sequence[str]) -> Detached:
    """Start ``opsbook run RUN_ARGV`` in a session of its own and wait until it has made its run
    folder and locked its hosts, or has ended before that.

    Args:
        run_argv: the arguments of ``opsbook`` for the run (``run``, the notebook, options),
            without ``--detach``.
    """
    read_end, write_end = os.pipe()
    with tempfile.TemporaryFile() as early:
        try:
            child = subprocess.Popen(
                [sys.executable, "-m", "opsbook", *run_argv, REPORT_OPTION, str(write_end)],
                stdin=subprocess.DEVNULL,
                stdout=early,
                stderr=subprocess.STDOUT,
                pass_fds=(write_end,),
                start_new_session=True,
            )
        finally:
            os.close(write_end)
        with os.fdopen(read_end, "rb") as report:
            named = report.read().decode(errors="replace").strip()
        early.seek(0)
        said = early.read().decode(errors="replace")
    if named:
        return Detached(child.pid, Path(named), None, said)
    return Detached(child.pid, None, child.wait(), said)


def folder_reporter(report_fd: int) -> Callable[[Path], None]:
    """What the detached run calls once its folder is made and its hosts locked: output to
    ``console.log``, ``detached.json`` written, the folder named on ``report_fd``."""
    # Not for the kernel and helpers the run starts: the pipe must close when the run says so.
    os.set_inheritable(report_fd, False)

    def report(folder: Path) -> None:
        _output_to(folder / CONSOLE_LOG)
        _write_private(
            folder / DETACHED_FILE,
            json.dumps({"pid": os.getpid(), "started": start_ticks(os.getpid())}) + "\n",
        )
        with contextlib.suppress(OSError):  # the starting command was killed: nobody to tell
            os.write(report_fd, f"{folder}\n".encode())
        os.close(report_fd)

    return report


def _output_to(path: Path) -> None:
    """Point this process's standard output and error at ``path`` (made private)."""
    sys.stdout.flush()
    sys.stderr.flush()
    log = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, PRIVATE_FILE_MODE)
    try:
        os.dup2(log, sys.stdout.fileno())
        os.dup2(log, sys.stderr.fileno())
    finally:
        os.close(log)


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, PRIVATE_FILE_MODE)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def start_ticks(pid: int) -> int | None:
    """When a process started (clock ticks since boot, /proc/PID/stat field 22): with its PID it
    names the process even after the PID is reused. None when it is gone (or a zombie: ended,
    not yet reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    return None if fields[0] == "Z" else int(fields[19])


def detached_run_alive(folder: Path) -> bool | None:
    """Whether the detached run that writes ``folder`` still runs; None when the folder is not
    a detached run's (no ``detached.json``, or one that cannot be read)."""
    try:
        doc = json.loads((folder / DETACHED_FILE).read_text())
        pid, started = int(doc["pid"]), doc.get("started")
    except (OSError, ValueError, KeyError, TypeError):
        return None
    now = start_ticks(pid)
    return now is not None and (started is None or now == started)
