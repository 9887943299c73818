"""Ports for rehearsal hosts: free at every address, each handed out once per process."""

from __future__ import annotations

import socket
import threading

from opsbook.core.exceptions import SandboxError
from opsbook.rehearsal.box_state import BoxState

# Ports are chosen free at every address (see free_port); the ones handed out stay reserved
# for this process.
ANY_ADDRESS = "0.0.0.0"
PORT_TRIES = 1000
_HANDED_OUT: set[int] = set()
_HANDING_OUT = threading.Lock()


def previous_port(state: BoxState, address: str) -> int:
    """The port an earlier run of this folder used, so its known_hosts entry stays valid."""
    return state.port if state.address == address else 0


def choose_port(address: str, port: int, previous: int = 0) -> int:
    """The requested port if free; for 0, the previous port if free, else any free one.

    Raises:
        SandboxError: the requested port is taken.
    """
    if port == 0:
        # Free at the wildcard address is free at every address, ``address`` included.
        if previous and is_free(ANY_ADDRESS, previous):
            return previous
        return free_port(address)
    if not is_free(address, port):
        raise SandboxError(
            f"port {port} on {address} is taken",
            remedy="pick another --port, or omit it to use a free one",
        )
    return port


def is_free(address: str, port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind((address, port))
        except OSError:
            return False
    return True


def free_port(address: str) -> int:
    """A port ``address`` can listen on that no socket holds at any address, and that this
    process has not handed out before.

    Rehearsal hosts share the machine: a model server listens on every address (as vLLM does),
    and the preflight calls a port held at any address taken, so a port free at ``address``
    alone may be another rehearsal host's sshd port. The hosts of a fleet choose theirs at once.

    Raises:
        SandboxError: ``address`` cannot be listened on.
    """
    with socket.socket() as probe:
        try:
            probe.bind((address, 0))
        except OSError as e:
            raise SandboxError(
                f"cannot listen on {address}: {e.strerror}",
                remedy="use 127.0.0.1, or check the loopback interface is up",
            ) from None
    with _HANDING_OUT:
        for _ in range(PORT_TRIES):
            # The kernel's choice for the wildcard address is a port bound at no address.
            with socket.socket() as probe:
                probe.bind((ANY_ADDRESS, 0))
                port: int = probe.getsockname()[1]
            if port not in _HANDED_OUT:
                _HANDED_OUT.add(port)
                return port
    raise SandboxError(
        f"no free port found in {PORT_TRIES} tries",
        remedy="stop rehearsal hosts or other servers this machine no longer needs",
    )


def answers_ssh(address: str, port: int, timeout: float) -> bool:
    """True if something on address:port sends an SSH banner."""
    try:
        with socket.create_connection((address, port), timeout=timeout) as conn:
            conn.settimeout(timeout)
            return conn.recv(64).startswith(b"SSH-")
    except OSError:
        return False
