"""This machine as a host (``address: local`` in a deployment): the runbook run by an operator
logged in on the GPU box itself, without SSH.

A command goes as :meth:`opsbook.remote.hosts.Host.run` sends it (exported variables, a base64
script, coreutils ``timeout``) to ``bash`` in a session of its own, as sshd starts each command;
a probe is the same program fed to the same interpreter; a file is written as ``Host.upload``
writes it (a temporary name, the mode, a rename). Everything is journalled and redacted as over
SSH, so a local run's record reads as a remote one's. What differs: the commands run as the
user running opsbook, with its environment (less the variables opsbook sets for its own run),
and a command starts in its home, where a relative path is taken from as over SSH and SFTP.

:class:`opsbook.remote.testing.LocalHost`, the test double, is this class with a record of its
calls and a home of the test's choosing.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shlex
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from opsbook.core.channel import HEADLESS_ENV, JOURNAL_ENV, KEEP_CONNECTIONS_ENV, OUTCOME_ENV
from opsbook.core.deployment_schema import LOCAL_ADDRESS
from opsbook.core.deployment_spec import HostSpec
from opsbook.core.exceptions import TransferError
from opsbook.core.redact import Redactor
from opsbook.remote import probes
from opsbook.remote.commands import (
    KILL_GRACE,
    LOCAL_SLACK,
    OUTPUT_AFTER_EXIT,
    Ran,
    finish_command,
    journal_transfer,
    probe_label,
    unreadable,
    wire_command,
    wrap_command,
)
from opsbook.remote.journal import Journal
from opsbook.remote.protocol import CommandResult

# What opsbook sets in its own process for a run: a server started from here must not inherit
# them (it would be told where this run's record is), and over SSH no command sees them.
RUN_VARIABLES = (OUTCOME_ENV, JOURNAL_ENV, HEADLESS_ENV, KEEP_CONNECTIONS_ENV)


def is_local(spec: HostSpec) -> bool:
    """Whether a deployment's host is this machine (``address: local``)."""
    return spec.address == LOCAL_ADDRESS


