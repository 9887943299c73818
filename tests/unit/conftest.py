"""Fixtures shared by the unit tests of the simulated vLLM, and stand-in programs that note
when they ran."""

import subprocess
from pathlib import Path

import pytest

from opsbook.rehearsal.sim.vllm_install import install_vllm

SYSTEM_PYTHON = Path("/usr/bin/python3")


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A python env on the system interpreter with the simulated vLLM installed."""
    root = tmp_path_factory.mktemp("venv")
    subprocess.run([str(SYSTEM_PYTHON), "-m", "venv", "--without-pip", str(root)], check=True)
    install_vllm(root)
    return root


def timed_stand_in(path: Path, then: str) -> Path:
    """A program that notes when it starts and ends (1 s apart) in ``path``.log, running
    ``then`` in between."""
    path.write_text(
        "#!/bin/sh\n"
        f'echo "start $(date +%s.%N)" >> "{path}.log"\n'
        "sleep 1\n"
        f"{then}\n"
        "status=$?\n"
        f'echo "end $(date +%s.%N)" >> "{path}.log"\n'
        'exit "$status"\n'
    )
    path.chmod(0o755)
    return path


def spans(log: Path) -> list[tuple[float, float]]:
    marks = [line.split() for line in log.read_text().splitlines()]
    starts = sorted(float(t) for kind, t in marks if kind == "start")
    ends = sorted(float(t) for kind, t in marks if kind == "end")
    return list(zip(starts, ends, strict=True))
