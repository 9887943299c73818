"""`opsbook sandbox up --hosts N` honours --gpus and --vllm-version on every host.

Two rehearsal hosts at 127.0.8.21-22, started by the CLI as an operator would; each host's own
facts are then read over SSH by the preflight probe: the GPUs its nvidia-smi reports and the vLLM
release its simulated server plays.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from opsbook.core.deployment import load_deployment
from opsbook.remote.hosts import Host
from opsbook.steps import host_facts
from tests.integration.conftest import opsbook

pytestmark = pytest.mark.integration

ADDRESS = "127.0.8.21"


@pytest.fixture(scope="module")
def fleet_dir() -> Iterator[Path]:
    work = Path(tempfile.mkdtemp(prefix="opsbook-knobs-", dir="/tmp"))
    work.chmod(0o755)
    folder = work / "fleet"
    try:
        up = opsbook(
            "sandbox", "up", "--dir", str(folder), "--hosts", "2", "--address", ADDRESS,
            "--gpus", "b200", "--vllm-version", "0.33.0", timeout=600,
        )  # fmt: skip
        assert up.returncode == 0, up.stderr
        assert "vLLM 0.33.0" in up.stdout and "b200" in up.stdout
        yield folder
    finally:
        down = opsbook("sandbox", "down", "--dir", str(folder), timeout=600)
        assert down.returncode == 0, down.stdout + down.stderr


def test_every_host_of_the_fleet_has_the_gpus_and_release_asked_for(fleet_dir: Path) -> None:
    dep = load_deployment(fleet_dir / "deployment.yml")
    assert len(dep.hosts) == 2
    for spec in dep.hosts:
        one = dep.for_host(spec)
        with Host(spec, one.secret_values()) as host:
            found = host_facts.gather_facts(host, one)
        assert spec.address.startswith("127.0.8.")
        assert len(found.gpus) == 8
        assert {g.name for g in found.gpus} == {"NVIDIA B200"}, found.gpus[0]
        assert {g.compute_cap for g in found.gpus} == {"10.0"}
        assert found.vllm_version == "0.33.0"
