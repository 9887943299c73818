"""What a notebook's form needs to meet a new operator: where a relative deployment path is
found when JupyterLab runs the kernel, what to do when there is none, and which override keys a
deployment file has (with the nearest one to a typo).

JupyterLab starts each kernel in its notebook's folder (``jupyter_server``'s
``cwd_for_path``), while an operator who typed ``OPSBOOK_DEPLOYMENT=deployments/x.yml jupyter
lab`` means the folder they started it from. The kernel inherits the server's environment
(``SessionManager.get_kernel_env`` passes ``os.environ`` on) and ``jupyter_client``'s launcher
adds ``JPY_PARENT_PID``, the server's PID, whose working folder Linux shows at
``/proc/PID/cwd``; the shell's ``PWD``, inherited the same way, is the fallback.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from opsbook.core.channel import DEPLOYMENT_ENV
from opsbook.core.deployment_text import reference_rows

# What the guidance shows as the shape of a deployment path.
EXAMPLE_PATH = "deployments/fleet-example.yml"


@dataclass(frozen=True)
class Located:
    """Where a deployment path was looked for, and the file found (None: none of them)."""

    given: str
    tried: tuple[str, ...]
    found: str | None
    from_env: bool = False

    @property
    def missing(self) -> bool:
        return self.found is None


def server_start_dirs(
    environ: Mapping[str, str] | None = None,
    cwd_of: Callable[[str], str] | None = None,
) -> list[Path]:
    """The folder(s) JupyterLab was started from, most reliable first: the server process's
    working folder, then the ``PWD`` it was started with."""
    env = os.environ if environ is None else environ
    read_cwd = cwd_of or (lambda pid: os.readlink(f"/proc/{pid}/cwd"))
    found: list[Path] = []
    pid = env.get("JPY_PARENT_PID", "")
    if pid.isdigit():
        try:
            found.append(Path(read_cwd(pid)))
        except OSError:
            pass  # another OS, or the server is gone: PWD below is all there is
    if env.get("PWD"):
        found.append(Path(env["PWD"]))
    return list(dict.fromkeys(found))


def locate_deployment(
    given: str,
    *,
    from_env: bool,
    start_dirs: list[Path],
    notebook_dir: Path,
) -> Located:
    """Find the deployment file ``given`` names.

    An absolute path, or a relative one that is the notebook's parameter, is read as it is
    (relative to the notebook's folder). A relative ``OPSBOOK_DEPLOYMENT`` is looked for in
    the folder(s) JupyterLab was started from first, then in the notebook's folder and its
    parents.
    """
    path = Path(given).expanduser()
    if path.is_absolute():
        candidates = [path]
    elif from_env:
        bases = [*start_dirs, notebook_dir, *notebook_dir.parents]
        candidates = [base / path for base in dict.fromkeys(bases)]
    else:
        candidates = [notebook_dir / path]
    tried: list[str] = []
    for candidate in candidates:
        tried.append(str(candidate))
        if candidate.is_file():
            return Located(given, tuple(tried), str(candidate), from_env)
    return Located(given, tuple(tried), None, from_env)


def what_to_do(located: Located) -> str:
    """The guidance for a deployment that was not found: what was looked for, where, and how
    to name one."""
    source = (
        f"{DEPLOYMENT_ENV}={located.given}" if located.from_env else f"deployment={located.given!r}"
    )
    if not located.given:
        source = "no deployment given"
    tried = "".join(f"\n  {path}" for path in located.tried)
    looked = f": looked for{tried}" if tried else ""
    return (
        f"No deployment file found ({source}){looked}\n"
        f"Pick one above and run the cells below, or name yours: start JupyterLab with "
        f"{DEPLOYMENT_ENV}=/path/to/deployment.yml (a relative path is read from the folder "
        f"JupyterLab is started in, e.g. {DEPLOYMENT_ENV}={EXAMPLE_PATH}), or set the "
        f"notebook's `deployment` parameter (`opsbook run ... -p deployment {EXAMPLE_PATH}`). "
        f"`make demo` starts a rehearsal host and writes .sandbox/demo/deployment.yml."
    )


def override_keys() -> tuple[list[str], list[str]]:
    """The dotted keys an override may name, and those that hold a free mapping (any key
    under ``server.args`` or ``server.env`` is an override of its own)."""
    rows = [key for key, *_ in reference_rows() if "[" not in key]
    free = [
        key
        for key, kind, *_ in reference_rows()
        if kind == "mapping" and not any(other.startswith(key + ".") for other in rows)
    ]
    return rows, free


def unknown_override(key: str) -> str:
    """Why ``key`` is not a deployment key, naming the nearest one ("" when it is one)."""
    keys, free = override_keys()
    if key in keys or any(key.startswith(prefix + ".") for prefix in free):
        return ""
    close = difflib.get_close_matches(key, keys, n=1, cutoff=0.5)
    hint = f"; did you mean {close[0]!r}?" if close else f"; the keys are {', '.join(keys)}"
    return f"{key!r} is not a deployment key{hint}"
