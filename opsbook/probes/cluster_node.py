"""Probe: whether a node's addresses, interfaces and ports are fit for a Ray cluster.

Args: ``{"host_ip": str | None, "interfaces": {"VAR": "value"}, "ports": [[address, port]]}``.
Answers ``{"host_ip_error": str | None, "interfaces": [names], "bad_interfaces": {"VAR":
"value"}, "taken_ports": [[address, port, error]]}``: ``host_ip_error`` is set when no socket
can be bound to ``host_ip`` (the address is not on this node); an interface variable is bad
when none of its names (NCCL and Gloo take prefixes, ``^`` excludes) is an interface here.
Standard library only.
"""

from __future__ import annotations

import os
import socket


def _bind_error(address, port):
    probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        probe.bind((address, port))
    except OSError as e:
        return e.strerror or str(e)
    finally:
        probe.close()
    return None


def _bad(value, names):
    value = str(value).lstrip("=")
    if not value or value.startswith("^"):
        return False
    wanted = [v.strip() for v in value.split(",") if v.strip()]
    return not any(any(n.startswith(w) for n in names) for w in wanted)


def main(args):
    try:
        names = sorted(os.listdir("/sys/class/net"))
    except OSError:
        names = [name for _, name in socket.if_nameindex()]
    host_ip = args.get("host_ip")
    host_ip_error = _bind_error(host_ip, 0) if host_ip else None
    bad = {k: v for k, v in (args.get("interfaces") or {}).items() if v and _bad(v, names)}
    taken = []
    for address, port in args.get("ports") or []:
        error = _bind_error(address, int(port))
        if error:
            taken.append([address, int(port), error])
    return {
        "host_ip_error": host_ip_error,
        "interfaces": names,
        "bad_interfaces": bad,
        "taken_ports": taken,
    }
