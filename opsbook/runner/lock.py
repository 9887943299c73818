"""A per-host deploy lock: one ``opsbook run deploy`` at a time on a host.

Two deploys at once on one host kill each other's server (each stops "its" server before
starting its own). The lock is a file on the host, next to the deployment's state
(``<state_dir>/deploy.lock``), created with bash's ``noclobber`` (``O_EXCL``), so two machines
deploying the same host see each other. It holds who took it: the local user, machine, process
id and its start time, the run folder, and since when.

A lock whose holder ran on this machine and whose process is gone (killed, machine rebooted)
is stale: it is taken over, and the taking run notes it. A lock held from another machine
cannot be checked from here; it is reported with the command that removes it.

Every check-and-take on a host runs under ``flock`` on a guard file, so two runs that find the
same stale lock cannot both take it.

The lock is written whole to a temporary file and linked into place (``ln`` fails when the lock
exists), so a write that fails (a full disk) leaves no empty lock behind. A lock that cannot be
written stops the run with the reason ("disk full on host X: <path>"). An empty or unreadable
lock (as an older opsbook left on a full disk) holds no holder to ask: it is named and taken
over, with a note.
"""

from __future__ import annotations

import getpass
import json
import os
import posixpath
import shlex
import socket
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from opsbook.core.deployment import Deployment
from opsbook.core.exceptions import HostError, HostLocked
from opsbook.remote.hosts import HostGroup
from opsbook.remote.journal import Journal
from opsbook.remote.protocol import RemoteHost

LOCK_NAME = "deploy.lock"
# Seconds a run waits for another run's check-and-take on the same host (milliseconds of work).
GUARD_WAIT = 10

# First line: "acquired"; "held" and the lock's text ("held-unreadable" and the error when it
# cannot be read); or "unwritable" and the error of the write that failed. Under flock on a
# guard file. The holder's line is written to a temporary file first and linked into place, so
# a failed write never leaves a lock behind. TAKEOVER=1 removes the lock if its text is still
# STALE (the one the caller judged stale, empty or unreadable).
_TAKE = """
set -o pipefail
unwritable() {{ printf 'unwritable\\n%s\\n' "$1"; exit 0; }}
# A NUL byte would vanish in $(...): shown as "?".
lock_text() {{ head -c 4096 -- "$LOCK" | tr '\\000' '?'; }}
dir=$(dirname -- "$LOCK")
err=$(mkdir -p -- "$dir" 2>&1) || unwritable "$err"
err=$( {{ : >> "$LOCK.guard"; }} 2>&1) || unwritable "$err"
exec 9>>"$LOCK.guard" || exit 3
flock -w {wait} 9 || {{ echo "guard busy"; exit 3; }}
if [ "$TAKEOVER" = 1 ] && [ "$(lock_text 2>/dev/null)" = "$STALE" ]; then
    rm -f -- "$LOCK"
fi
new="$LOCK.$$.new"
if ! err=$( {{ printf '%s\\n' "$INFO" > "$new"; }} 2>&1); then
    rm -f -- "$new"
    unwritable "$err"
fi
if err=$(ln -- "$new" "$LOCK" 2>&1); then
    rm -f -- "$new"
    echo acquired
elif [ -e "$LOCK" ] || [ -L "$LOCK" ]; then
    rm -f -- "$new"
    if text=$(lock_text 2>&1); then
        echo held
        printf '%s\\n' "$text"
    else
        echo held-unreadable
        printf '%s\\n' "$text"
    fi
else
    rm -f -- "$new"
    unwritable "$err"
fi
"""

# Removes the lock only if it is still ours.
_RELEASE = """
exec 9>>"$LOCK.guard" || exit 3
flock -w {wait} 9 || exit 3
if [ "$(cat -- "$LOCK" 2>/dev/null)" = "$INFO" ]; then rm -f -- "$LOCK"; fi
"""


