"""Rehearsal hosts shared by the integration tests: a real sshd on loopback, started once."""

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from opsbook.rehearsal import sandbox as sandboxes
from opsbook.rehearsal.sandbox import Sandbox


def sandbox_folder(label: str) -> Path:
    """A fresh folder under /tmp: the sandbox user must be able to enter every parent."""
    folder = Path(tempfile.mkdtemp(prefix=f"opsbook-{label}-", dir="/tmp"))
    # The sandbox keeps an existing folder's mode: the test opens its own folder.
    folder.chmod(0o755)
    return folder


@contextlib.contextmanager
def rehearsal_host(label: str, **options: Any) -> Iterator[Sandbox]:
    """A rehearsal host of its own in a fresh folder (``opsbook.rehearsal.sandbox.up`` options),
    stopped
    and removed afterwards."""
    folder = sandbox_folder(label)
    try:
        yield sandboxes.up(folder, **options)
    finally:
        sandboxes.down(folder)
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session")
def sandbox() -> Iterator[Sandbox]:
    """The default rehearsal host: zsh login shell, 8 simulated RTX PRO 6000, the checkpoint."""
    with rehearsal_host("zsh") as box:
        yield box


@pytest.fixture(scope="session")
def bash_sandbox() -> Iterator[Sandbox]:
    """A second rehearsal host at the same time, on another address, with a bash login shell."""
    with rehearsal_host("bash", address="127.0.0.3", shell="bash", checkpoint=False) as box:
        yield box
