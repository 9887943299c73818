"""The one seam to a remote machine: :class:`Host` wraps ``fabric.Connection``.

Everything that touches a host goes through here, so that every command
- runs under an explicit ``bash``, whatever the login shell (zsh aborts on an unmatched glob,
  fish parses quotes its own way): the login shell only ever sees a base64 word;
- has a timeout enforced on the host (coreutils ``timeout``) and locally as a backstop;
- is journalled, with secrets redacted;
and so that paramiko's and the socket layer's errors become :mod:`opsbook.core.exceptions`.
"""

from __future__ import annotations

import base64
import errno
import hashlib
import math
import os
import posixpath
import select
import shlex
import socket
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import paramiko
from fabric import Connection

from opsbook.core.channel import KEEP_CONNECTIONS_ENV
from opsbook.core.deployment import Deployment, HostSpec
from opsbook.core.deployment_schema import LOCAL_ADDRESS
from opsbook.core.exceptions import (
    AuthenticationFailed,
    ConnectionRefused,
    ConnectTimeout,
    HostError,
    HostKeyChanged,
    HostKeyUnknown,
    HostUnreachable,
    ProbeError,
    TransferError,
    UnknownHostName,
)
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
from opsbook.remote.local_machine import LocalMachine
from opsbook.remote.protocol import CommandResult, RemoteHost

# How often a running command is checked for exit when it prints nothing.
POLL_SECONDS = 0.01
# Hosts worked on at once by a group (Ansible's default is 5; SSH round trips are cheap here).
DEFAULT_FORKS = 10


def fingerprint(key: paramiko.PKey) -> str:
    """The key's SHA256 fingerprint as OpenSSH prints it."""
    digest = base64.b64encode(hashlib.sha256(key.asbytes()).digest()).decode().rstrip("=")
    return f"SHA256:{digest}"


def known_hosts_name(address: str, port: int) -> str:
    return address if port == 22 else f"[{address}]:{port}"


class _KnownHostsPolicy(paramiko.MissingHostKeyPolicy):
    """Refuse an unknown key with its fingerprint and the exact line to trust it, or trust it
    once when the deployment opted into trust-on-first-use."""

    def __init__(self, spec: HostSpec, known_hosts: Path):
        self.spec = spec
        self.known_hosts = known_hosts

    def missing_host_key(
        self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey
    ) -> None:
        entry = f"{hostname} {key.get_name()} {key.get_base64()}"
        if self.spec.trust_on_first_use:
            self.known_hosts.parent.mkdir(parents=True, exist_ok=True)
            with self.known_hosts.open("a") as f:
                f.write(entry + "\n")
            client.get_host_keys().add(hostname, key.get_name(), key)
            return
        raise HostKeyUnknown(
            f"host key of {hostname} is not in {self.known_hosts} "
            f"({key.get_name()} {fingerprint(key)})",
            host=self.spec.name,
            remedy=(
                "check the fingerprint with the host's owner (on the host: ssh-keygen -lf "
                "/etc/ssh/ssh_host_*_key.pub), then trust it with: echo "
                f"{shlex.quote(entry)} >> {shlex.quote(str(self.known_hosts))}  "
                "(or set trust_on_first_use: true for this host in the deployment)"
            ),
            fingerprint=fingerprint(key),
        )


# A deploy runs its stages one after another in one kernel, and each stage opens its hosts
# anew: an SSH handshake (about 0.2 s) per host and stage. Where KEEP_CONNECTIONS_ENV is "1" (the
# run sets it in its shared kernel), a Host that is closed leaves its live connection for the next
# Host of the same spec in the process; a failed connection is never kept.
_kept: dict[HostSpec, Connection] = {}
_kept_lock = threading.Lock()


def _keeping() -> bool:
    return os.environ.get(KEEP_CONNECTIONS_ENV) == "1"


