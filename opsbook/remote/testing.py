r"""Test doubles of :class:`opsbook.remote.hosts.Host`, shipped for tests of code that takes a
host: opsbook's own unit tests and the notebooks' users' (as Fabric ships ``fabric.testing``
and invoke ``MockContext``). Both are :class:`opsbook.remote.protocol.RemoteHost`\ s, as Host is.

``FakeHost`` answers from a script instead of a machine: commands by regular expression, probes
by name (a value, a function of the probe's arguments, or an exception to raise), files by path.
Anything not scripted is refused loudly (:class:`UnexpectedCall`), so a test never passes on an
answer nobody wrote.

``LocalHost`` is this machine: commands run under the local ``bash``, probes with the local
python (the very program a host's python runs), files are read and written in place. It is for
tests of the parts around a command or a probe, whose answers only the real thing gives.

Both record every call, so a test can assert what was sent.

Example::

    host = FakeHost("gpu-01", probes={"facts": facts_answer}, commands={r"^bash -n": ""})
    report = stages.preflight.run(host, deployment, stages.preflight.Options())
    assert host.calls == [("probe", "facts")]

    host = LocalHost(home=tmp_path)
    upload_script(host, deployment, render_script(deployment))
    assert (tmp_path / "opsbook" / "launch.sh").exists()
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from opsbook.core.deployment_spec import HostSpec
from opsbook.core.exceptions import (
    ConnectionRefused,
    HostError,
    HostUnreachable,
    TransferError,
)
from opsbook.remote import probes
from opsbook.remote.journal import Journal
from opsbook.remote.local_machine import LocalMachine
from opsbook.remote.protocol import CommandResult, RemoteHost


def local_probe(
    name: str, python: str = "/usr/bin/python3", env: dict[str, str] | None = None
) -> Callable[[dict[str, Any]], Any]:
    """A probe answer computed by running the real probe ``name`` with a local interpreter,
    exactly as a host's python would: for tests of the parts around a probe."""

    def answer(args: dict[str, Any]) -> Any:
        return probes.run_local(name, args, python=python, env=env)

    return answer


class UnexpectedCall(AssertionError):
    """The code under test sent something the test did not script."""


@dataclass(frozen=True)
class Answer:
    """A scripted command's answer."""

    stdout: str = ""
    stderr: str = ""
    exit_code: int = 0


ProbeAnswer = Any  # a JSON-like value, a callable(args) -> value, or an exception to raise


_Host = TypeVar("_Host", bound="_RecordingHost")


class _RecordingHost:
    """What the doubles share: a name like a real host's, and the record of every call.

    ``calls`` holds ``(kind, what)`` per call: ``("run", command)``, ``("probe", name)``,
    ``("upload", path)``, ``("read", path)``, ``("home", "")``, ``("close", "")``;
    ``probe_args`` the arguments of each probe.
    """

    def __init__(self, spec: HostSpec):
        self.spec = spec
        self.name = spec.name
        self.journal = Journal()
        self.calls: list[tuple[str, str]] = []
        self.probe_args: list[tuple[str, dict[str, Any]]] = []
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"

    def __enter__(self: _Host) -> _Host:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._note("close", "")

    def _note(self, kind: str, what: str) -> None:
        with self._lock:
            self.calls.append((kind, what))

    def _note_probe(self, name: str, args: dict[str, Any] | None) -> None:
        self._note("probe", name)
        with self._lock:
            self.probe_args.append((name, dict(args or {})))

    def _failed(self, command: str, exit_code: int, stderr: str) -> HostError:
        """As Host.run's: a failed command raises when the caller asked for check."""
        said = f"\n  stderr: {stderr.strip()[-500:]}" if stderr.strip() else ""
        return HostError(
            f"command failed with exit code {exit_code}: {command[:200]}{said}", host=self.name
        )


