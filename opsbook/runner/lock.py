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
from opsbook.remote.protocol import RemoteHost

LOCK_NAME = "deploy.lock"
# Seconds a run waits for another run's check-and-take on the same host (milliseconds of work).
GUARD_WAIT = 10

# Prints "acquired", or "held" and the holder's line; under flock on a guard file.
_TAKE = """
dir=$(dirname -- "$LOCK")
mkdir -p -- "$dir" || exit 3
exec 9>>"$LOCK.guard" || exit 3
flock -w {wait} 9 || {{ echo "guard busy"; exit 3; }}
if [ -n "$STALE" ] && [ "$(cat -- "$LOCK" 2>/dev/null)" = "$STALE" ]; then
    rm -f -- "$LOCK"
fi
if ( set -o noclobber; printf '%s\\n' "$INFO" > "$LOCK" ) 2>/dev/null; then
    echo acquired
else
    echo held
    head -c 4096 -- "$LOCK"
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


def acquire(deployment: Deployment, run_folder: Path, names: Sequence[str] = ()) -> Locks:
    """Take the deploy lock on every host of the deployment (those named, if given).

    A host that cannot be reached is left to the stages, which report it. If any host is held
    by another run, the locks taken are given back and nothing else is done.

    Raises:
        HostLocked: a host is held by another live run; the message says who, since when.
    """
    group = HostGroup.from_deployment(deployment, names=names)
    mine = me(run_folder)
    answers = group.map(lambda host: _take(host, lock_path(deployment, host.name), mine))
    locks = Locks(holder=mine)
    refused: list[str] = []
    for host in group.hosts:
        answer = answers[host.name]
        if isinstance(answer, Exception):
            # The stages report an unreachable host; the run notes that it ran unlocked.
            locks.notes.append(f"{host.name}: could not take the deploy lock: {answer}")
            host.close()
            continue
        taken, note = answer
        if taken:
            locks.held.append((host, lock_path(deployment, host.name)))
            if note:
                locks.notes.append(note)
        else:
            refused.append(note)
            host.close()
    if refused:
        locks.release()
        raise HostLocked(
            "another deploy holds the host: " + "; ".join(refused),
            remedy="wait for that run to finish (see its run folder); if it is dead and ran "
            "on another machine, remove the lock file shown on the host",
        )
    return locks


def _take(host: RemoteHost, path: str, mine: Holder) -> tuple[bool, str]:
    """(taken, note): the note names the stale holder taken over, or the live holder."""
    taken, holder, raw = _try(host, path, mine, stale="")
    if taken:
        return True, ""
    if holder is not None and holder.is_stale():
        taken, current, raw = _try(host, path, mine, stale=raw)
        if taken:
            return True, (
                f"{host.name}: took over a stale deploy lock of {holder.describe()} "
                "(its process is gone)"
            )
        holder = current
    who = holder.describe() if holder else f"unknown holder ({raw.strip()[:200]!r})"
    return False, f"{host.name} is locked by {who} (lock file {shlex.quote(path)} on the host)"


def _try(host: RemoteHost, path: str, mine: Holder, stale: str) -> tuple[bool, Holder | None, str]:
    result = host.run(
        _TAKE.format(wait=GUARD_WAIT),
        env={"LOCK": path, "INFO": mine.line(), "STALE": stale.rstrip("\n")},
        label=f"take deploy lock {path}",
        check=True,
    )
    first, _, rest = result.stdout.partition("\n")
    if first.strip() == "acquired":
        return True, None, ""
    return False, Holder.parse(rest), rest.rstrip("\n")


__all__ = ["Holder", "Locks", "acquire", "lock_path", "process_start"]
