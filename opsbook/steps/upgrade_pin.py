"""After an upgrade passed: pin the engine in the deployment file (``engine:`` with the
version and the interpreter), so that the next deploy launches what was qualified.

The file is edited as text, so that its comments and order stay: the top-level ``python:``
line and any ``engine:`` block are replaced by one ``engine:`` block at the end. The file as
it was is first copied beside it (``<name>.before-upgrade-<UTC time>``, never overwritten),
the new text is checked by the deployment schema, then put in place with a rename.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from opsbook.core.deployment import load_deployment
from opsbook.core.exceptions import DeploymentError

BACKUP_INFIX = ".before-upgrade-"
PIN_COMMENT = "# Pinned by 07_upgrade: the engine it qualified (its python is the deployment's)."
_TOP_PYTHON = re.compile(r"^python\s*:.*$")
_TOP_ENGINE = re.compile(r"^engine\s*:")
# A line that begins a top-level key (not indented, not a comment, not a list's item).
_TOP_KEY = re.compile(r"^[^\s#-]")


@dataclass(frozen=True)
class Pinned:
    """The deployment file pinned, and where the file as it was is kept."""

    path: Path
    backup: Path
    version: str
    python: str


def pinned_text(text: str, version: str, python: str) -> str:
    """``text`` with its top-level ``python:`` line and ``engine:`` block replaced by an
    ``engine:`` block pinning ``version`` and ``python``."""
    kept: list[str] = []
    in_engine = False
    for line in text.splitlines():
        if in_engine and (not line.strip() or not _TOP_KEY.match(line)):
            continue
        in_engine = bool(_TOP_ENGINE.match(line))
        if in_engine or _TOP_PYTHON.match(line) or line == PIN_COMMENT:
            continue
        kept.append(line)
    while kept and not kept[-1].strip():
        kept.pop()
    block = [
        PIN_COMMENT,
        "engine:",
        f"  version: {_quoted(version)}",
        f"  python: {_quoted(python)}",
    ]
    return "\n".join([*kept, *block]) + "\n"


def _quoted(value: str) -> str:
    # JSON's string is YAML's double-quoted scalar: a version never reads as a number.
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def pin_engine(path: Path, version: str, python: str, *, now: datetime | None = None) -> Pinned:
    """Pin ``version`` and ``python`` in the deployment file at ``path``.

    Raises:
        DeploymentError: the file cannot be read or written, or the pinned text would not
            be a deployment this engine launches (nothing is changed then).
    """
    text = path.read_text(encoding="utf-8")
    new = pinned_text(text, version, python)
    stamp = (now or datetime.now(timezone.utc)).strftime("%Y%m%dT%H%M%SZ")
    temporary = path.with_name(f".{path.name}.{os.getpid()}.pinning")
    try:
        temporary.write_text(new, encoding="utf-8")
        shutil.copymode(path, temporary)
        checked = load_deployment(temporary)
        if (checked.python, checked.engine_version) != (python, version):
            raise DeploymentError(
                f"{path}: pinned, it would launch {checked.python} (engine "
                f"{checked.engine_version}), not {python} ({version})",
                remedy=f"a host's vars set python: pin by hand (engine: {{version: {version}, "
                f"python: {python}}})",
            )
        backup = _free_backup(path, stamp)
        shutil.copy2(path, backup)
        os.replace(temporary, path)
    except OSError as e:
        raise DeploymentError(
            f"could not pin the engine in {path}: {e.strerror or e}",
            remedy="check the file's folder is writable",
        ) from None
    finally:
        temporary.unlink(missing_ok=True)
    return Pinned(path, backup, version, python)


def _free_backup(path: Path, stamp: str) -> Path:
    backup = path.with_name(f"{path.name}{BACKUP_INFIX}{stamp}")
    n = 1
    while backup.exists():
        n += 1
        backup = path.with_name(f"{path.name}{BACKUP_INFIX}{stamp}-{n}")
    return backup
