"""Fixtures shared by the unit tests of the simulated vLLM."""

import subprocess
from pathlib import Path

import pytest

from opsbook.sim.vllm_install import install_vllm

SYSTEM_PYTHON = Path("/usr/bin/python3")


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A python env on the system interpreter with the simulated vLLM installed."""
    root = tmp_path_factory.mktemp("venv")
    subprocess.run([str(SYSTEM_PYTHON), "-m", "venv", "--without-pip", str(root)], check=True)
    install_vllm(root)
    return root