@dataclass(frozen=True)
class Holder:
    """Who holds a host's deploy lock."""

    user: str
    machine: str
    pid: int
    pid_start: str
    run: str
    since: str

    def describe(self) -> str:
        return (
            f"{self.user} on {self.machine} (PID {self.pid}), run folder {self.run}, "
            f"since {self.since}"
        )

    def line(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def parse(cls, text: str) -> Holder | None:
        """The holder in a lock file's text, or None if it is not one opsbook wrote."""
        try:
            doc = json.loads(text.strip().splitlines()[0])
            return cls(
                user=str(doc["user"]),
                machine=str(doc["machine"]),
                pid=int(doc["pid"]),
                pid_start=str(doc["pid_start"]),
                run=str(doc["run"]),
                since=str(doc["since"]),
            )
        except (ValueError, KeyError, IndexError, TypeError):
            return None

    def is_stale(self, machine: str | None = None) -> bool:
        """True when the holder ran on this machine and its process is gone (or the PID now
        belongs to another process); a holder elsewhere cannot be checked and is not stale."""
        if self.machine != (machine or socket.gethostname()):
            return False
        return process_start(self.pid) != self.pid_start


def process_start(pid: int) -> str:
    """A process's start time (clock ticks since boot, from /proc), or "" if it is gone; with
    the PID it names one process even after the PID is reused."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    fields = text[text.rfind(")") + 2 :].split()
    # Field 22 of stat is the start time; the fields after the command start at field 3.
    return fields[19] if len(fields) > 19 and fields[0] not in ("Z", "X") else ""


def me(run_folder: Path) -> Holder:
    """The holder this process would write."""
    return Holder(
        user=getpass.getuser(),
        machine=socket.gethostname(),
        pid=os.getpid(),
        pid_start=process_start(os.getpid()),
        run=str(run_folder),
        since=datetime.now(timezone.utc).isoformat(timespec="seconds"),
    )


def lock_path(deployment: Deployment, host: str) -> str:
    """Where the host's lock lives: next to the deployment's state on that host."""
    spec = next(h for h in deployment.hosts if h.name == host)
    return posixpath.join(deployment.for_host(spec).state_dir, LOCK_NAME)


@dataclass
class Locks:
    """The deploy locks a run holds; ``notes`` says which stale ones it took over."""

    held: list[tuple[RemoteHost, str]] = field(default_factory=list)
    holder: Holder | None = None
    notes: list[str] = field(default_factory=list)

    def release(self) -> None:
        """Give back every lock still ours; a host that cannot be reached keeps it (stale
        once this process is gone, and taken over by the next run)."""
        for host, path in self.held:
            try:
                host.run(
                    _RELEASE.format(wait=GUARD_WAIT),
                    env={"LOCK": path, "INFO": self.holder.line() if self.holder else ""},
                    label=f"release deploy lock {path}",
                )
            except HostError:
                pass
            finally:
                host.close()
        self.held.clear()


def acquire(
    deployment: Deployment,
    run_folder: Path,
    names: Sequence[str] = (),
    journal: Journal | None = None,
) -> Locks:
    """Take the deploy lock on every host of the deployment (those named, if given), its
    commands recorded in ``journal`` (the run's) when given. The hosts of the locks taken stay
    connected until :meth:`Locks.release` (a deploy asks them whether they are settled).

    A host that cannot be reached is left to the stages, which report it. If any host is held
    by another run, or its lock cannot be written (disk full, read-only), the locks taken are
    given back and nothing else is done.

    Raises:
        HostLocked: a host is held by another live run (the message says who, since when), or
            its lock cannot be written (the message says why, on which host and path).
    """
    group = HostGroup.from_deployment(deployment, names=names, journal=journal)
    mine = me(run_folder)
    answers = group.map(lambda host: _take(host, lock_path(deployment, host.name), mine))
    locks = Locks(holder=mine)
    refused: list[str] = []
    unwritable: list[str] = []
    for host in group.hosts:
        answer = answers[host.name]
        if isinstance(answer, Exception):
            # The stages report an unreachable host; the run notes that it ran unlocked.
            locks.notes.append(f"{host.name}: could not take the deploy lock: {answer}")
            host.close()
            continue
        if answer.taken:
            locks.held.append((host, lock_path(deployment, host.name)))
            if answer.note:
                locks.notes.append(answer.note)
            continue
        (unwritable if answer.unwritable else refused).append(answer.note)
        host.close()
    if refused or unwritable:
        locks.release()
        raise _refusal(refused, unwritable)
    return locks


def _refusal(refused: list[str], unwritable: list[str]) -> HostLocked:
    if not refused:
        return HostLocked(
            "cannot take the deploy lock: " + "; ".join(unwritable),
            remedy="free space on (or make writable) the folder shown, which is paths.state "
            "of the deployment, or point paths.state at a writable folder; nothing was done",
        )
    message = "another deploy holds the host: " + "; ".join(refused)
    if unwritable:
        message += "; and cannot take the deploy lock: " + "; ".join(unwritable)
    return HostLocked(
        message,
        remedy="wait for that run to finish (see its run folder); if it is dead and ran "
        "on another machine, remove the lock file shown on the host",
    )


@dataclass(frozen=True)
class Taken:
    """One host's answer: taken or not, and the note (the holder taken over or refused by, or
    why the lock cannot be written)."""

    taken: bool
    note: str = ""
    unwritable: bool = False


@dataclass(frozen=True)
class _Seen:
    """What one take found: its state ("acquired", "held", "held-unreadable", "unwritable")
    and the text after it (the lock's text, or an error)."""

    state: str
    text: str

    @property
    def holder(self) -> Holder | None:
        return Holder.parse(self.text) if self.state == "held" else None


def _take(host: RemoteHost, path: str, mine: Holder) -> Taken:
    seen = _try(host, path, mine)
    if seen.state == "acquired":
        return Taken(True)
    if seen.state == "unwritable":
        return Taken(False, _unwritable_note(host.name, path, seen.text), unwritable=True)
    holder = seen.holder
    takeover = _takeover_reason(seen, holder)
    if takeover is not None:
        # What the stale lock holds ("" if it cannot be read): removed only if unchanged.
        stale = seen.text if seen.state == "held" else ""
        again = _try(host, path, mine, stale=stale)
        if again.state == "acquired":
            return Taken(True, f"{host.name}: took over {takeover}")
        if again.state == "unwritable":
            return Taken(False, _unwritable_note(host.name, path, again.text), unwritable=True)
        seen, holder = again, again.holder
    who = holder.describe() if holder else f"unknown holder ({seen.text.strip()[:200]!r})"
    return Taken(
        False, f"{host.name} is locked by {who} (lock file {shlex.quote(path)} on the host)"
    )


def _takeover_reason(seen: _Seen, holder: Holder | None) -> str | None:
    """Why a lock may be taken over (None: it may not): its holder's process is gone, or it
    holds no holder at all (empty, unreadable: nothing to ask, no live run writes one)."""
    if holder is not None:
        if holder.is_stale():
            return f"a stale deploy lock of {holder.describe()} (its process is gone)"
        return None
    if seen.state == "held-unreadable":
        return f"an unreadable deploy lock ({seen.text.strip()[:200]})"
    if not seen.text.strip():
        return "an empty deploy lock (left by a write that failed, as on a full disk)"
    return f"a deploy lock that names no holder ({seen.text.strip()[:200]!r})"


# The reasons a write fails, as the operator says them.
_WRITE_ERRORS = (
    ("No space left on device", "disk full"),
    ("Disk quota exceeded", "disk quota exceeded"),
    ("Read-only file system", "read-only file system"),
    ("Permission denied", "permission denied"),
    ("Not a directory", "not a directory"),
    ("File exists", "not a directory"),
)


def _unwritable_note(host: str, path: str, error: str) -> str:
    error = error.strip()
    reason = next((said for text, said in _WRITE_ERRORS if text in error), "cannot write")
    detail = f" ({error.splitlines()[-1][:300]})" if error else ""
    return f"{reason} on host {host}: {path}{detail}"


def _try(host: RemoteHost, path: str, mine: Holder, stale: str | None = None) -> _Seen:
    result = host.run(
        _TAKE.format(wait=GUARD_WAIT),
        env={
            "LOCK": path,
            "INFO": mine.line(),
            "TAKEOVER": "0" if stale is None else "1",
            "STALE": (stale or "").rstrip("\n"),
        },
        label=f"take deploy lock {path}",
        check=True,
    )
    first, _, rest = result.stdout.partition("\n")
    return _Seen(first.strip(), rest.rstrip("\n"))


__all__ = ["Holder", "Locks", "acquire", "lock_path", "process_start"]
