"""One model across two rehearsal hosts on a real Ray cluster (ray from PyPI, the Ray tier).

The pair is started with the default addresses (``sandbox up --hosts 2 --multinode``): on a
machine with another interface Ray would register a node told 127.0.0.1 under that interface's
address, so the fleet starts at 127.0.0.2 and this deploy proves it. Its ports are free ones,
so it needs no lock. Ray nodes are kept small (one CPU, a 100 MiB object store, no
dashboard); everything a test starts is stopped by its recorded process group.
"""

import json
import os
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from opsbook import stages
from opsbook.core.deployment import load_deployment
from opsbook.core.results import State
from opsbook.rehearsal import fleet as fleets
from opsbook.rehearsal import ray_tier
from opsbook.rehearsal.box_user import account, chown_tree
from opsbook.rehearsal.fleet import Fleet
from opsbook.rehearsal.sim.vllm_install import SETTINGS_NAME, install_vllm
from opsbook.remote.hosts import HostGroup
from opsbook.runner import run
from opsbook.stages import cluster_launch
from opsbook.steps import cluster
from tests.integration.conftest import opsbook

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def pair() -> Iterator[Fleet]:
    ray_tier.ensure_tier()
    folder = Path(tempfile.mkdtemp(prefix="opsbook-multinode-", dir="/tmp"))
    folder.chmod(0o755)  # the sandbox keeps an existing folder's mode; its user must enter
    fleet = fleets.up(folder, hosts=2, multinode=True)
    try:
        # Each test may run alone: the checkpoint patched for this vLLM (the incident's FP8 KV
        # cache) and the launch script on the hosts from the start.
        deployment = load_deployment(fleet.deployment_path)
        for stage in ("config-patch", "launch-script"):
            done = stages.run_stage(stages.get(stage), deployment, apply=True, on_result=None)
            assert done.ok, done.as_result()
        yield fleet
    finally:
        stop_all(fleet)
        fleets.down(folder)
        subprocess.run(["rm", "-rf", str(folder)], check=False)


def stop_all(fleet: Fleet) -> None:
    deployment = load_deployment(fleet.deployment_path)
    group = HostGroup.from_deployment(deployment)
    try:
        cluster_launch.stop_serving(group.hosts, deployment)
    finally:
        group.close()


def left_running(fleet: Fleet) -> list[str]:
    """Ray and vLLM processes (zombies aside) of the hosts' login users: none may survive."""
    import pwd

    uids = {pwd.getpwnam(box.user).pw_uid for box in fleet.hosts}
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if entry.stat().st_uid not in uids:
                continue
            stat = (entry / "stat").read_text()
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if stat[stat.rfind(")") + 2 :][:1] == "Z":
            continue
        if any(word in cmd for word in ("ray", "vllm", "VLLM")):
            found.append(f"{entry.name}: {cmd[:120]}")
    return found


