"""Probe: whether a node's addresses, interfaces and ports are fit for a Ray cluster.

Args: ``{"host_ip": str | None, "interfaces": {"VAR": "value"}, "ports": [[address, port]],
"reach": [[address, port]], "python": str | None}``.
Answers ``{"host_ip_error": str | None, "interfaces": [names], "bad_interfaces": {"VAR":
"value"}, "taken_ports": [[address, port, error]], "unreached": [[address, port, error,
refused]], "libraries": {"torch": str | None, "nccl": str | None, "error": str | None}}``:

- ``host_ip_error`` is set when no socket can be bound to ``host_ip`` (the address is not on
  this node); an interface variable is bad when none of its names (NCCL and Gloo take
  prefixes, ``^`` excludes) is an interface here.
- ``unreached``: the ``reach`` addresses a TCP connection from this node did not reach, with
  the error and whether it was refused (something answered: a closed port or a rejecting
  firewall) rather than lost (a timeout, no route).
- ``libraries``: torch and NCCL of the ``python`` interpreter, read from the installed
  distributions' metadata without importing torch. Real torch wheels do not carry their
  NCCL version in ``torch/version.py`` (the torch 2.14.1 cu130 wheel's holds ``__version__``,
  ``cuda``, ``git_version``, ``hip``, ``rocm``, ``xpu``); they require it as a package
  (its METADATA: ``Requires-Dist: nvidia-nccl-cu13==2.30.7``), so NCCL is the version of the
  installed ``nvidia-nccl-cu*`` distribution. torch's version is its ``torch/version.py``
  ``__version__`` (it keeps the CUDA tag, ``2.14.1+cu130``, that the PyPI METADATA drops),
  else its distribution's.

Standard library only.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading

CONNECT_TIMEOUT = 3.0
PYTHON_TIMEOUT = 30.0

# Run by the deployment's interpreter: nothing is imported but the standard library.
LIBRARIES_SCRIPT = r"""
import json, os, re
out = {"torch": None, "nccl": None}
try:
    import importlib.metadata as m
except ImportError:
    m = None
if m is not None:
    try:
        out["torch"] = m.version("torch")
    except Exception:
        pass
    found = set()
    for dist in m.distributions():
        name = re.sub(r"[-_.]+", "-", (dist.metadata["Name"] or "").lower())
        if re.fullmatch(r"nvidia-nccl-cu[0-9]+", name):
            found.add("%s (%s)" % (dist.version, name))
    out["nccl"] = ", ".join(sorted(found)) or None
try:
    import importlib.util as u
    spec = u.find_spec("torch")
    if spec is not None and spec.origin:
        with open(os.path.join(os.path.dirname(spec.origin), "version.py")) as f:
            hit = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", f.read(), re.M)
        if hit:
            out["torch"] = hit.group(1)
except Exception:
    pass
print(json.dumps(out))
"""


def _bind_error(address, port):
    probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    # As Ray's GCS (gRPC) binds: connections of an earlier cluster left in TIME_WAIT do not
    # make the port taken; a socket listening there still does.
    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
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


def _connect_error(address, port, timeout):
    """None when a TCP connection to ``address:port`` opens, else ``[error, refused]``."""
    try:
        with socket.create_connection((address, int(port)), timeout=timeout):
            return None
    except ConnectionRefusedError as e:
        return [e.strerror or str(e), True]
    except socket.timeout:  # noqa: UP041 (before Python 3.10 it is not TimeoutError)
        return [f"timed out after {timeout:g}s", False]
    except OSError as e:
        return [e.strerror or str(e), False]


def _unreached(targets, timeout):
    """Every target tried at once: a node behind a firewall costs one timeout, not one each."""
    errors = [None] * len(targets)

    def attempt(i, address, port):
        errors[i] = _connect_error(address, port, timeout)

    threads = [
        threading.Thread(target=attempt, args=(i, a, p), daemon=True)
        for i, (a, p) in enumerate(targets)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout + 5)
    unreached = []
    for i, (address, port) in enumerate(targets):
        if errors[i]:
            unreached.append([address, int(port), *errors[i]])
    return unreached


def _libraries(python):
    """torch and NCCL of ``python``, or the error that kept them from being read."""
    found = {"torch": None, "nccl": None, "error": None}
    if not python:
        return found
    try:
        proc = subprocess.run(
            [os.path.expanduser(python), "-c", LIBRARIES_SCRIPT],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=PYTHON_TIMEOUT,
        )
        found.update(json.loads(proc.stdout.strip().splitlines()[-1]))
    except (OSError, subprocess.SubprocessError, ValueError, IndexError) as e:
        found["error"] = f"{python} could not be asked: {e}"
    return found


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
    timeout = float(args.get("connect_timeout") or CONNECT_TIMEOUT)
    return {
        "unreached": _unreached(args.get("reach") or [], timeout),
        "libraries": _libraries(args.get("python")),
        "host_ip_error": host_ip_error,
        "interfaces": names,
        "bad_interfaces": bad,
        "taken_ports": taken,
    }