def command_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment a local command runs with: ``environ`` (default this process's)
    without :data:`RUN_VARIABLES`."""
    source = os.environ if environ is None else environ
    return {k: v for k, v in source.items() if k not in RUN_VARIABLES}


class LocalMachine:
    """The machine opsbook runs on, as a :class:`~opsbook.remote.protocol.RemoteHost`.

    Args:
        spec: the deployment's host (``address: local``); its ``command_timeout`` applies.
        secrets: values to redact from the journal.
        journal: where to record commands; by default a new one (mirrored to
            ``$OPSBOOK_JOURNAL`` when set).
        environ: the commands' environment (default: this process's, see
            :func:`command_environment`); its ``HOME`` is the home folder.
    """

    def __init__(
        self,
        spec: HostSpec,
        secrets: Sequence[str] = (),
        journal: Journal | None = None,
        *,
        environ: Mapping[str, str] | None = None,
    ):
        self.spec = spec
        self.name = spec.name
        self.redactor = Redactor(secrets)
        self.journal = journal if journal is not None else Journal.from_env(self.redactor)
        self.environ = command_environment(environ)
        self.home = Path(self.environ.get("HOME") or pwd.getpwuid(os.getuid()).pw_dir)

    def __enter__(self) -> LocalMachine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"LocalMachine({self.name!r})"

    def close(self) -> None:
        """Nothing to close: no connection is held."""

    # -- commands -----------------------------------------------------------------------

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
        """Run ``command`` under ``bash`` here; as :meth:`opsbook.remote.hosts.Host.run`.

        Raises:
            CommandTimeout: the command ran longer than ``timeout`` and was stopped.
            HostError: ``check`` was set and the command failed.
        """
        limit = timeout if timeout is not None else self.spec.command_timeout
        wire = wire_command(wrap_command(command, env), limit)
        shown = label or command
        started_at = datetime.now(timezone.utc)
        started = time.monotonic()
        exit_code, out, err = run_here(
            wire, stdin, self.environ, limit + KILL_GRACE + LOCAL_SLACK, self._start_folder()
        )
        ran = Ran(shown, exit_code, out, err, started_at, time.monotonic() - started)
        return finish_command(self, ran, limit, check)

    def probe(
        self,
        name: str,
        args: dict[str, Any] | None = None,
        *,
        python: str = "python3",
        timeout: float | None = None,
    ) -> Any:
        """Run probe ``name`` with ``python`` and return its answer; as ``Host.probe``.

        Raises:
            ProbeError: the probe failed (its stderr is in the error) or did not answer JSON.
        """
        result = self.run(
            f"exec {shlex.join(probes.interpreter_argv(python))}",
            stdin=probes.assemble(name, args),
            timeout=timeout,
            label=probe_label(name, python, args),
        )
        return probes.decode(name, result.stdout, result.stderr, result.exit_code, self.name)

    def home_folder(self) -> str:
        """The home folder the commands see as ``$HOME``."""
        return str(self.home)

    # -- files --------------------------------------------------------------------------

    def upload(self, remote_path: str, data: str | bytes, mode: int = 0o644) -> None:
        """Write a whole file atomically, with ``mode`` (a temporary name, then a rename).

        Raises:
            TransferError: the folder does not exist or is not writable, or the disk is full.
        """
        payload = data.encode() if isinstance(data, str) else data
        path = self.path_of(remote_path)
        temp = path.with_name(f".{path.name}.opsbook-{uuid.uuid4().hex[:8]}.tmp")
        started = time.monotonic()
        try:
            temp.write_bytes(payload)
            temp.chmod(mode)
            temp.replace(path)
        except OSError as e:
            temp.unlink(missing_ok=True)
            raise TransferError(
                f"could not write {remote_path}: {e.strerror or e}",
                host=self.name,
                remedy="check that the folder exists, the user may write to it and the disk "
                "has room (df -h)",
            ) from None
        written = f"write {remote_path} ({len(payload)} bytes, mode {mode:o})"
        journal_transfer(self, "upload", written, started)

    def read_bytes(self, remote_path: str) -> bytes:
        """Read a whole file.

        Raises:
            TransferError: it does not exist or is not readable.
        """
        started = time.monotonic()
        try:
            data = self.path_of(remote_path).read_bytes()
        except OSError as e:
            raise unreadable(self.name, remote_path, e) from None
        journal_transfer(self, "download", f"read {remote_path} ({len(data)} bytes)", started)
        return data

    def read_text(self, remote_path: str) -> str:
        return self.read_bytes(remote_path).decode(errors="replace")

    def _start_folder(self) -> Path:
        # sshd starts a command in the home folder, or in / when there is none.
        return self.home if self.home.is_dir() else Path("/")

    def path_of(self, remote_path: str) -> Path:
        """Where a host path is here: a relative or ``~/`` path from the home, as SFTP takes it
        from the login directory."""
        relative = remote_path[2:] if remote_path.startswith("~/") else remote_path
        return self.home / relative


def run_here(
    wire: str,
    stdin: str | bytes | None,
    environ: Mapping[str, str],
    limit: float,
    folder: Path | None = None,
) -> tuple[int, str, str]:
    """Run a wire command (:func:`~opsbook.remote.commands.wire_command`) under the local bash, in
    a session of its own as sshd runs one: the operator's Ctrl-C is not its signal, and a
    process it leaves behind is not in opsbook's group. As over SSH, the output is taken until
    the command exits and then for :data:`~opsbook.remote.commands.OUTPUT_AFTER_EXIT` seconds
    only, so that a server it started in the background, still holding the output, does not
    hold the caller.

    Args:
        limit: the backstop, in seconds: past it the command's group is killed (exit 124).
        folder: where the command starts (default: this process's working folder).

    Returns:
        The exit code, stdout and stderr.
    """
    proc = subprocess.Popen(
        ["bash", "-c", wire],
        stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=dict(environ),
        cwd=folder,
        start_new_session=True,
    )
    assert proc.stdout is not None and proc.stderr is not None
    out, err = _Drain(proc.stdout), _Drain(proc.stderr)
    if stdin is not None:
        threading.Thread(target=_feed, args=(proc, stdin), daemon=True).start()
    try:
        code = proc.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        # Our own child's session, by its id: the backstop behind the command's `timeout`.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        code = 124
    return code, out.taken(OUTPUT_AFTER_EXIT), err.taken(OUTPUT_AFTER_EXIT)


def _feed(proc: subprocess.Popen[bytes], stdin: str | bytes) -> None:
    assert proc.stdin is not None
    # A command that ends without reading all its input (a probe that fails at once) closes
    # the pipe under the writer; its exit code says what happened.
    with contextlib.suppress(OSError):
        proc.stdin.write(stdin.encode() if isinstance(stdin, str) else stdin)
    with contextlib.suppress(OSError):
        proc.stdin.close()


class _Drain:
    """Reads a pipe to its end on a thread of its own; what came can be taken before then."""

    def __init__(self, pipe: Any):
        self._chunks: list[bytes] = []
        self._lock = threading.Lock()
        self._taken = False
        self._thread = threading.Thread(target=self._read, args=(pipe,), daemon=True)
        self._thread.start()

    def _read(self, pipe: Any) -> None:
        with pipe:
            for chunk in iter(lambda: pipe.read1(65536), b""):
                with self._lock:
                    if not self._taken:
                        self._chunks.append(chunk)

    def taken(self, wait: float) -> str:
        """What came until the pipe's end, or until ``wait`` seconds from now."""
        self._thread.join(wait)
        with self._lock:
            self._taken = True
            return b"".join(self._chunks).decode(errors="replace")