class FakeHost(_RecordingHost):
    """A host that answers from a script.

    Args:
        address: its address (its name is ``user@address`` like a real host's).
        user: the login user.
        commands: regular expression (searched in the command) -> an :class:`Answer`, a string
            (stdout, exit 0) or an exception to raise; the first match wins.
        probes: probe name -> its answer, a function of the probe's arguments, or an exception.
        files: remote path -> content, for ``read_bytes``/``read_text``; ``upload`` writes here.
        home: what ``home_folder`` answers.
        unreachable: every call raises this (``True``: a ``ConnectionRefused``).
        delay: seconds each call takes, to play a slow host.
    """

    def __init__(
        self,
        address: str = "gpu-01",
        *,
        user: str = "ops",
        commands: Mapping[str, Answer | str | BaseException] | None = None,
        probes: Mapping[str, ProbeAnswer] | None = None,
        files: Mapping[str, str | bytes] | None = None,
        home: str = "/home/ops",
        unreachable: bool | HostUnreachable = False,
        delay: float = 0.0,
    ):
        super().__init__(HostSpec(address=address, user=user))
        self.commands = dict(commands or {})
        self.probes = dict(probes or {})
        self.files = {k: v.encode() if isinstance(v, str) else v for k, v in (files or {}).items()}
        self.home = home
        self.unreachable = unreachable
        self.delay = delay

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
        self._enter("run", command)
        for pattern, answer in self.commands.items():
            if re.search(pattern, command):
                if isinstance(answer, BaseException):
                    raise answer
                if isinstance(answer, str):
                    answer = Answer(stdout=answer)
                result = CommandResult(
                    self.name, label or command, answer.exit_code, answer.stdout, answer.stderr, 0.0
                )
                if check and not result.ok:
                    raise self._failed(command, result.exit_code, "")
                return result
        raise UnexpectedCall(f"{self.name}: no scripted answer for command {command!r}")

    def probe(
        self,
        name: str,
        args: dict[str, Any] | None = None,
        *,
        python: str = "python3",
        timeout: float | None = None,
    ) -> Any:
        self._enter("probe", name)
        with self._lock:
            self.probe_args.append((name, dict(args or {})))
        if name not in self.probes:
            raise UnexpectedCall(f"{self.name}: no scripted answer for probe {name!r}")
        answer = self.probes[name]
        if isinstance(answer, BaseException):
            raise answer
        if callable(answer):
            return answer(dict(args or {}))
        return answer

    def home_folder(self) -> str:
        self._enter("home", "")
        return self.home

    def upload(self, remote_path: str, data: str | bytes, mode: int = 0o644) -> None:
        self._enter("upload", remote_path)
        with self._lock:
            self.files[remote_path] = data.encode() if isinstance(data, str) else data

    def read_bytes(self, remote_path: str) -> bytes:
        self._enter("read", remote_path)
        if remote_path not in self.files:
            raise TransferError(f"could not read {remote_path}: No such file", host=self.name)
        return self.files[remote_path]

    def read_text(self, remote_path: str) -> str:
        return self.read_bytes(remote_path).decode(errors="replace")

    def _enter(self, kind: str, what: str) -> None:
        self._note(kind, what)
        if self.delay:
            time.sleep(self.delay)
        if self.unreachable:
            if isinstance(self.unreachable, HostUnreachable):
                raise self.unreachable
            raise ConnectionRefused(
                f"connection to {self.spec.address} port 22 refused", host=self.name
            )


class LocalHost(_RecordingHost):
    """This machine as a host: the real command, probe and file, without SSH.

    It is :class:`opsbook.remote.local_machine.LocalMachine` (the host of ``address: local``),
    recording its calls: a command goes the way :meth:`opsbook.remote.hosts.Host.run` sends
    it to the local ``bash`` in a session of its own, its output taken until it exits (and
    half a second after, as over SSH); a probe is the program a host's python runs, run by
    ``python`` whatever interpreter the caller names (the host's interpreter path means
    nothing here); files are written as ``Host.upload`` writes them (a temporary name, the
    mode, a rename), a relative or ``~/`` path in ``home``.

    Args:
        home: the host's home folder (a test's temporary folder, say): commands and probes see
            it as ``$HOME``. By default this process's, with its environment unchanged.
        address: the address in its name.
        user: the login user in its name.
        python: the interpreter that runs probes.
    """

    def __init__(
        self,
        home: str | os.PathLike[str] | None = None,
        *,
        address: str = "localhost",
        user: str | None = None,
        python: str = "/usr/bin/python3",
    ):
        super().__init__(HostSpec(address=address, user=user))
        environ = {**os.environ, "HOME": str(home)} if home is not None else None
        self.machine = LocalMachine(self.spec, journal=self.journal, environ=environ)
        self.home = self.machine.home
        self.python = python

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
        self._note("run", command)
        return self.machine.run(
            command, env=env, timeout=timeout, stdin=stdin, check=check, label=label
        )

    def probe(
        self,
        name: str,
        args: dict[str, Any] | None = None,
        *,
        python: str = "python3",
        timeout: float | None = None,
    ) -> Any:
        self._note_probe(name, args)
        return self.machine.probe(name, args, python=self.python, timeout=timeout)

    def home_folder(self) -> str:
        self._note("home", "")
        return self.machine.home_folder()

    def upload(self, remote_path: str, data: str | bytes, mode: int = 0o644) -> None:
        self._note("upload", remote_path)
        self.machine.upload(remote_path, data, mode)

    def read_bytes(self, remote_path: str) -> bytes:
        self._note("read", remote_path)
        return self.machine.read_bytes(remote_path)

    def read_text(self, remote_path: str) -> str:
        return self.read_bytes(remote_path).decode(errors="replace")


# mypy checks the package, not its tests: these lines are where it checks that the doubles
# are hosts, member for member, as Host is where HostGroup takes it.
_DOUBLES: tuple[type[RemoteHost], ...] = (FakeHost, LocalHost)
