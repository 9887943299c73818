"""Install the simulated ``vllm`` package into a python env of the rehearsal host.

The package (``opsbook/rehearsal/sim/vllm``) is copied into the env's site-packages together with
``simgpu.py`` (as ``vllm/_simgpu.py``, so that it never imports opsbook) and a facts sheet per
release read (``vllm/_facts/<release>.json``, from :mod:`opsbook.knowledge.vllm_facts`: the serve
flags,
KV-cache dtypes, attention backends and MLA priority lists of that release's wheel), a
``bin/vllm`` console script is written with the env's interpreter as shebang, and the simulation
settings go to ``<venv>/opsbook-vllm-sim.json``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

from opsbook.knowledge import metric_names, vllm_facts

SIM_SOURCES = Path(__file__).resolve().parent
PACKAGE_SOURCE = SIM_SOURCES / "vllm"
SIMGPU_SOURCE = SIM_SOURCES / "simgpu.py"
SETTINGS_NAME = "opsbook-vllm-sim.json"
FACTS_DIR = "_facts"
# The release the rehearsal host plays unless told otherwise: the incident's.
DEFAULT_VERSION = "0.15.1"
CONSOLE_SCRIPT = """#!{python}
# -*- coding: utf-8 -*-
import re
import sys
from vllm.entrypoints.cli.main import main
if __name__ == "__main__":
    sys.argv[0] = re.sub(r"(-script\\.pyw|\\.exe)?$", "", sys.argv[0])
    sys.exit(main())