def ray_processes(fleet: Fleet) -> dict[str, list[cluster.RayProcess]]:
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
    tier = ray_tier.ensure_tier()
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

    assert [box.address for box in pair.hosts] == ["127.0.0.2", "127.0.0.3"]
    status = opsbook("cluster", "status", "-f", str(pair.deployment_path), timeout=120)
    assert status.returncode == 0, status.stdout
    assert f"{worker.address}: 8 GPU(s)" in status.stdout
    server_pid = head_server_pid(pair)

    # Ready and unchanged, every node in the cluster with its GPUs: the second deploy leaves
    # the head's server alone, as the single-host launch does.
    again = run.run_deploy(pair.deployment_path, tmp_path / "runs")
    relaunch = {r.host: r for r in again.results if r.stage == "launch"}
    assert again.ok, again.message
    assert all(r.state is State.OK for r in relaunch.values()), relaunch
    assert "already running and ready" in next(
        r.message for h, r in relaunch.items() if head.address in h
    )
    assert head_server_pid(pair) == server_pid

    checked = opsbook("check", "-f", str(pair.deployment_path), timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    spec = load_deployment(pair.deployment_path).cluster
    assert spec is not None
    fleets.stop_sshd(worker)
    try:
        began = time.monotonic()
        lost = opsbook("check", "-f", str(pair.deployment_path), timeout=60)
        took = time.monotonic() - began
    finally:
        # The worker's sshd again, the deployment (and its launch script's port) as it was.
        fleets.up(pair.dir, hosts=2, multinode=True, ray_port=spec.ray_port)
    assert lost.returncode == 4, lost.stdout + lost.stderr
    assert took < 15 and "unreachable" in lost.stdout
    stopped = opsbook("cluster", "stop", "-f", str(pair.deployment_path), timeout=120)
    assert stopped.returncode == 0, stopped.stdout

    assert ray_processes(pair) == {h: [] for h in ray_processes(pair)}
    assert left_running(pair) == []
    assert someone_elses_ray.poll() is None, "another user's Ray was stopped"
    after = opsbook("cluster", "status", "-f", str(pair.deployment_path), timeout=120)
    assert after.returncode == 1 and "no Ray head answers" in after.stdout


def head_server_pid(pair: Fleet) -> int:
    """The PID of the head's `vllm serve` (its login user's)."""
    import pwd

    uid = pwd.getpwnam(pair.hosts[0].user).pw_uid
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmd = (entry / "cmdline").read_bytes().split(b"\0")
                if entry.stat().st_uid == uid and b"serve" in cmd[2:3]:
                    return int(entry.name)
            except OSError:
                continue
    raise AssertionError("no vllm serve of the head's user")


@pytest.fixture
def plain_listener(pair: Fleet) -> Iterator[int]:
    """A plain TCP listener of this (root) process on the head's Ray port."""
    import socket

    spec = load_deployment(pair.deployment_path).cluster
    assert spec is not None
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("0.0.0.0", spec.ray_port))
    listener.listen()
    try:
        yield spec.ray_port
    finally:
        listener.close()


def test_a_listener_on_the_heads_port_is_named_with_its_user_within_seconds(
    pair: Fleet, plain_listener: int
) -> None:
    began = time.monotonic()
    checked = opsbook("check", "-f", str(pair.deployment_path), timeout=120)
    took = time.monotonic() - began

    assert checked.returncode == 1, checked.stdout + checked.stderr
    assert took < 10
    assert f"port {plain_listener} is held by a process of user root" in checked.stdout
    deployment = load_deployment(pair.deployment_path)
    began = time.monotonic()
    result = stages.run_stage(stages.get("launch"), deployment, apply=True, on_result=None)
    took = time.monotonic() - began
    assert took < 15
    assert {r.failure_id for r in result.results} == {"ray-head-port-taken"}
    assert all("user root" in r.message for r in result.results)
    assert ray_processes(pair) == {h: [] for h in ray_processes(pair)}


def test_a_worker_without_ray_is_named_within_seconds_and_nothing_is_left(pair: Fleet) -> None:
    worker = pair.hosts[1]
    tier = ray_tier.ensure_tier()
    ray_tier.unlink_from(worker.venv)
    deployment = load_deployment(pair.deployment_path)
    try:
        began = time.monotonic()
        result = stages.run_stage(stages.get("launch"), deployment, apply=True, on_result=None)
        took = time.monotonic() - began
    finally:
        ray_tier.link_into(tier, worker.venv)

    assert took < 60
    assert all(r.state is State.FAILED for r in result.results)
    assert all(worker.address in r.message for r in result.results)
    assert ray_processes(pair) == {h: [] for h in ray_processes(pair)}
    assert left_running(pair) == []


def test_a_different_vllm_on_the_worker_is_refused_before_anything_starts(pair: Fleet) -> None:
    worker = pair.hosts[1]
    install_vllm(worker.venv, version="0.14.1")
    chown_tree(worker.venv, account(worker.user))
    deployment = load_deployment(pair.deployment_path)
    try:
        result = stages.run_stage(stages.get("preflight"), deployment, on_result=None)
    finally:
        install_vllm(worker.venv)
        chown_tree(worker.venv, account(worker.user))

    assert all(r.state is State.FAILED for r in result.results)
    message = result.results[0].message
    assert "vLLM differs between the nodes" in message
    # The same torch and NCCL (none) on both, and each node reaches the other's address for
    # Ray and vLLM (no reach finding).
    findings = [f for r in result.results for f in r.findings]
    assert not [f for f in findings if "cannot reach" in f.message]
    assert not [f for f in findings if f.subject in ("torch", "NCCL")]
    assert "0.15.1" in message and "0.14.1" in message
    assert ray_processes(pair) == {h: [] for h in ray_processes(pair)}
    assert left_running(pair) == []


