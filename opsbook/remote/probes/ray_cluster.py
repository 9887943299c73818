"""Probe: the nodes of a Ray cluster, through Ray's own state API (``ray.nodes()``).

Run on the head with the deployment's python (the one whose ``ray`` started the node). First
it looks at what listens on the head's port (``/proc/net/tcp*``, then the process holding that
socket): with ``temp_dir`` given, a holder that is not this cluster's own GCS (its command line
names the head's temp folder) is named at once, its PID, command and user, rather than joined:
``ray.init`` against a plain listener retries for about two minutes, and against another user's
Ray it fails on that user's session files. Then it joins the cluster as a short-lived driver,
reads every node's address, liveness, GPUs and temp folder (the folder of its raylet's socket,
which tells opsbook's nodes apart whatever address Ray registered them under), and leaves.

Args: ``{"address": "HOST:PORT", "node_ip": str, "temp_dir": str | None}``.
Answers ``{"ray_version": str, "nodes": [{"address", "alive", "gpus", "temp_dir", "local"}]}``
(``local``: the address is a loopback one or one of this machine's), or ``{"error": str,
"holder": {"pid", "uid", "user", "cmd", "ray"} | None}`` when no cluster of opsbook's answers
there (``holder``: what holds the port instead; ``pid`` None when it is another user's and
not recognisable as a Ray GCS).
"""

from __future__ import annotations

import contextlib
import io
import os
import pwd
import socket

from .ray_folder import names_folder

LISTEN = "0A"
SESSION = "/session_"


def _listening_sockets(port):
    """(inode, uid) of the sockets listening on ``port``, from ``/proc/net/tcp`` and ``tcp6``;
    None when neither can be read (not Linux)."""
    found, read = [], False
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as handle:
                rows = handle.read().splitlines()[1:]
        except OSError:
            continue
        read = True
        for row in rows:
            fields = row.split()
            if len(fields) < 10 or fields[3] != LISTEN:
                continue
            if int(fields[1].rsplit(":", 1)[1], 16) == port:
                found.append((fields[9], int(fields[7])))
    return found if read else None


def _cmdline(pid):
    with open(f"/proc/{pid}/cmdline", "rb") as handle:
        return handle.read().replace(b"\0", b" ").decode(errors="replace").strip()


def _pids():
    return [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]


def _socket_owner(inodes):
    """The PID whose open files hold one of the socket ``inodes`` (readable: this user's)."""
    wanted = {f"socket:[{inode}]" for inode in inodes}
    for pid in _pids():
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                if os.readlink(f"/proc/{pid}/fd/{fd}") in wanted:
                    return pid
        except OSError:
            continue
    return None


def _ray_gcs_of(uid, port):
    """Another user's file descriptors are closed to this one, but command lines are not: a
    Ray GCS names its port (``--gcs_server_port=PORT``, ray 2.58.0 python/ray/_private/
    services.py start_gcs_server)."""
    for pid in _pids():
        try:
            if os.stat(f"/proc/{pid}").st_uid != uid:
                continue
            cmd = _cmdline(pid)
        except OSError:
            continue
        if "gcs_server" in cmd and f"--gcs_server_port={port}" in cmd.split():
            return pid, cmd
    return None, ""


def _user(uid):
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def port_holder(port):
    """What listens on ``port`` here: {"pid", "uid", "user", "cmd", "ray"}, None when nothing
    does, or "unknown" when the socket tables cannot be read."""
    sockets = _listening_sockets(port)
    if sockets is None:
        return "unknown"
    if not sockets:
        return None
    uid = sockets[0][1]
    pid = _socket_owner([inode for inode, _ in sockets])
    cmd = ""
    if pid is not None:
        with contextlib.suppress(OSError):
            cmd = _cmdline(pid)
    else:
        pid, cmd = _ray_gcs_of(uid, port)
    ray = "gcs_server" in cmd
    found = {"pid": pid, "uid": uid, "user": _user(uid), "cmd": cmd[:300], "ray": ray}
    if pid is None:
        found["candidates"] = _processes_of(uid)
    return found


# A user with more processes than this names no candidate: the list would guess, not tell.
CANDIDATES = 3


def _processes_of(uid):
    """Another user's socket is not tied to a PID without its file descriptors: that user's
    processes are the candidates, named by PID and command."""
    found = []
    for pid in _pids():
        try:
            if os.stat(f"/proc/{pid}").st_uid == uid:
                found.append(f"PID {pid}: {_cmdline(pid)[:80]}")
        except OSError:
            continue
    return found if len(found) <= CANDIDATES else []


def _holder_error(holder, port, temp_dir):
    """Why the port's holder is not this cluster's Ray head, or None when it is."""
    ours = holder["uid"] == os.getuid() and names_folder(holder["cmd"], temp_dir)
    if ours:
        return None
    what = "a Ray GCS" if holder["ray"] else "a process"
    if holder["pid"] is None:
        among = "; ".join(holder.get("candidates") or []) or "none visible"
        who = f"a process of user {holder['user']} (one of: {among})"
    else:
        who = f"{what} of user {holder['user']}, PID {holder['pid']} ({holder['cmd'][:120]})"
    return f"port {port} is held by {who}, not by this cluster's Ray head ({temp_dir})"


def _is_local(address):
    try:
        if address.startswith("127.") or address == "::1":
            return True
        probe = socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET)
        try:
            probe.bind((address, 0))
        finally:
            probe.close()
        return True
    except (OSError, ValueError):
        return False


def _temp_dir_of(node):
    """The ``--temp-dir`` of a node: its raylet socket lives in ``DIR/session_*/sockets``."""
    path = str(node.get("RayletSocketName") or "")
    return path[: path.find(SESSION)] if SESSION in path else ""


def main(args):
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    host, _, port = str(args["address"]).rpartition(":")
    temp_dir = args.get("temp_dir")
    if temp_dir:
        holder = port_holder(int(port))
        if holder is None:
            nothing = f"no Ray head answers at {args['address']}: nothing listens on port {port}"
            return {"error": nothing, "holder": None}
        if holder != "unknown":
            why = _holder_error(holder, int(port), temp_dir)
            if why:
                return {"error": why, "holder": holder}
    try:
        import ray
    except ImportError as e:
        return {"error": f"ray is not installed for this python: {e}"}
    try:
        socket.create_connection((host, int(port)), timeout=3).close()
    except OSError as e:
        # ray.init would retry for a minute against a head that is not there.
        return {"error": f"no Ray head answers at {args['address']}: {e.strerror or e}"}
    quiet = io.StringIO()
    try:
        with contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
            ray.init(
                address=args["address"],
                _node_ip_address=args.get("node_ip") or None,
                logging_level="ERROR",
                log_to_driver=False,
                configure_logging=False,
            )
            nodes = ray.nodes()
            ray.shutdown()
    except Exception as e:  # no cluster there, or it refused this driver
        return {"error": f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300]}"}
    return {
        "ray_version": ray.__version__,
        "nodes": [
            {
                "address": n.get("NodeManagerAddress"),
                "alive": bool(n.get("Alive")),
                "gpus": float((n.get("Resources") or {}).get("GPU", 0)),
                "temp_dir": _temp_dir_of(n),
                "local": _is_local(str(n.get("NodeManagerAddress") or "")),
            }
            for n in nodes
        ],
    }