def _take_kept(spec: HostSpec) -> Connection | None:
    """A live connection a closed Host of ``spec`` left, or None."""
    with _kept_lock:
        conn = _kept.pop(spec, None)
    if conn is not None and conn.is_connected:
        return conn
    if conn is not None:
        conn.close()
    return None


def close_kept_connections() -> None:
    """Close every connection kept for a next Host (the end of what shares them)."""
    with _kept_lock:
        kept = list(_kept.values())
        _kept.clear()
        ahead = list(_ahead.values())
        _ahead.clear()
    for conn in kept:
        conn.close()
    for opening in ahead:
        opening.connection.add_done_callback(_close_opened)


# Connections opened ahead of the first Host that needs them (:func:`open_ahead`).
@dataclass
class _Opening:
    started: float
    connection: Future[Connection]


_ahead: dict[HostSpec, _Opening] = {}


def open_ahead(specs: Sequence[HostSpec], forks: int = 10) -> list[Future[Connection]]:
    """Start opening these hosts' SSH connections on threads of their own, for the first Host
    of each spec in this process to take (where connections are kept, see
    :data:`KEEP_CONNECTIONS_ENV`): a deploy's kernel does this while the run takes its locks,
    so that its first stage does not wait for the handshakes. A host whose key opsbook would
    trust on first use is left for its stage (it would write known_hosts before the locks).
    A connection that fails is the failure of the first Host to take it, as if it had tried.

    Returns:
        The connections being opened (futures), one per host opened ahead.
    """
    # This machine (`address: local`) has no connection to open.
    wanted = [s for s in specs if not s.trust_on_first_use and s.address != LOCAL_ADDRESS]
    if not wanted:
        return []
    opener = ThreadPoolExecutor(max(1, min(forks, len(wanted))), "opsbook-open-ahead")
    with _kept_lock:
        for spec in wanted:
            if spec not in _ahead:
                # A journal of its own: the Host that takes the connection journals a failure.
                opening = opener.submit(Host(spec, journal=Journal())._open_new)
                _ahead[spec] = _Opening(time.monotonic(), opening)
        openings = [_ahead[spec].connection for spec in wanted]
    opener.shutdown(wait=False)
    return openings


def _take_opening(spec: HostSpec) -> _Opening | None:
    with _kept_lock:
        return _ahead.pop(spec, None)


def _close_opened(opening: Future[Connection]) -> None:
    if not opening.cancelled() and opening.exception() is None:
        opening.result().close()


def _keep(spec: HostSpec, conn: Connection) -> None:
    with _kept_lock:
        old = _kept.get(spec)
        _kept[spec] = conn
    if old is not None and old is not conn:
        old.close()


