"""What opsbook needs of a host: the one protocol every step, stage and the runner takes.

:class:`opsbook.remote.hosts.Host` (a machine over SSH) is the host of a real run; the doubles
in :mod:`opsbook.remote.testing` (:class:`~opsbook.remote.testing.FakeHost` answering from a
script, :class:`~opsbook.remote.testing.LocalHost` being this machine) are the hosts of tests.
Code that takes a host annotates it with :class:`RemoteHost`, never with one of them, so that
each can stand in for the others and mypy checks that they still can.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from opsbook.core.deployment_spec import HostSpec
from opsbook.remote.journal import Journal


@dataclass(frozen=True)
class CommandResult:
    """What a remote command did."""

    host: str
    command: str
    exit_code: int
    stdout: str
    stderr: str
    duration: float

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


@runtime_checkable
class RemoteHost(Protocol):
    """A host as the steps use it: commands, probes and files, each answered by the host.

    The meaning of each member is :class:`opsbook.remote.hosts.Host`'s; its errors are those of
    :mod:`opsbook.core.exceptions` (``HostError`` and its kinds, ``ProbeError``,
    ``TransferError``).
    """

    name: str
    """``user@address[:port]``, as results and the journal name the host."""
    spec: HostSpec
    """How the host is reached; the deployment's per-host view is keyed by it."""
    journal: Journal
    """Where its commands are recorded (a stage's hosts share one)."""

    def run(
        self,
        command: str,
        *,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
        stdin: str | bytes | None = None,
        check: bool = False,
        label: str | None = None,
    ) -> CommandResult:
        """Run ``command`` under ``bash``; ``check`` raises ``HostError`` on a non-zero exit."""
        ...

    def probe(
        self,
        name: str,
        args: dict[str, Any] | None = None,
        *,
        python: str = "python3",
        timeout: float | None = None,
    ) -> Any:
        """Run probe ``name`` (:mod:`opsbook.remote.probes`) and return its decoded answer."""
        ...

    def home_folder(self) -> str:
        """The login user's home folder."""
        ...

    def upload(self, remote_path: str, data: str | bytes, mode: int = 0o644) -> None:
        """Write a whole file atomically, with ``mode``."""
        ...

    def read_bytes(self, remote_path: str) -> bytes:
        """Read a whole file."""
        ...

    def read_text(self, remote_path: str) -> str:
        """Read a whole file as text (undecodable bytes replaced)."""
        ...

    def close(self) -> None:
        """Done with the host for now; a later call opens it again."""
        ...
