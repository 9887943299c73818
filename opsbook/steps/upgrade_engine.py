"""The new engine of an upgrade: the env beside the old one, what it holds, and whether its
torch and CUDA packages belong together.

The env is one the operator prepared (its interpreter's path), or one opsbook creates there
with ``python3 -m venv`` and ``pip install`` of the source the operator names (a requirement
such as ``vllm==0.18.0``, a wheel's path on the host, an index URL's package). Nothing of
the old env is touched: the old server keeps running until the upgrade's stop.
"""

from __future__ import annotations

import posixpath
import re
import shlex
from dataclasses import dataclass, field
from typing import Any

from opsbook.core.exceptions import ProbeError
from opsbook.core.results import Finding, Result
from opsbook.remote.protocol import RemoteHost

PROBE = "engine_install"
# pip resolving and downloading vLLM and torch: minutes, and many more on a slow mirror.
INSTALL_TIMEOUT = 3600.0
# torch's local version names its CUDA build: 2.9.0+cu128 is CUDA 12.8.
TORCH_CUDA = re.compile(r"\+cu(\d+)$")
# NVIDIA's PyPI packages name their CUDA major: nvidia-cublas-cu12, nvidia-cuda-runtime-cu13.
PACKAGE_CUDA = re.compile(r"-cu(\d+)$")
# vLLM pins the torch it was built against in its metadata: "torch==2.9.0" (vLLM's
# requirements/cuda.txt, carried into the wheel's METADATA as Requires-Dist).
TORCH_PIN = re.compile(r"^torch\s*==\s*([0-9][0-9a-z.+]*)", re.I)


@dataclass(frozen=True)
class EngineInstall:
    """An env's engine as its interpreter reads its packages' metadata.

    Attributes:
        python: the interpreter asked (as given).
        executable: what it runs as (``sys.executable``).
        python_version: its Python, ``3.11.7``.
        vllm: vLLM's version (None: not installed).
        torch: torch's version (None: not installed).
        vllm_requires: what vLLM's metadata requires of torch (``torch==2.9.0``).
        cuda_packages: NVIDIA's CUDA packages installed, with their versions.
        freeze_digest: a digest of every package and version (``pip freeze``'s content).
    """

    python: str
    executable: str = ""
    python_version: str = ""
    vllm: str | None = None
    torch: str | None = None
    vllm_requires: tuple[str, ...] = ()
    cuda_packages: dict[str, str] = field(default_factory=dict)
    freeze_digest: str | None = None

    @classmethod
    def parse(cls, python: str, answer: dict[str, Any]) -> EngineInstall:
        return cls(
            python=python,
            executable=str(answer.get("executable") or ""),
            python_version=str(answer.get("python") or ""),
            vllm=answer.get("vllm"),
            torch=answer.get("torch"),
            vllm_requires=tuple(str(r) for r in answer.get("vllm_requires") or ()),
            cuda_packages={str(k): str(v) for k, v in (answer.get("cuda_packages") or {}).items()},
            freeze_digest=answer.get("freeze_digest"),
        )


def read_engine(host: RemoteHost, python: str) -> EngineInstall | None:
    """What the env of ``python`` holds; None when that interpreter does not run."""
    try:
        return EngineInstall.parse(python, host.probe(PROBE, {}, python=python))
    except ProbeError:
        return None


def mixed_install_findings(engine: EngineInstall) -> list[Finding]:
    """Errors for an env whose vLLM, torch and CUDA packages were not built together: a torch
    other than the one vLLM's metadata pins, or CUDA packages of more than one CUDA major
    (vLLM 0.16.0 on torch 2.10 is the issue's example: such an env fails at import or at
    the first kernel, after the old server was stopped)."""
    findings = []
    pinned = next((m.group(1) for r in engine.vllm_requires if (m := TORCH_PIN.match(r))), None)
    if pinned and engine.torch and _base(engine.torch) != _base(pinned):
        findings.append(
            Finding(
                "error",
                "torch",
                f"vLLM {engine.vllm} requires torch=={pinned} (its wheel's metadata) but the "
                f"env has torch {engine.torch}",
                f"install the torch vLLM {engine.vllm} pins: {engine.python} -m pip install "
                f"'torch=={pinned}' (or a fresh env: pip install vllm=={engine.vllm})",
                source=f"vLLM {engine.vllm} METADATA Requires-Dist",
            )
        )
    if pinned is None and engine.vllm and not engine.torch:
        findings.append(
            Finding(
                "warning",
                "torch",
                f"the env has vLLM {engine.vllm} without torch",
                "install vLLM with its dependencies (pip install vllm without --no-deps)",
            )
        )
    majors = cuda_majors(engine)
    if len(majors) > 1:
        said = "; ".join(f"CUDA {m}: {', '.join(names)}" for m, names in sorted(majors.items()))
        findings.append(
            Finding(
                "error",
                "CUDA",
                f"the env mixes CUDA builds ({said})",
                "install vLLM into a fresh env so that pip picks one CUDA build for all",
                source="wheel tags of torch and the nvidia-* packages",
            )
        )
    return findings


def cuda_majors(engine: EngineInstall) -> dict[str, list[str]]:
    """Each CUDA major the env's packages are built for, with the packages saying so."""
    found: dict[str, list[str]] = {}
    torch_cuda = TORCH_CUDA.search(engine.torch or "")
    if torch_cuda:
        found.setdefault(torch_cuda.group(1)[:-1], []).append(f"torch {engine.torch}")
    for name in engine.cuda_packages:
        tagged = PACKAGE_CUDA.search(name)
        if tagged:
            found.setdefault(tagged.group(1), []).append(name)
    return found


def _base(version: str) -> str:
    return version.split("+")[0]


def venv_of(python: str) -> str:
    """The env an interpreter path belongs to (``/opt/v18/bin/python`` -> ``/opt/v18``).

    Raises:
        ValueError: the path is not ``<env>/bin/<python>``.
    """
    folder, name = posixpath.split(python)
    if posixpath.basename(folder) != "bin" or not name.startswith("python"):
        raise ValueError(f"{python} is not an env's interpreter (<env>/bin/python)")
    return posixpath.dirname(folder)


def create_engine(host: RemoteHost, python: str, source: str, base: str = "python3") -> Result:
    """Create the env ``python`` belongs to with ``base``'s venv, and pip-install ``source``
    into it (an existing env is installed into again: pip says what it changed).

    Returns:
        ok with pip's last line, or not ok with its error.
    """
    venv = venv_of(python)
    made = host.run(
        f"{shlex.quote(base)} -m venv -- {shlex.quote(venv)}",
        timeout=600,
        label=f"create the env {venv}",
    )
    if made.exit_code != 0:
        return _failed(f"could not create the env {venv}", made.stderr, f"{base} -m venv")
    pip = (
        f"{shlex.quote(python)} -m pip install --disable-pip-version-check -- {shlex.quote(source)}"
    )
    installed = host.run(pip, timeout=INSTALL_TIMEOUT, label=f"pip install {source} into {venv}")
    if installed.exit_code != 0:
        return _failed(f"pip could not install {source} into {venv}", installed.stderr, "pip")
    last = (installed.stdout.strip().splitlines() or [""])[-1]
    return Result(True, f"installed {source} into {venv}: {last}")


def _failed(message: str, stderr: str, source: str) -> Result:
    said = (stderr.strip().splitlines() or ["(no error output)"])[-1]
    finding = Finding(
        "error", "new engine", f"{message}: {said}", "fix the source or the env and run again",
        source=source,
    )  # fmt: skip
    return Result(False, f"{message}: {said}", [finding])