"""


def install_vllm(
    venv: Path, *, version: str = DEFAULT_VERSION, startup_seconds: float = 3.0
) -> None:
    """Put the simulated vLLM into ``venv`` (replacing an earlier copy) and set its settings.

    Args:
        venv: the env's root (holds ``bin/python``).
        version: the vLLM version the simulation plays (``vllm.__version__``).
        startup_seconds: how long a successful start takes, spread over its phases.

    Raises:
        FileNotFoundError: ``venv`` has no ``bin/python``.
        RuntimeError: the env's site-packages folder cannot be found.
    """
    venv = Path(venv)
    python = venv / "bin" / "python"
    if not python.exists():
        raise FileNotFoundError(f"{python} does not exist; create the env first")
    target = site_packages(venv) / "vllm"
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(PACKAGE_SOURCE, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    shutil.copyfile(SIMGPU_SOURCE, target / "_simgpu.py")
    write_facts_sheets(target / FACTS_DIR)
    _write(venv / "bin" / "vllm", CONSOLE_SCRIPT.format(python=python), 0o755)
    _write_dist_info(target.parent, version)
    settings = {"version": version, "startup_seconds": float(startup_seconds), "fault": None}
    _write(venv / SETTINGS_NAME, json.dumps(settings, indent=2) + "\n", 0o644)


def write_facts_sheets(folder: Path) -> list[str]:
    """One facts sheet per release read into ``folder`` (replacing what was there).

    Returns:
        The releases written.
    """
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir()
    for release in vllm_facts.releases():
        sheet = facts_sheet(vllm_facts.load(release))
        _write(folder / f"{release}.json", json.dumps(sheet, sort_keys=True) + "\n", 0o644)
    return list(vllm_facts.releases())


def facts_sheet(facts: vllm_facts.ReleaseFacts) -> dict[str, Any]:
    """What the simulation needs of one release's facts.

    Returns:
        ``{"release", "serve_flags", "kv_cache_dtypes", "backends", "mla_priorities",
        "metric_names", "env_vars"}``.
    """
    backends = {
        name: {
            "kv_cache_dtypes": None if b.kv_cache_dtypes is None else list(b.kv_cache_dtypes),
            "compute_capabilities": (
                None if b.compute_capabilities is None else list(b.compute_capabilities)
            ),
            "mla": b.mla,
            "sparse": b.sparse,
        }
        for name, b in facts.backends.items()
    }
    priorities = []
    for cc in vllm_facts.EVALUATED:
        for kv in (vllm_facts.UNQUANTIZED_KV, vllm_facts.QUANTIZED_KV):
            listed = facts.priority(cc, True, kv, num_heads=128, head_size=576)
            if listed is not None:
                priorities.append(
                    {
                        "compute_capability": cc,
                        "quantized_kv": kv != vllm_facts.UNQUANTIZED_KV,
                        "backends": list(listed),
                    }
                )
    return {
        "release": facts.version,
        "serve_flags": sorted(facts.serve_flags),
        "kv_cache_dtypes": list(facts.cache_dtypes),
        "backends": backends,
        "mla_priorities": priorities,
        "metric_names": metric_names.as_dict(metric_names.for_release(facts.version)),
        "env_vars": sorted(facts.env_vars),
    }


def install_beside(venv: Path, beside: Path, *, version: str, **settings: Any) -> Path:
    """A second env on the same rehearsal host, playing another release: what an operator
    prepares before an upgrade (07_upgrade's ``to``), next to the deployment's env ``beside``.

    Made with ``beside``'s interpreter (``-m venv --without-pip``), seeing the same simulated
    GPUs (its marker), owned by ``beside``'s owner.

    Args:
        venv: the new env's root.
        beside: the rehearsal host's env (``Sandbox.venv``).
        version: the release the new env plays.
        settings: more simulation settings (``slowdown``, ``token_seconds``, ``startup_seconds``,
            ``fault``), as in ``opsbook-vllm-sim.json``.

    Returns:
        The new env's interpreter.
    """
    venv = Path(venv)
    if not (venv / "bin" / "python").exists():
        subprocess.run(
            [str(Path(beside) / "bin" / "python"), "-m", "venv", "--without-pip", str(venv)],
            check=True,
            capture_output=True,
            timeout=300,
        )
    marker = Path(beside) / simgpu_marker()
    if marker.exists():
        shutil.copyfile(marker, venv / marker.name)
    install_vllm(venv, version=version, startup_seconds=float(settings.pop("startup_seconds", 3)))
    stored = json.loads((venv / SETTINGS_NAME).read_text())
    _write(venv / SETTINGS_NAME, json.dumps({**stored, **settings}, indent=2) + "\n", 0o644)
    _chown_like(venv, Path(beside))
    return venv / "bin" / "python"


def simgpu_marker() -> str:
    """The name of the file that tells an env's simulated tools where the GPUs live."""
    from opsbook.rehearsal.sim.simgpu import VENV_MARKER

    return VENV_MARKER


def _chown_like(tree: Path, model: Path) -> None:
    owner = model.stat()
    if os.geteuid() != 0 or (owner.st_uid, owner.st_gid) == (os.geteuid(), os.getegid()):
        return
    for path in [tree, *tree.rglob("*")]:
        os.chown(path, owner.st_uid, owner.st_gid, follow_symlinks=False)


def _write_dist_info(site: Path, version: str) -> None:
    # A pip-installed vLLM has package metadata; probes read the version from it without
    # importing vllm (which takes seconds on a real install).
    for old in site.glob("vllm-*.dist-info"):
        shutil.rmtree(old)
    info = site / f"vllm-{version}.dist-info"
    info.mkdir()
    _write(info / "METADATA", f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n", 0o644)
    _write(info / "INSTALLER", "opsbook-sandbox\n", 0o644)


def site_packages(venv: Path) -> Path:
    """The ``lib/pythonX.Y/site-packages`` folder of an env.

    Raises:
        RuntimeError: none, or several without the env's python able to say which.
    """
    found = sorted(Path(venv).glob("lib/python3.*/site-packages"))
    if len(found) == 1:
        return found[0]
    answer = subprocess.run(
        [
            str(Path(venv) / "bin" / "python"),
            "-c",
            "import sysconfig; print(sysconfig.get_paths()['purelib'])",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    path = Path(answer.stdout.strip())
    if answer.returncode != 0 or not path.is_dir():
        raise RuntimeError(f"cannot find the site-packages of {venv}: {answer.stderr.strip()}")
    return path


def _write(path: Path, text: str, mode: int) -> None:
    """Write atomically, so a launch never reads half a file."""
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temp.write_text(text)
    os.chmod(temp, mode)
    os.replace(temp, path)