def test_a_worker_node_that_dies_while_the_model_loads_ends_the_launch_within_seconds(
    pair: Fleet,
) -> None:
    head, worker = pair.hosts
    settings = head.venv / SETTINGS_NAME
    before = settings.read_text() if settings.exists() else None
    slow = json.loads(before or "{}") | {"startup_seconds": 60}
    settings.write_text(json.dumps(slow))
    deployment = load_deployment(pair.deployment_path)
    log = head.home / "opsbook" / "vllm.log"
    outcome: dict[str, object] = {}

    def launch() -> None:
        try:
            outcome["run"] = stages.run_stage(
                stages.get("launch"), deployment, apply=True, on_result=None
            )
        finally:
            outcome["at"] = time.monotonic()

    # The log of an earlier start would show loading at once.
    log.unlink(missing_ok=True)
    thread = threading.Thread(target=launch)
    try:
        thread.start()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and thread.is_alive():
            if log.exists() and "Loading safetensors checkpoint shards:" in log.read_text():
                break
            time.sleep(0.2)
        assert thread.is_alive(), f"the launch ended before the model loaded: {outcome}"
        killed_at = time.monotonic()
        kill_worker_node(pair)
        thread.join(90)
    finally:
        if before is None:
            settings.unlink(missing_ok=True)
        else:
            settings.write_text(before)

    result = outcome["run"]
    assert isinstance(result, stages.StageRun)
    head_result = next(r for r in result.results if head.address in r.host)
    assert head_result.state is State.FAILED
    assert head_result.failure_id == "ray-node-died", head_result.message
    assert float(outcome["at"]) - killed_at < 20  # type: ignore[arg-type]
    assert ray_processes(pair) == {h: [] for h in ray_processes(pair)}
    assert left_running(pair) == []


def kill_worker_node(pair: Fleet) -> None:
    """The worker's Ray goes away at once (SIGKILL to its process groups), as a node that dies."""
    deployment = load_deployment(pair.deployment_path)
    worker = cluster.nodes_of(deployment)[1]
    group = HostGroup.from_deployment(deployment, names=[worker.host.name])
    try:
        host = group.hosts[0]
        spec = deployment.cluster
        assert spec is not None
        record = {"temp_dir": worker.temp_dir(spec.ray_port), "signal": "KILL"}
        host.probe("ray_node", record)
    finally:
        group.close()


def test_a_layout_larger_than_the_clusters_gpus_is_ray_resources_within_seconds(
    pair: Fleet,
) -> None:
    # tp 8 x pp 3 on 2 x 8 GPUs: vLLM warns at once, then waits up to 1800 s for the placement
    # group; opsbook's verdict comes from the warning, and it stops the server and the cluster.
    deployment = load_deployment(pair.deployment_path, {"cluster.pipeline_parallel_size": 3})
    try:
        stages.run_stage(stages.get("launch-script"), deployment, apply=True, on_result=None)
        began = time.monotonic()
        result = stages.run_stage(stages.get("launch"), deployment, apply=True, on_result=None)
        took = time.monotonic() - began
    finally:
        plain = load_deployment(pair.deployment_path)
        stages.run_stage(stages.get("launch-script"), plain, apply=True, on_result=None)

    head = pair.hosts[0]
    head_result = next(r for r in result.results if head.address in r.host)
    assert head_result.failure_id == "ray-resources", head_result.message
    assert took < 90  # the cluster's start included; vLLM alone would wait 1800 s
    log = (head.home / "opsbook" / "vllm.log").read_text()
    assert (
        "The number of required GPUs exceeds the total number of available GPUs in the "
        "placement group." in log
    )
    assert "'pipeline_parallel_size': 3" in log
    assert ray_processes(pair) == {h: [] for h in ray_processes(pair)}
    assert left_running(pair) == []
