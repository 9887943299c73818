"""The rehearsal host's processes, seen through /proc and stopped by PID: never by name."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

from opsbook.rehearsal.box_state import BoxPaths

STOP_TIMEOUT = 5.0


def is_alive(pid: int) -> bool:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return text[text.rfind(")") + 2 :][:1] not in ("Z", "X", "")


def is_our_sshd(pid: int, paths: BoxPaths) -> bool:
    """True if PID runs sshd with this folder's configuration (its title keeps the arguments)."""
    if pid <= 0 or not is_alive(pid):
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"sshd" in cmdline and str(paths.config).encode() in cmdline


def pids_of_uid(uid: int) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status_text = (entry / "status").read_text()
        except OSError:
            continue
        for line in status_text.splitlines():
            if line.startswith("Uid:") and int(line.split()[1]) == uid:
                pids.append(int(entry.name))
    return [pid for pid in pids if is_alive(pid)]


def environ(pid: int) -> bytes:
    try:
        return b"\0" + Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return b""


def ancestors(pid: int) -> set[int]:
    chain = set()
    while pid > 1 and pid not in chain:
        chain.add(pid)
        try:
            text = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            break
        pid = int(text[text.rfind(")") + 2 :].split()[1])
    return chain


def send_signal(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def terminate(pid: int) -> bool:
    """SIGTERM, wait, then SIGKILL; True when the process is gone."""
    send_signal(pid, signal.SIGTERM)
    if wait_gone([pid], STOP_TIMEOUT):
        return True
    send_signal(pid, signal.SIGKILL)
    return wait_gone([pid], STOP_TIMEOUT)


def wait_gone(pids: list[int], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(is_alive(p) for p in pids):
            return True
        time.sleep(0.05)
    return not any(is_alive(p) for p in pids)


def read_pid(pid_file: Path) -> int:
    try:
        return int(pid_file.read_text().strip() or 0)
    except (OSError, ValueError):
        return 0
