"""Probe: the Ray processes of one node that opsbook started, found by their temp folder.

``ray start --temp-dir=DIR`` puts DIR (or its session folder) on the command line of every
daemon it starts (gcs_server, raylet, the monitors, the agents); opsbook gives each node a
folder of its own, so the processes naming it, the members of their process groups and their
descendants (the Ray workers the raylet forks carry other titles and groups of their own) are
exactly that node's. With ``signal`` set, they are signalled by process group, then by PID;
nothing else is touched.

Args: ``{"temp_dir": str, "signal": "TERM" | "KILL" | None, "pgids": [int], "pids": [int]}``:
``pgids`` recorded at start, ``pids`` found by an earlier call of this stop (a worker whose
raylet already exited has lost its parent, not its PID).
Answers ``{"processes": [{"pid", "ppid", "pgid", "uid", "cmd"}], "pgids": [int],
"signalled": [int]}``. Standard library only.
"""

from __future__ import annotations

import os
import signal as signals

from .ray_folder import names_folder


def _processes():
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                cmd = handle.read().replace(b"\0", b" ").decode(errors="replace").strip()
            with open(f"/proc/{entry}/stat") as handle:
                stat = handle.read()
            uid = os.stat(f"/proc/{entry}").st_uid
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if not fields or fields[0] in ("Z", "X"):
            continue
        found.append(
            {
                "pid": int(entry),
                "ppid": int(fields[1]),
                "pgid": int(fields[2]),
                "uid": uid,
                "cmd": cmd[:300],
            }
        )
    return found


def _descendants(processes, roots):
    """The processes below ``roots``: the raylet's workers (``ray::IDLE``, actors) run in
    groups of their own and name no folder; once the raylet is gone they would be orphans."""
    children = {}
    for process in processes:
        children.setdefault(process["ppid"], []).append(process["pid"])
    found, todo = set(), list(roots)
    while todo:
        pid = todo.pop()
        for child in children.get(pid, []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _ours(processes, temp_dir, recorded, known=()):
    uid = os.getuid()
    # The folder itself, not a longer name that begins alike (node 127.0.0.1's and 127.0.0.10's).
    named = [p for p in processes if p["uid"] == uid and names_folder(p["cmd"], temp_dir)]
    pgids = sorted({p["pgid"] for p in named} | set(recorded))
    # A recorded group counts only while a process naming the folder is in it or it has members
    # of this user: a reused PGID of someone else's is never ours.
    members = [p for p in processes if p["uid"] == uid and p["pgid"] in pgids and p["pgid"] > 1]
    pids = {p["pid"] for p in named} | {p["pid"] for p in members}
    pids |= {p["pid"] for p in processes if p["uid"] == uid and p["pid"] in set(known)}
    pids |= _descendants([p for p in processes if p["uid"] == uid], pids)
    return [p for p in processes if p["pid"] in pids], [g for g in pgids if g > 1]


def main(args):
    temp_dir = str(args.get("temp_dir") or "")
    recorded = [int(g) for g in args.get("pgids") or []]
    known = [int(p) for p in args.get("pids") or []]
    processes, pgids = _ours(_processes(), temp_dir, recorded, known)
    signalled = []
    name = args.get("signal")
    if name and processes:
        number = signals.SIGKILL if name == "KILL" else signals.SIGTERM
        live_groups = {p["pgid"] for p in processes}
        for pgid in pgids:
            if pgid in live_groups:
                try:
                    os.killpg(pgid, number)
                    signalled.append(pgid)
                except OSError:
                    pass
        for process in processes:
            if process["pgid"] not in signalled:
                try:
                    os.kill(process["pid"], number)
                except OSError:
                    pass
    return {"processes": processes, "pgids": pgids, "signalled": signalled}
