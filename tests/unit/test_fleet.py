"""The pure parts of the rehearsal fleet: its addresses and its one deployment file."""

from pathlib import Path

import pytest
import yaml

from opsbook.core.deployment import load_deployment
from opsbook.core.exceptions import SandboxRequestRefused
from opsbook.rehearsal import fleet
from opsbook.rehearsal.sandbox import Sandbox


def test_hosts_get_consecutive_loopback_addresses() -> None:
    assert fleet.consecutive("127.0.1.254", 3) == [
        "127.0.1.254",
        "127.0.1.255",
        "127.0.2.0",
    ]
    with pytest.raises(SandboxRequestRefused, match="do not fit"):
        fleet.consecutive("127.255.255.254", 3)
    with pytest.raises(SandboxRequestRefused, match="do not fit"):
        fleet.consecutive("255.255.255.254", 3)
    with pytest.raises(SandboxRequestRefused, match="at least one"):
        fleet.consecutive("127.0.0.1", 0)
    with pytest.raises(SandboxRequestRefused, match="not an IPv4 address"):
        fleet.consecutive("localhost", 2)


def box(tmp_path: Path, n: int) -> Sandbox:
    folder = tmp_path / f"host-{n:02d}"
    folder.mkdir()
    doc = {
        "name": "rehearsal",
        "hosts": [{"address": f"127.0.1.{n}", "port": 4000 + n, "user": f"u{n}", "key": "k"}],
        "model": {"path": f"{folder}/models/m"},
        "python": f"{folder}/venv/bin/python",
        "server": {
            "port": 8000 + n,
            "args": {"tensor-parallel-size": 8},
            # As a real-vLLM rehearsal host's (rehearsal/real_vllm.py deployment_fields).
            "env": {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CACHE_ROOT": f"{folder}/vllm-cache"},
        },
        "paths": {
            "script": f"{folder}/home/launch.sh",
            "log": f"{folder}/home/vllm.log",
            "state": f"{folder}/home/state",
        },
    }
    (folder / "deployment.yml").write_text(yaml.safe_dump(doc))
    return Sandbox(
        dir=folder,
        address=f"127.0.1.{n}",
        port=4000 + n,
        user=f"u{n}",
        shell="zsh",
        sshd_pid=0,
        deployment_path=folder / "deployment.yml",
        key=folder / "k",
        known_hosts=folder / "kh",
        home=folder / "home",
        sim_dir=folder / "sim",
        venv=folder / "venv",
        model_path=folder / "models/m",
        server_port=8000 + n,
        created_user=False,
    )


def test_one_deployment_lists_every_host_with_its_own_paths_and_port(tmp_path) -> None:
    boxes = [box(tmp_path, n) for n in (1, 2, 3)]
    path = fleet.write_deployment(boxes, tmp_path / "deployment.yml", name="fleet")
    assert "&id" not in path.read_text()  # no YAML anchors shared between hosts
    dep = load_deployment(path)
    assert dep.name == "fleet" and [h.address for h in dep.hosts] == [
        "127.0.1.1",
        "127.0.1.2",
        "127.0.1.3",
    ]
    for n, spec in enumerate(dep.hosts, start=1):
        view = dep.for_host(spec)
        assert view.server_port == 8000 + n and view.model_path.endswith(f"host-{n:02d}/models/m")
        assert view.script_path.endswith(f"host-{n:02d}/home/launch.sh")
        assert view.serve_args == {"tensor-parallel-size": 8}


def test_each_host_keeps_its_own_server_env_over_the_shared_one(tmp_path) -> None:
    boxes = [box(tmp_path, n) for n in (1, 2)]
    path = fleet.write_deployment(boxes, tmp_path / "deployment.yml", name="fleet")
    doc = yaml.safe_load(path.read_text())
    # Only the variable that differs is the host's own: the shared one stays at the top.
    assert doc["hosts"][1]["vars"]["server"]["env"] == {
        "VLLM_CACHE_ROOT": f"{tmp_path}/host-02/vllm-cache"
    }
    dep = load_deployment(path)
    roots = [dep.for_host(spec).env["VLLM_CACHE_ROOT"] for spec in dep.hosts]
    assert roots == [f"{tmp_path}/host-01/vllm-cache", f"{tmp_path}/host-02/vllm-cache"]
    for spec in dep.hosts:
        assert dep.for_host(spec).env["VLLM_CPU_KVCACHE_SPACE"] == "1"


def test_a_multinode_fleet_starts_past_the_address_ray_replaces() -> None:
    assert fleet.ray_kept("127.0.0.1") == "127.0.0.2"
    assert fleet.ray_kept("127.0.6.11") == "127.0.6.11"
