"""The ``configs`` probe's answers (opsbook/remote/probes/configs.py), parsed once where they
are read: config patching (:mod:`opsbook.steps.patch`) and the tests that run the probe read
these types, never the probe's JSON by key.

The probe runs on the host's own python (3.8+, stdlib only) and answers JSON; a key it leaves
out (a file that does not exist has only ``path`` and ``exists``) takes the default here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

Answer = Mapping[str, Any]


@dataclass(frozen=True)
class FileStatus:
    """One file as the probe saw it: its status, hash and (for a config file) its text;
    ``error`` says why what is missing could not be read."""

    path: str
    exists: bool
    size: int | None = None
    mode: int | None = None
    uid: int | None = None
    gid: int | None = None
    sha256: str | None = None
    text: str | None = None
    error: str | None = None

    @classmethod
    def parse(cls, answer: Answer) -> FileStatus:
        return cls(
            path=str(answer.get("path") or ""),
            exists=bool(answer.get("exists")),
            size=answer.get("size"),
            mode=answer.get("mode"),
            uid=answer.get("uid"),
            gid=answer.get("gid"),
            sha256=answer.get("sha256"),
            text=answer.get("text"),
            error=answer.get("error"),
        )


def _statuses(answer: Any) -> dict[str, FileStatus]:
    return {str(name): FileStatus.parse(s) for name, s in (answer or {}).items()}


@dataclass(frozen=True)
class WeightsOnDisk:
    """The ``*.safetensors`` files of the folder: how many, and their bytes added up."""

    shards: int = 0
    bytes: int = 0

    @classmethod
    def parse(cls, answer: Answer | None) -> WeightsOnDisk | None:
        if answer is None:
            return None
        return cls(int(answer.get("shards", 0)), int(answer.get("bytes", 0)))


@dataclass(frozen=True)
class ConfigState:
    """The answer of ``read`` (and the ``state`` after ``apply`` and ``restore``): the config
    files and their backups; ``weights`` only when asked for."""

    dir: str
    exists: bool
    files: dict[str, FileStatus] = field(default_factory=dict)
    backups: dict[str, FileStatus] = field(default_factory=dict)
    weights: WeightsOnDisk | None = None

    @classmethod
    def parse(cls, answer: Answer) -> ConfigState:
        return cls(
            dir=str(answer.get("dir") or ""),
            exists=bool(answer.get("exists")),
            files=_statuses(answer.get("files")),
            backups=_statuses(answer.get("backups")),
            weights=WeightsOnDisk.parse(answer.get("weights")),
        )

    def texts(self) -> dict[str, str]:
        """File name to text, of the files read as text."""
        return {name: s.text for name, s in self.files.items() if s.text is not None}


@dataclass(frozen=True)
class WriteAction:
    """What ``apply`` did to one file: written or not (and why), its backup ``created`` or
    ``kept``, and where the file as it was was kept when it differed from that backup."""

    written: bool = False
    backup: str | None = None
    owner_kept: bool | None = None
    second_backup: str | None = None
    error: str | None = None

    @classmethod
    def parse(cls, answer: Answer) -> WriteAction:
        return cls(
            written=bool(answer.get("written")),
            backup=answer.get("backup"),
            owner_kept=answer.get("owner_kept"),
            second_backup=answer.get("second_backup"),
            error=answer.get("error"),
        )


@dataclass(frozen=True)
class ApplyAnswer:
    """The answer of ``apply``: nothing is written when a file changed since the plan
    (``conflicts``) or is a symbolic link (``symlinks``: name to target)."""

    ok: bool
    state: ConfigState
    conflicts: list[str] = field(default_factory=list)
    symlinks: dict[str, str] = field(default_factory=dict)
    actions: dict[str, WriteAction] = field(default_factory=dict)

    @classmethod
    def parse(cls, answer: Answer) -> ApplyAnswer:
        return cls(
            ok=bool(answer.get("ok", False)),
            state=ConfigState.parse(answer["state"]),
            conflicts=[str(n) for n in answer.get("conflicts") or []],
            symlinks={str(n): str(t) for n, t in (answer.get("symlinks") or {}).items()},
            actions={str(n): WriteAction.parse(a) for n, a in answer["actions"].items()},
        )

    def action(self, name: str) -> WriteAction:
        """What was done to ``name``; a file the probe did not reach was not written."""
        return self.actions.get(name, WriteAction())


@dataclass(frozen=True)
class RestoreAction:
    """What ``restore`` did to one file: ``restored``, ``already`` (the original),
    ``no-backup`` or ``failed`` (with the error)."""

    status: str
    owner_kept: bool | None = None
    error: str | None = None

    @classmethod
    def parse(cls, answer: Answer) -> RestoreAction:
        return cls(str(answer["status"]), answer.get("owner_kept"), answer.get("error"))


@dataclass(frozen=True)
class RestoreAnswer:
    """The answer of ``restore``."""

    ok: bool
    state: ConfigState
    actions: dict[str, RestoreAction] = field(default_factory=dict)

    @classmethod
    def parse(cls, answer: Answer) -> RestoreAnswer:
        return cls(
            ok=bool(answer.get("ok", False)),
            state=ConfigState.parse(answer["state"]),
            actions={str(n): RestoreAction.parse(a) for n, a in answer["actions"].items()},
        )


__all__ = [
    "ApplyAnswer",
    "ConfigState",
    "FileStatus",
    "RestoreAction",
    "RestoreAnswer",
    "WeightsOnDisk",
    "WriteAction",
]
