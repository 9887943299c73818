"""The Ray tier of the rehearsal hosts: ``ray`` from PyPI, installed once, shared by every host.

A deployment that serves one model across nodes (a ``cluster:`` section) needs a real Ray
cluster on its hosts, as vLLM's multi-node serving does. ``opsbook sandbox prepare --ray``
installs ``ray`` (:data:`VERSION`, pinned) into a venv of the system python in the cache that
the real-vLLM tier uses (:func:`opsbook.rehearsal.real_vllm.cache_root`), under a lock, taken as
done
only when its last step wrote ``installed.json``.

A rehearsal host's own python env then sees it through a ``.pth`` file naming the tier's
site-packages, and gets a ``bin/ray`` console script run by its own interpreter: ``ray start``
on that host runs its raylet with that interpreter, so the Ray workers it starts import that
host's own (simulated) ``vllm``, as the nodes of a real cluster do.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from opsbook.core.exceptions import SandboxError
from opsbook.rehearsal import real_vllm

PACKAGE = "ray"
VERSION = "2.58.0"
MARKER = "installed.json"
PTH_NAME = "opsbook-ray.pth"
PIP_TIMEOUT = 900.0
CONSOLE_SCRIPT = """#!{python}
# Written by opsbook: Ray's own command line, run by this env's interpreter.
import sys
from ray.scripts.scripts import main
if __name__ == "__main__":
    sys.exit(main())
"""


@dataclass(frozen=True)
class RayTier:
    """An installed Ray tier.

    Args:
        root: its folder in the cache.
        version: the version ``ray.__version__`` reports.
        install_seconds: how long its install took.
    """

    root: Path
    version: str
    install_seconds: float

    @property
    def venv(self) -> Path:
        return self.root / "venv"

    @property
    def site_packages(self) -> Path:
        return real_vllm._site_packages(self.venv)


def tier_folder(cache: Path | None = None) -> Path:
    return (cache or real_vllm.cache_root()) / f"ray-{VERSION}"


def installed_tier(cache: Path | None = None) -> RayTier | None:
    """The tier when its install finished, else None."""
    root = tier_folder(cache)
    try:
        done = json.loads((root / MARKER).read_text())
    except (OSError, ValueError):
        return None
    if not (root / "venv" / "bin" / "python").exists():
        return None
    return RayTier(root, str(done["version"]), float(done["seconds"]))


def ensure_tier(cache: Path | None = None) -> RayTier:
    """Install the tier unless done before; wait for another install.

    Raises:
        SandboxError: pip or the check failed; the message holds the end of its output.
    """
    root = tier_folder(cache)
    root.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    with real_vllm._lock(root.parent / f".{root.name}.lock"):
        if installed_tier(cache) is None:
            _install(root)
    tier = installed_tier(cache)
    if tier is None:
        raise SandboxError(f"the Ray tier in {root} is incomplete after its install")
    return tier


def link_into(tier: RayTier, venv: Path) -> None:
    """Make ``venv`` (a rehearsal host's env, of the same system python) import the tier's Ray
    and run ``ray`` with its own interpreter."""
    site = real_vllm._site_packages(Path(venv))
    _write(site / PTH_NAME, f"{tier.site_packages}\n", 0o644)
    python = Path(venv) / "bin" / "python"
    _write(Path(venv) / "bin" / "ray", CONSOLE_SCRIPT.format(python=python), 0o755)


def unlink_from(venv: Path) -> None:
    """Undo :func:`link_into` (a host that should not have Ray)."""
    site = real_vllm._site_packages(Path(venv))
    (site / PTH_NAME).unlink(missing_ok=True)
    (Path(venv) / "bin" / "ray").unlink(missing_ok=True)


def _install(root: Path) -> None:
    if root.exists():
        shutil.rmtree(root)
    began = time.monotonic()
    root.mkdir(mode=0o755)
    venv = root / "venv"
    python = str(venv / "bin" / "python")
    system = str(real_vllm.SYSTEM_PYTHON)
    real_vllm._run([system, "-m", "venv", str(venv)], "create the Ray tier's env", 300)
    pip = [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    try:
        done = subprocess.run(
            [*pip, f"{PACKAGE}=={VERSION}"],
            capture_output=True,
            text=True,
            timeout=PIP_TIMEOUT,
            preexec_fn=real_vllm._readable_by_all,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SandboxError(f"could not install {PACKAGE}=={VERSION}: {e}") from None
    if done.returncode != 0:
        raise SandboxError(
            f"`pip install {PACKAGE}=={VERSION}` failed: {real_vllm._last_lines(done.stderr)}",
            remedy="check that PyPI is reachable, then run `opsbook sandbox prepare --ray` again",
        )
    version = _check_ray(python)
    seconds = round(time.monotonic() - began, 1)
    marker = {"package": f"{PACKAGE}=={VERSION}", "version": version, "seconds": seconds}
    real_vllm._write_json(root / MARKER, marker)


def _check_ray(python: str) -> str:
    """Import the installed Ray: the install works only if it imports and names itself."""
    argv = [python, "-c", "import ray; print(ray.__version__)"]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SandboxError(f"could not run the installed Ray: {e}") from None
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines or lines[-1] != VERSION:
        raise SandboxError(
            f"the installed Ray does not import: {real_vllm._last_lines(done.stderr)}",
            remedy="remove the tier's folder and run `opsbook sandbox prepare --ray` again",
        )
    return lines[-1]


def _write(path: Path, text: str, mode: int) -> None:
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temp.write_text(text)
    temp.chmod(mode)
    os.replace(temp, path)


__all__ = ["VERSION", "RayTier", "ensure_tier", "installed_tier", "link_into", "unlink_from"]