class Host:
    """One remote machine reached over SSH.

    Args:
        spec: how to reach it.
        secrets: values to redact from the journal.
        journal: where to record commands; by default a new one (mirrored to
            ``$OPSBOOK_JOURNAL`` when set).
    """

    def __init__(self, spec: HostSpec, secrets: Sequence[str] = (), journal: Journal | None = None):
        self.spec = spec
        self.name = spec.name
        self.redactor = Redactor(secrets)
        # An empty journal is falsy (it has a length): test for None, or hosts sharing one split.
        self.journal = journal if journal is not None else Journal.from_env(self.redactor)
        self._conn: Connection | None = None
        self._home: str | None = None
        # A stage may read a host in several threads at once (one channel each): they share
        # one connection, opened by the first.
        self._connecting = threading.Lock()

    @classmethod
    def from_deployment(
        cls, deployment: Deployment, index: int = 0, journal: Journal | None = None
    ) -> Host:
        return cls(deployment.hosts[index], deployment.secret_values(), journal)

    def __enter__(self) -> Host:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Host({self.name!r})"

    # -- connection ---------------------------------------------------------------------

    def connect(self) -> Connection:
        """Open the SSH connection if it is not open yet, checking the host key."""
        with self._connecting:
            return self._connect()

    def _connect(self) -> Connection:
        if self._conn is not None and self._conn.is_connected:
            return self._conn
        kept = None
        if _keeping():
            kept = self._opened_ahead() or _take_kept(self.spec)
        if kept is not None:
            self._conn = kept
            return kept
        return self._open_new()

    def _open_new(self) -> Connection:
        """Open a connection of this Host's own (never one kept or opened ahead)."""
        conn = self._new_connection()
        started = time.monotonic()
        try:
            conn.open()
        except BaseException as e:
            conn.close()
            error = self._translate_connect_error(e)
            self._journal_connect_failure(started, str(error) if error else repr(e))
            if error is None:
                raise
            raise error from None
        transport = conn.client.get_transport()
        if transport is not None:
            transport.set_keepalive(self.spec.keepalive)
            _send_at_once(transport.sock)
        self._conn = conn
        return conn

    def _opened_ahead(self) -> Connection | None:
        """The connection :func:`open_ahead` opened for this spec (waiting for it), or None;
        its failure is this Host's."""
        opening = _take_opening(self.spec)
        if opening is None:
            return None
        try:
            conn = opening.connection.result()
        except HostError as e:
            self._journal_connect_failure(opening.started, str(e))
            raise
        except Exception:  # not a failure opsbook names: this Host tries, and says what it is
            return None
        if conn.is_connected:
            return conn
        conn.close()
        return None

    def _journal_connect_failure(self, started: float, note: str) -> None:
        self.journal.record(
            host=self.name,
            kind="connect",
            command=f"ssh {self.name}",
            exit_code=None,
            duration=time.monotonic() - started,
            note=note,
        )

    def close(self) -> None:
        """Done with the host: the connection is closed, or left for the next stage of a run
        that keeps connections (see :data:`KEEP_CONNECTIONS_ENV`)."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if _keeping() and conn.is_connected:
            _keep(self.spec, conn)
        else:
            conn.close()

    def _drop(self) -> None:
        """Close the connection for good: it failed, or a command was abandoned on it."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def _new_connection(self) -> Connection:
        spec = self.spec
        use_key = spec.key is not None
        connect_kwargs: dict[str, Any] = {
            "look_for_keys": not use_key,
            "allow_agent": not use_key,
            "banner_timeout": spec.connect_timeout,
            "auth_timeout": spec.connect_timeout,
        }
        if use_key:
            connect_kwargs["key_filename"] = spec.key
        conn = Connection(
            host=spec.address,
            user=spec.user,
            port=spec.port,
            connect_timeout=math.ceil(spec.connect_timeout),
            connect_kwargs=connect_kwargs,
        )
        known_hosts = Path(spec.known_hosts).expanduser()
        # Fabric auto-accepts unknown keys; opsbook checks them against known_hosts.
        client = paramiko.SSHClient()
        if known_hosts.exists():
            client.load_host_keys(str(known_hosts))
        client.set_missing_host_key_policy(_KnownHostsPolicy(spec, known_hosts))
        conn.client = client
        return conn

    def _translate_connect_error(self, e: BaseException) -> Exception | None:
        spec, where = self.spec, self.spec.name
        if isinstance(e, (HostKeyUnknown, HostError)):
            return e
        if isinstance(e, paramiko.BadHostKeyException):
            name = known_hosts_name(spec.address, spec.port)
            return HostKeyChanged(
                f"host key of {name} CHANGED: known_hosts has {fingerprint(e.expected_key)}, "
                f"the host offered {fingerprint(e.key)}; this may be another machine",
                host=where,
                remedy=(
                    "do not connect until you know why; if the host was reinstalled, remove the "
                    f"old entry with: ssh-keygen -R {shlex.quote(name)} -f "
                    f"{shlex.quote(str(Path(spec.known_hosts).expanduser()))} and trust the new key"
                ),
                fingerprint=fingerprint(e.key),
            )
        if isinstance(e, paramiko.AuthenticationException):
            return AuthenticationFailed(
                f"authentication as {spec.user or 'the local user'} failed: {e}",
                host=where,
                remedy=(
                    "check 'user' and 'key' in the deployment; the public key must be in the "
                    "user's ~/.ssh/authorized_keys on the host (ssh-copy-id)"
                ),
            )
        if isinstance(e, (socket.gaierror, UnicodeError)):
            return UnknownHostName(
                f"host name {spec.address!r} does not resolve ({getattr(e, 'strerror', e)})",
                host=where,
                remedy="check the address in the deployment file, or add it to DNS or /etc/hosts",
            )
        if isinstance(e, paramiko.ssh_exception.NoValidConnectionsError) or (
            isinstance(e, OSError) and e.errno == errno.ECONNREFUSED
        ):
            return ConnectionRefused(
                f"connection to {spec.address} port {spec.port} refused",
                host=where,
                remedy="check that sshd runs on the host and the port is right",
            )
        if isinstance(e, (TimeoutError, socket.timeout)):
            return ConnectTimeout(
                f"no answer from {spec.address} port {spec.port} within {spec.connect_timeout:g} s",
                host=where,
                remedy="check the address, network path and firewalls, or raise connect_timeout",
            )
        if isinstance(e, paramiko.SSHException) and any(
            sign in str(e) for sign in ("No existing session", "Error reading SSH protocol banner")
        ):
            # The port accepts TCP (the kernel does that) but sshd never speaks: it is hung.
            return ConnectTimeout(
                f"{spec.address} port {spec.port} accepted the connection but its SSH server "
                f"did not answer within {spec.connect_timeout:g} s (sshd or the machine is hung "
                "or stopped)",
                host=where,
                remedy="check the host's load and its sshd, or raise connect_timeout",
            )
        if isinstance(e, (paramiko.SSHException, OSError, EOFError)):
            return HostUnreachable(
                f"SSH connection to {spec.address} port {spec.port} failed: {e}",
                host=where,
                remedy="check that the port is an SSH server and the host is healthy",
            )
        return None

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
        """Run ``command`` under ``bash`` on the host.

        Args:
            command: bash source; quote every value put into it with ``shlex.quote``.
            env: variables exported before the command; values reach it literally.
            timeout: seconds before the command is stopped (default: the host's).
            stdin: text or bytes fed to the command's standard input.
            check: raise :class:`HostError` when the exit code is not 0.
            label: what the journal shows instead of the command text.

        Raises:
            CommandTimeout: the command ran longer than ``timeout`` and was stopped.
            HostError: ``check`` was set and the command failed; or the connection failed.
        """
        limit = timeout if timeout is not None else self.spec.command_timeout
        wire = wire_command(wrap_command(command, env), limit)
        shown = label or command
        conn = self.connect()
        started_at = datetime.now(timezone.utc)
        started = time.monotonic()
        try:
            exit_code, out, err = _exec(
                conn, wire, stdin, limit + KILL_GRACE + LOCAL_SLACK, self.spec.connect_timeout
            )
        except TimeoutError:
            exit_code, out, err = 124, "", ""
            self._drop()  # the channel was abandoned mid-command; start afresh next time
        except ChannelTimeout:
            self._drop()
            raise HostUnreachable(
                f"the host did not answer within {self.spec.connect_timeout:g} s: the SSH "
                "connection is open but nothing on the host responds (sshd or the machine is "
                f"hung or stopped); {self.redactor.redact(shown)[:200]!r} did not start",
                host=self.name,
                remedy="check the host's load and its sshd; the next command reconnects "
                "(connect_timeout in the deployment sets this wait)",
            ) from None
        except (paramiko.SSHException, OSError, EOFError) as e:
            self._drop()
            self.journal.record(
                host=self.name,
                kind="run",
                command=shown,
                exit_code=None,
                duration=time.monotonic() - started,
                started=started_at,
                note=f"connection dropped: {e}",
            )
            raise HostUnreachable(
                f"the SSH connection dropped while running {self.redactor.redact(shown)!r}: {e}",
                host=self.name,
                remedy="check the host and the network; the command may or may not have run",
            ) from None
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
        """Run probe ``name`` (see :mod:`opsbook.remote.probes`) with the host's ``python`` and
        return its decoded JSON answer.

        Raises:
            ProbeError: the probe failed (its stderr is in the error) or did not answer JSON.
        """
        program = probes.assemble(name, args)
        result = self.run(
            f"exec {shlex.join(probes.interpreter_argv(python))}",
            stdin=program,
            timeout=timeout,
            label=probe_label(name, python, args),
        )
        if result.exit_code != 0 and not probes.is_framed(result.stdout):
            self._check_login_shell()
        return probes.decode(name, result.stdout, result.stderr, result.exit_code, self.name)

    def _check_login_shell(self) -> None:
        """After a probe failed without answering: does the login shell run commands at all?

        Raises:
            ProbeError: it does not (a nologin shell, a startup file that exits): the message
                names that, not a missing python3.
        """
        check = self.run("exit 0", label="login shell check")
        if check.ok:
            return
        said = (check.stderr.strip() or check.stdout.strip()).splitlines()
        raise ProbeError(
            f"the login shell of {self.spec.user or 'the login user'} exits with code "
            f"{check.exit_code} before running any command"
            + (f" (it says: {said[-1][:200]})" if said else ""),
            host=self.name,
            remedy="an account whose shell is nologin or false runs no command: give it a real "
            "shell (chsh -s /bin/bash USER); otherwise a startup file the shell reads for every "
            "command (~/.zshenv, /etc/zsh/zshenv, ~/.bashrc) exits or fails: fix that file",
        )

    def home_folder(self) -> str:
        """The login user's home folder on the host (asked once per Host).

        Raises:
            HostError: it could not be read.
        """
        if self._home is None:
            self._home = self.run('printf %s "$HOME"', check=True, label="home folder").stdout
        return self._home

    # -- files --------------------------------------------------------------------------

    def upload(self, remote_path: str, data: str | bytes, mode: int = 0o644) -> None:
        """Write ``data`` to ``remote_path`` over SFTP atomically: a temporary name in the
        same folder, the mode set, then a rename over the target.

        Raises:
            TransferError: the folder does not exist or is not writable.
        """
        payload = data.encode() if isinstance(data, str) else data
        path = _sftp_path(remote_path)
        folder, base = posixpath.split(path)
        temp = posixpath.join(folder, f".{base}.opsbook-{uuid.uuid4().hex[:8]}.tmp")
        started = time.monotonic()
        sftp = self._sftp()
        try:
            with sftp.open(temp, "wb") as f:
                f.write(payload)
            sftp.chmod(temp, mode)
            sftp.posix_rename(temp, path)
        except OSError as e:
            _remove_quietly(sftp, temp)
            if self._short_of_space(folder or ".", len(payload)):
                raise TransferError(
                    f"could not write {remote_path}: no space left on the device that holds "
                    f"{folder or 'the home folder'} ({len(payload)} bytes to write)",
                    host=self.name,
                    remedy="free space on the host (df -h there), then run again",
                ) from None
            raise TransferError(
                f"could not write {remote_path}: {e.strerror or e}",
                host=self.name,
                remedy="check that the folder exists and the user may write to it",
            ) from None
        written = f"sftp put {remote_path} ({len(payload)} bytes, mode {mode:o})"
        journal_transfer(self, "upload", written, started)

    def _short_of_space(self, folder: str, size: int) -> bool:
        """Whether the filesystem of ``folder`` has less than ``size`` bytes free: SFTP says
        only "Failure" when a write meets a full disk."""
        try:
            df = self.run(f"stat -f -c '%a %S' -- {shlex.quote(folder)}", label="free space")
            available, block = (int(n) for n in df.stdout.split())
        except (HostError, ValueError):
            return False
        return df.ok and available * block < size + block

    def read_bytes(self, remote_path: str) -> bytes:
        """Read a whole file over SFTP.

        Raises:
            TransferError: it does not exist or is not readable.
        """
        started = time.monotonic()
        try:
            with self._sftp().open(_sftp_path(remote_path), "rb") as f:
                data: bytes = f.read()
        except OSError as e:
            raise unreadable(self.name, remote_path, e) from None
        journal_transfer(self, "download", f"sftp get {remote_path} ({len(data)} bytes)", started)
        return data

    def _sftp(self) -> paramiko.SFTPClient:
        try:
            sftp: paramiko.SFTPClient = self.connect().sftp()
        except paramiko.SSHException as e:
            raise TransferError(
                f"the host refused an SFTP session: {e}",
                host=self.name,
                remedy="enable the sftp subsystem in the host's sshd_config "
                "(Subsystem sftp internal-sftp)",
            ) from None
        return sftp

    def read_text(self, remote_path: str) -> str:
        return self.read_bytes(remote_path).decode(errors="replace")


