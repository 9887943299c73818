"""The one exception tree of opsbook.

Every error says what was wrong, where, and what to do about it. Third-party errors
(paramiko, socket, papermill) are translated into these at the boundary that meets them.

    OpsbookError
    ├── DeploymentError          a deployment file or parameter is wrong
    ├── HostError                something about reaching or using a host
    │   ├── HostUnreachable      the host could not be reached at all
    │   │   ├── ConnectionRefused
    │   │   ├── UnknownHostName
    │   │   └── ConnectTimeout
    │   ├── AuthenticationFailed
    │   ├── HostKeyError
    │   │   ├── HostKeyUnknown
    │   │   └── HostKeyChanged
    │   ├── CommandTimeout
    │   ├── ProbeError
    │   ├── TransferError
    │   └── HostLocked           another deploy run holds the host (exit 5)
    ├── SandboxError             the rehearsal host could not be started or stopped
    │   └── SandboxFolderRefused the folder given is not one the sandbox may use (exit 2)
    ├── RunError                 a notebook run could not be carried out
    ├── RunbookError             the runbook's notebooks could not be found or copied
    │   └── RunbookCopyRefused   the folder holds changed copies of them, or is no folder (exit 2)
    └── LogError                 a log given to diagnose is not a readable text log
"""

from __future__ import annotations


class OpsbookError(Exception):
    """Base of every error opsbook raises.

    Args:
        message: what was wrong.
        host: the host it concerns, if any.
        remedy: what to do about it.
    """

    def __init__(self, message: str, *, host: str | None = None, remedy: str | None = None):
        self.message = message
        self.host = host
        self.remedy = remedy
        super().__init__(message)

    def __str__(self) -> str:
        where = f"[{self.host}] " if self.host else ""
        fix = f"\n  remedy: {self.remedy}" if self.remedy else ""
        return f"{where}{self.message}{fix}"

    def __reduce__(self) -> tuple[object, ...]:
        # Keyword-only arguments do not survive the default pickling of exceptions.
        return (_rebuild, (type(self), self.message, self.host, self.remedy, self.__dict__))


def _rebuild(
    cls: type[OpsbookError],
    message: str,
    host: str | None,
    remedy: str | None,
    state: dict[str, object],
) -> OpsbookError:
    error = cls.__new__(cls)
    OpsbookError.__init__(error, message, host=host, remedy=remedy)
    error.__dict__.update(state)
    return error


class DeploymentError(OpsbookError):
    """A deployment file or a parameter is missing or wrong."""


class HostError(OpsbookError):
    """Something went wrong reaching or using a host."""


class HostUnreachable(HostError):
    """The host could not be reached at all."""


class ConnectionRefused(HostUnreachable):
    """Nothing listens on the host's SSH port."""


class UnknownHostName(HostUnreachable):
    """The host name does not resolve."""


class ConnectTimeout(HostUnreachable):
    """The host did not answer within the connect timeout."""


class AuthenticationFailed(HostError):
    """The host refused the user's key."""


class HostKeyError(HostError):
    """The host's key could not be trusted."""

    def __init__(
        self,
        message: str,
        *,
        host: str | None = None,
        remedy: str | None = None,
        fingerprint: str = "",
    ):
        super().__init__(message, host=host, remedy=remedy)
        self.fingerprint = fingerprint


class HostKeyUnknown(HostKeyError):
    """The host's key is not in known_hosts."""


class HostKeyChanged(HostKeyError):
    """The host's key differs from the one in known_hosts: possibly a different machine."""


class CommandTimeout(HostError):
    """A remote command ran longer than its timeout and was stopped."""

    def __init__(
        self,
        message: str,
        *,
        host: str | None = None,
        remedy: str | None = None,
        timeout: float = 0.0,
    ):
        super().__init__(message, host=host, remedy=remedy)
        self.timeout = timeout


class ProbeError(HostError):
    """A probe program failed on the host or did not answer JSON."""

    def __init__(
        self,
        message: str,
        *,
        host: str | None = None,
        remedy: str | None = None,
        stderr: str = "",
    ):
        super().__init__(message, host=host, remedy=remedy)
        self.stderr = stderr


class TransferError(HostError):
    """An SFTP upload or download failed."""


class HostLocked(HostError):
    """Another ``opsbook run deploy`` holds the host's deploy lock."""


class SandboxError(OpsbookError):
    """The rehearsal host could not be started, checked or stopped."""


class SandboxFolderRefused(SandboxError):
    """The folder given to ``sandbox up`` holds someone else's files, or its mode would have
    to change for the sandbox user to enter it: bad input, nothing was touched."""


class SandboxRequestRefused(SandboxError):
    """What ``sandbox up`` was asked for cannot be (an address off loopback, a port out of
    range, a shell or GPU profile not offered, a folder path it cannot quote): bad input,
    refused before anything was made."""


class RunError(OpsbookError):
    """A notebook run could not be carried out."""


class RunbookError(OpsbookError):
    """The runbook's notebooks could not be found in the package, or copied out of it."""


class RunbookCopyRefused(RunbookError):
    """The folder given to ``runbook copy`` holds notebooks changed from the runbook's, or is
    not a folder: bad input, nothing was copied."""


class LogError(OpsbookError):
    """A log given to diagnose cannot be read as a text log (unreadable, binary, endless)."""
