"""Fixtures shared by the unit tests of the simulated vLLM, and stand-in programs that note
when they ran."""

import subprocess
from pathlib import Path

import pytest

from opsbook.rehearsal.sim.vllm_install import install_vllm

SYSTEM_PYTHON = Path("/usr/bin/python3")


# Modules whose tests start simulated vLLM servers as the test's user and then look for that
# user's vLLM processes: `make test` runs them apart from the parallel unit run (pytest-xdist),
# or one worker's servers are "other vLLM processes of yours" to the other worker's checks.
SERIAL_MODULES = {
    "test_kernel", "test_restart_rule", "test_server", "test_sim_matches_facts",
    "test_stages", "test_terminal", "test_triage", "test_widgets",
}  # fmt: skip


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.stem in SERIAL_MODULES:
            item.add_marker(pytest.mark.serial)


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
