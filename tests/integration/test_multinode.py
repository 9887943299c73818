"""One model across two rehearsal hosts on a real Ray cluster (ray from PyPI, the Ray tier).

The pair uses 127.0.6.0/24, an address range of its own, so it needs no lock. Ray nodes are
kept small (one CPU, a 100 MiB object store, no dashboard); everything a test starts is stopped
by its recorded process group.
"""

import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from opsbook import cluster, fleet_sandbox, rehearsal_ray, run, sandbox, stages
from opsbook.deployment import load_deployment
from opsbook.fleet_sandbox import Fleet
from opsbook.hosts import HostGroup
from opsbook.results import State
from opsbook.sim.vllm_install import install_vllm
from opsbook.stages import cluster_launch

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def pair() -> Iterator[Fleet]:
    rehearsal_ray.ensure_tier()
    folder = Path(tempfile.mkdtemp(prefix="opsbook-multinode-", dir="/tmp"))
    fleet = fleet_sandbox.up(folder, hosts=2, address="127.0.6.11", multinode=True)
    try:
        yield fleet
    finally:
        stop_all(fleet)
        fleet_sandbox.down(folder)
        subprocess.run(["rm", "-rf", str(folder)], check=False)


def stop_all(fleet: Fleet) -> None:
    deployment = load_deployment(fleet.deployment_path)
    group = HostGroup.from_deployment(deployment)
    try:
        cluster_launch.stop_serving(group.hosts, deployment)
    finally:
        group.close()


def ray_processes(fleet: Fleet) -> dict[str, list[dict]]:
    """Per host, the Ray processes opsbook started there that still run."""
    deployment = load_deployment(fleet.deployment_path)
    group = HostGroup.from_deployment(deployment)
    try:
        spec = deployment.cluster
        assert spec is not None
        by_name = {h.name: h for h in group.hosts}
        return {
            n.host.name: cluster.node_processes(by_name[n.host.name], n, spec)
            for n in cluster.nodes_of(deployment)
        }
    finally:
        group.close()


@pytest.fixture
def someone_elses_ray() -> Iterator[subprocess.Popen]:
    """A Ray head of another user (root here, the hosts' users are others) on the machine."""
    tier = rehearsal_ray.ensure_tier()
    temp = tempfile.mkdtemp(prefix="other-ray-", dir="/tmp")
    argv = [
        str(tier.venv / "bin" / "ray"),
        "start",
        "--head",
        "--block",
        "--node-ip-address=127.0.6.40",
        "--port=46640",
        "--num-cpus=1",
        f"--object-store-memory={80 * 1024 * 1024}",
        "--include-dashboard=false",
        "--disable-usage-stats",
        f"--temp-dir={temp}",
    ]
    other = subprocess.Popen(
        argv, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        yield other
    finally:
        os.killpg(other.pid, signal.SIGKILL)
        other.wait(10)
        subprocess.run(["rm", "-rf", temp], check=False)


def test_the_pair_serves_one_model_and_stops_only_its_own_ray(
    pair: Fleet, tmp_path: Path, someone_elses_ray: subprocess.Popen
) -> None:
    record = run.run_deploy(pair.deployment_path, tmp_path / "runs")

    launches = {r.host: r for r in record.results if r.stage == "launch"}
    assert record.ok, record.message
    assert len(launches) == 2 and all(r.state is State.CHANGED for r in launches.values())
    head, worker = pair.hosts
    head_result = next(r for h, r in launches.items() if head.address in h)
    worker_result = next(r for h, r in launches.items() if worker.address in h)
    assert "smoke test passed" in head_result.message
    assert f"Ray worker node {worker.address} (8 GPU(s))" in worker_result.message
    log = (head.home / "opsbook" / "vllm.log").read_text()
    assert "'distributed_executor_backend': 'ray'" in log
    assert "'pipeline_parallel_size': 2" in log
    assert "(RayWorkerWrapper pid=" in log and f"ip={worker.address})" in log
    # The worker's ranks hold memory on the worker's own simulated GPUs.
    smi = subprocess.run(
        worker.ssh_command("nvidia-smi"), capture_output=True, text=True, timeout=30
    ).stdout
    assert smi.count("ray::RayWorkerWrapper") == 8

    stop_all(pair)

    assert ray_processes(pair) == {h: [] for h in ray_processes(pair)}
    assert someone_elses_ray.poll() is None, "another user's Ray was stopped"


def test_a_worker_without_ray_is_named_within_seconds_and_nothing_is_left(pair: Fleet) -> None:
    worker = pair.hosts[1]
    tier = rehearsal_ray.ensure_tier()
    rehearsal_ray.unlink_from(worker.venv)
    deployment = load_deployment(pair.deployment_path)
    try:
        began = time.monotonic()
        result = stages.run_stage(stages.get("launch"), deployment, apply=True, on_result=None)
        took = time.monotonic() - began
    finally:
        rehearsal_ray.link_into(tier, worker.venv)

    assert took < 60
    assert all(r.state is State.FAILED for r in result.results)
    assert all(worker.address in r.message for r in result.results)
    assert ray_processes(pair) == {h: [] for h in ray_processes(pair)}


def test_a_different_vllm_on_the_worker_is_refused_before_anything_starts(pair: Fleet) -> None:
    worker = pair.hosts[1]
    install_vllm(worker.venv, version="0.14.1")
    sandbox._chown_tree(worker.venv, sandbox._account(worker.user))
    deployment = load_deployment(pair.deployment_path)
    try:
        result = stages.run_stage(stages.get("preflight"), deployment, on_result=None)
    finally:
        install_vllm(worker.venv)
        sandbox._chown_tree(worker.venv, sandbox._account(worker.user))

    assert all(r.state is State.FAILED for r in result.results)
    message = result.results[0].message
    assert "vLLM differs between the nodes" in message
    assert "0.15.1" in message and "0.14.1" in message
    assert ray_processes(pair) == {h: [] for h in ray_processes(pair)}
