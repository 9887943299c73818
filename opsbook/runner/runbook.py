"""The runbook's notebooks as the package holds them, and a copy of them in a folder of the
user's to step through in JupyterLab.

The notebooks live in the repository's top-level ``notebooks/``; ``opsbook/notebooks`` links to
it, so that the wheel ships them as package data of ``opsbook`` and a checkout, an editable
install and an installed wheel all find them at the same place in the package.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from opsbook.core.exceptions import RunbookCopyRefused, RunbookError


def notebooks_dir() -> Path:
    """The folder of the runbook's notebooks (in a checkout: its ``notebooks/``).

    Raises:
        RunbookError: the package is not installed as files on disk.
    """
    folder = resources.files("opsbook").joinpath("notebooks")
    # papermill and the kernel work on real files, which every pip install gives; the link of
    # a checkout resolves to its notebooks/, the folder named in run records until now.
    if not isinstance(folder, Path):
        raise RunbookError(
            f"opsbook's notebooks are not files on disk ({folder})",
            remedy="install opsbook with pip (a wheel, or `pip install -e .` in a checkout)",
        )
    return folder.resolve()


def notebooks() -> list[Path]:
    """The runbook's notebooks, in stage order.

    Raises:
        RunbookError: the package holds none.
    """
    folder = notebooks_dir()
    found = sorted(folder.glob("*.ipynb"))
    if not found:
        raise RunbookError(
            f"the runbook's notebooks are missing from {folder}",
            remedy="reinstall opsbook from a wheel built from the repository",
        )
    return found


@dataclass(frozen=True)
class RunbookCopy:
    """What :func:`copy_runbook` did, by notebook file name."""

    folder: Path
    copied: tuple[str, ...]
    replaced: tuple[str, ...]
    unchanged: tuple[str, ...]


def copy_runbook(folder: Path, *, force: bool = False) -> RunbookCopy:
    """Copy the runbook's notebooks into ``folder`` (made when missing). A notebook already
    there unchanged is left alone; one that differs is the user's work: it is replaced only
    with ``force``. Other files in the folder are never touched.

    Raises:
        RunbookCopyRefused: ``folder`` is not a folder, holds a folder (or the like) under a
            notebook's name, or holds changed copies and ``force`` is not given; nothing was
            copied.
        RunbookError: the package holds no notebooks, or a copy could not be written.
    """
    sources = notebooks()
    if folder.exists() and not folder.is_dir():
        raise RunbookCopyRefused(
            f"{folder} is not a folder", remedy="give a folder; it is made when missing"
        )
    in_the_way = [nb.name for nb in sources if _not_a_file(folder / nb.name)]
    if in_the_way:
        raise RunbookCopyRefused(
            f"{folder} holds {', '.join(in_the_way)} as something else than a file: "
            "nothing was copied",
            remedy="move it away, or copy into another folder",
        )
    changed = [nb.name for nb in sources if _changed_copy(nb, folder / nb.name)]
    if changed and not force:
        raise RunbookCopyRefused(
            f"{folder} holds changed copies of {', '.join(changed)}: nothing was copied",
            remedy="keep your changes under other names, or copy with --force to replace them",
        )
    copied: list[str] = []
    replaced: list[str] = []
    unchanged: list[str] = []
    for nb in sources:
        if (folder / nb.name).exists():
            if nb.name not in changed:
                unchanged.append(nb.name)
                continue
            replaced.append(nb.name)
        else:
            copied.append(nb.name)
        _write_copy(nb, folder)
    return RunbookCopy(folder, tuple(copied), tuple(replaced), tuple(unchanged))


def _not_a_file(path: Path) -> bool:
    return path.exists() and not path.is_file()


def _changed_copy(source: Path, copy: Path) -> bool:
    return copy.is_file() and copy.read_bytes() != source.read_bytes()


def _write_copy(source: Path, folder: Path) -> None:
    """Write ``source`` into ``folder`` with the user's own file mode (the installed one may be
    read-only), or say why it could not be."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, folder / source.name)
    except OSError as e:
        raise RunbookError(
            f"could not copy {source.name} into {folder}: {e.strerror or e}",
            remedy="give a folder you can write to",
        ) from e