def host_for(spec: HostSpec, secrets: Sequence[str], journal: Journal) -> RemoteHost:
    """The host a deployment's entry names: this machine for ``address: local``
    (:class:`opsbook.remote.local_machine.LocalMachine`), else a :class:`Host` over SSH."""
    if spec.address == LOCAL_ADDRESS:
        return LocalMachine(spec, secrets, journal)
    return Host(spec, secrets, journal)


class HostGroup:
    """Several hosts; each call answers per host, as Fabric's ``GroupResult`` does.

    Calls fan out on at most ``forks`` threads at once (Ansible's ``--forks``): a slow or
    unreachable host holds one thread, never the others. An exception a host raised is that
    host's answer, not the group's.

    Args:
        hosts: the hosts, in the deployment's order.
        forks: how many hosts are worked on at once.
    """

    def __init__(self, hosts: Sequence[RemoteHost], forks: int = DEFAULT_FORKS):
        if forks < 1:
            raise ValueError(f"forks must be at least 1, not {forks}")
        self.hosts = list(hosts)
        self.forks = forks

    @classmethod
    def from_deployment(
        cls,
        deployment: Deployment,
        forks: int = DEFAULT_FORKS,
        names: Sequence[str] = (),
        journal: Journal | None = None,
    ) -> HostGroup:
        """The deployment's hosts (only those named, when ``names`` is given), sharing one
        journal (the run's, named by the environment, unless ``journal`` is given)."""
        # Not `journal or ...`: a journal with no entry yet is falsy (its length is 0).
        if journal is None:
            journal = Journal.from_env(Redactor(deployment.secret_values()))
        specs = [s for s in deployment.hosts if not names or s.name in names]
        return cls([host_for(s, deployment.secret_values(), journal) for s in specs], forks)

    @property
    def names(self) -> list[str]:
        return [h.name for h in self.hosts]

    def run(self, command: str, **kwargs: Any) -> dict[str, CommandResult | Exception]:
        return self.map(lambda h: h.run(command, **kwargs))

    def probe(self, name: str, args: dict[str, Any] | None = None, **kwargs: Any) -> dict[str, Any]:
        return self.map(lambda h: h.probe(name, args, **kwargs))

    def map(
        self, call: Callable[[RemoteHost], Any], on_done: Callable[[str, Any], None] | None = None
    ) -> dict[str, Any]:
        """``call(host)`` on every host, ``forks`` at a time; per host name its return value
        or the exception it raised, in the hosts' order. ``on_done(name, answer)`` is called
        as each host finishes (from the worker thread)."""

        def one(host: RemoteHost) -> Any:
            try:
                answer = call(host)
            except Exception as e:  # the host's answer, not the group's failure
                answer = e
            if on_done is not None:
                on_done(host.name, answer)
            return answer

        with ThreadPoolExecutor(max_workers=max(1, min(self.forks, len(self.hosts)))) as pool:
            futures = [(h.name, pool.submit(one, h)) for h in self.hosts]
        return {name: future.result() for name, future in futures}

    def close(self) -> None:
        for host in self.hosts:
            host.close()


