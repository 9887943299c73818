"""One remote command's shape and its ending, the same for every kind of host: the bash script
with its quoted environment, the words the login shell receives, how a finished command (or
transfer) is journalled and turned into a result or an error, and how a probe is labelled.

:class:`opsbook.remote.hosts.Host` (over SSH) and
:class:`opsbook.remote.local_machine.LocalMachine` (``address: local``) both build on it.
"""

from __future__ import annotations

import base64
import math
import shlex
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from opsbook.core.deployment_spec import ENV_NAME
from opsbook.core.exceptions import CommandTimeout, HostError, TransferError
from opsbook.core.redact import Redactor
from opsbook.remote.journal import Journal
from opsbook.remote.protocol import CommandResult

# Seconds the remote `timeout` waits after SIGTERM before SIGKILL, and the extra time the
# local backstop allows on top of both before giving up on the channel.
KILL_GRACE = 5
LOCAL_SLACK = 10
TIMEOUT_EXIT_CODES = (124, 137)
# Seconds the output may still come after the command's exit status (see _exec).
OUTPUT_AFTER_EXIT = 0.5


def wrap_command(command: str, env: Mapping[str, str] | None = None) -> str:
    """The bash script for ``command``: ``export`` lines with quoted values, then the command.

    Raises:
        ValueError: an environment name is not a valid identifier.
    """
    lines = []
    for name, value in (env or {}).items():
        if not ENV_NAME.match(name):
            raise ValueError(f"{name!r} is not a valid environment variable name")
        lines.append(f"export {name}={shlex.quote(str(value))}")
    return "\n".join([*lines, command])


def wire_command(script: str, timeout: float) -> str:
    """What the login shell receives: only words no shell can misread.

    The script travels base64-encoded and is decoded and run by ``bash`` itself.
    """
    encoded = base64.b64encode(script.encode()).decode()
    seconds = max(1, math.ceil(timeout))
    inner = f'eval "$(printf %s {encoded} | base64 -d)"'
    return f"timeout -k {KILL_GRACE} {seconds} bash -c '{inner}'"


@dataclass(frozen=True)
class Ran:
    """A command that ran to its end: what it was shown as, how it ended, when and how long."""

    shown: str
    exit_code: int
    stdout: str
    stderr: str
    started_at: datetime
    duration: float


class _Running(Protocol):
    name: str
    journal: Journal
    redactor: Redactor


def finish_command(host: _Running, ran: Ran, limit: float, check: bool) -> CommandResult:
    """A finished command journalled, then its result, or the error it is: a command stopped by
    its ``timeout`` wrapper (exit 124/137 once the limit passed), or a failure under ``check``.
    The one ending of :meth:`Host.run` and the local machine's ``run``.

    Raises:
        CommandTimeout: the command ran longer than ``limit`` and was stopped.
        HostError: ``check`` was set and the command failed.
    """
    host.journal.record(
        host=host.name,
        kind="run",
        command=ran.shown,
        exit_code=ran.exit_code,
        duration=ran.duration,
        stdout=ran.stdout,
        stderr=ran.stderr,
        started=ran.started_at,
    )
    shown = host.redactor.redact(ran.shown)[:200]
    if ran.exit_code in TIMEOUT_EXIT_CODES and ran.duration >= limit - 0.5:
        raise CommandTimeout(
            f"command timed out after {limit:g} s and was stopped: {shown}",
            host=host.name,
            remedy="raise the timeout for this step, or find out why the host is slow",
            timeout=limit,
        )
    result = CommandResult(
        host.name, ran.shown, ran.exit_code, ran.stdout, ran.stderr, ran.duration
    )
    if check and not result.ok:
        raise HostError(
            f"command failed with exit code {ran.exit_code}: {shown}"
            f"\n  stderr: {host.redactor.redact(ran.stderr.strip())[-500:]}",
            host=host.name,
        )
    return result


def journal_transfer(host: _Running, kind: str, text: str, started: float) -> None:
    """Journal a finished upload or download (``started``: its ``time.monotonic()``)."""
    host.journal.record(
        host=host.name,
        kind=kind,
        command=text,
        exit_code=0,
        duration=time.monotonic() - started,
    )


def unreadable(host: str, remote_path: str, error: OSError) -> TransferError:
    """The error of a file that could not be read."""
    return TransferError(
        f"could not read {remote_path}: {error.strerror or error}",
        host=host,
        remedy="check the path and its permissions",
    )


# Probe arguments that carry a secret: masked by name, at any depth.
SECRET_PROBE_ARGS = frozenset({"bearer", "api_key", "token", "password"})
# A text argument longer than this (a config file a probe writes) is journalled as its length:
# the run record keeps such a change as a diff; every other argument is journalled whole.
TEXT_ARG_CHARS = 200


def probe_label(name: str, python: str, args: dict[str, Any] | None) -> str:
    """How the journal shows a probe: its name, interpreter and arguments (secrets masked)."""
    return f"probe {name} ({python} -) args={_short(args)}"


def _short(args: dict[str, Any] | None) -> str:
    return repr({k: _shown_arg(k, v) for k, v in (args or {}).items()})


def _shown_arg(key: str, value: Any) -> Any:
    if key in SECRET_PROBE_ARGS and value:
        return "***"
    if isinstance(value, str) and len(value) > TEXT_ARG_CHARS:
        return f"<{len(value)} characters>"
    if isinstance(value, dict):
        return {k: _shown_arg(str(k), v) for k, v in value.items()}
    if isinstance(value, list):
        return [_shown_arg("", v) for v in value]
    if isinstance(value, tuple):
        return tuple(_shown_arg("", v) for v in value)
    return value