def _send_at_once(sock: Any) -> None:
    """Turn Nagle's algorithm off on the connection's socket. A command's last messages (its
    input's end after its data, a channel's close) are small packets sent back to back: held
    until the host acknowledges the one before, which it delays up to 40 ms when it has
    nothing to send, they made every command about 40 ms slower than OpenSSH's ``ssh`` over
    one connection (a probe of 119 shards: 0.071 s against 0.028 s)."""
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except (OSError, AttributeError):  # not a TCP socket (a proxy command's pipe)
        pass


class ChannelTimeout(Exception):
    """The host did not open a session channel in time: it is hung, not slow."""


def _exec(
    conn: Connection,
    wire: str,
    stdin: str | bytes | None,
    limit: float,
    open_timeout: float | None = None,
) -> tuple[int, str, str]:
    """Run ``wire`` on a session channel of the connection; feed ``stdin`` and close it.

    Invoke's runner copies stdin one byte per 10 ms poll, which makes a 15 kB probe take
    minutes; a channel of the same transport sends it at once.

    Raises:
        TimeoutError: no exit status within ``limit`` seconds (the channel is closed).
        ChannelTimeout: the host did not open a channel within ``open_timeout`` seconds.
    """
    transport = conn.client.get_transport()
    if transport is None or not transport.is_active():
        raise EOFError("the SSH transport is closed")
    # Opening a channel is one round trip: a host that takes longer is hung, and waiting for
    # the whole command's limit first would only delay saying so.
    try:
        chan = transport.open_session(timeout=min(limit, open_timeout or limit))
    except paramiko.SSHException as e:
        if "Timeout opening channel" in str(e):
            raise ChannelTimeout from None
        raise
    try:
        chan.exec_command(wire)
        if stdin is not None:
            try:
                chan.sendall(stdin.encode() if isinstance(stdin, str) else stdin)
            except OSError:
                # A command that ends without reading all its input (a login shell that exits
                # at once) closes the channel under the sender; its exit status still came.
                if not transport.is_active():
                    raise
        chan.shutdown_write()
        out, err = bytearray(), bytearray()
        deadline = time.monotonic() + limit
        exited_at: float | None = None
        while True:
            select.select([chan], [], [], POLL_SECONDS)
            while chan.recv_ready():
                out += chan.recv(65536)
            while chan.recv_stderr_ready():
                err += chan.recv_stderr(65536)
            if chan.exit_status_ready() and not chan.recv_ready() and not chan.recv_stderr_ready():
                # sshd reports the exit as soon as it sees it and forwards what is still in the
                # pipe after that: the output's end (EOF) says it has all come. A background
                # process that holds the output open never ends it: wait for it a little only.
                # A closed channel (its connection dropped) has nothing more to bring.
                exited_at = exited_at or time.monotonic()
                if (
                    chan.eof_received
                    or chan.closed
                    or time.monotonic() - exited_at > OUTPUT_AFTER_EXIT
                ):
                    break
            if time.monotonic() > deadline:
                raise TimeoutError
        code = chan.recv_exit_status()
        if code == -1 and not transport.is_active():
            # The connection died before the command said how it ended.
            raise EOFError("the SSH connection closed before the command finished")
    finally:
        chan.close()
    return code, out.decode(errors="replace"), err.decode(errors="replace")


def _sftp_path(path: str) -> str:
    # SFTP paths are relative to the login directory; "~/" means the same there.
    return path[2:] if path.startswith("~/") else path


def _remove_quietly(sftp: paramiko.SFTPClient, path: str) -> None:
    try:
        sftp.remove(path)
    except OSError:
        pass
