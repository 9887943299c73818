"""The cluster section, the settings serving across nodes adds, the cross-node comparison and
the probe that finds (and stops) only the Ray processes of one node."""

import os
import signal
import subprocess
import sys
import time
from types import SimpleNamespace
from typing import Any

import pytest

from opsbook import cluster, probes
from opsbook.deployment import ClusterSpec, parse_deployment
from opsbook.exceptions import DeploymentError
from opsbook.stages import cluster_preflight


def doc(**cluster_section: Any) -> dict[str, Any]:
    return {
        "hosts": [
            {"address": "10.0.0.1", "vars": {"server": {"env": {"VLLM_HOST_IP": "192.168.1.1"}}}},
            {"address": "10.0.0.2", "vars": {"server": {"env": {"VLLM_HOST_IP": "192.168.1.2"}}}},
        ],
        "model": {"path": "/models/m"},
        "server": {"args": {"max-model-len": 4096}, "env": {"VLLM_HOST_IP": "192.168.1.1"}},
        # The schema asks for both sizes; the tests that are not about them take 1 x 1.
        "cluster": {"tensor_parallel_size": 1, "pipeline_parallel_size": 1, **cluster_section},
    }


def test_the_cluster_section_is_parsed_with_its_defaults() -> None:
    deployment = parse_deployment(doc(tensor_parallel_size=8, pipeline_parallel_size=2))
    assert deployment.cluster == ClusterSpec("10.0.0.1", 8, 2, 6379, None)
    assert deployment.cluster.world_size == 16


def test_a_single_node_deployment_has_no_cluster() -> None:
    plain = doc()
    del plain["cluster"]
    assert parse_deployment(plain).cluster is None


def test_each_host_view_keeps_the_whole_files_cluster() -> None:
    deployment = parse_deployment(doc(head="10.0.0.2", ray_port=6380, interface="eth1"))
    view = deployment.for_host(deployment.hosts[0])
    assert view.cluster == ClusterSpec("10.0.0.2", 1, 1, 6380, "eth1")


@pytest.mark.parametrize(
    ("section", "named"),
    [
        ({"head": "10.9.9.9"}, "cluster.head"),
        ({"tensor_parallel_size": 0}, "tensor_parallel_size"),
        ({"ray_port": 70000}, "ray_port"),
        ({"tp": 8}, "unknown key .tp."),
    ],
)
def test_a_bad_cluster_section_is_refused_naming_the_key(section: dict, named: str) -> None:
    with pytest.raises(DeploymentError, match=named):
        parse_deployment(doc(**section))


def test_the_nodes_are_head_first_at_their_vllm_host_ip() -> None:
    deployment = parse_deployment(doc(head="10.0.0.2"))
    nodes = cluster.nodes_of(deployment)
    assert [(n.address, n.head) for n in nodes] == [("192.168.1.2", True), ("192.168.1.1", False)]
    assert cluster.head_address(deployment) == "192.168.1.2:6379"


def test_serving_across_nodes_adds_the_ray_executor_and_the_cluster_address() -> None:
    deployment = parse_deployment(
        doc(tensor_parallel_size=8, pipeline_parallel_size=2, interface="ens5")
    )
    head = cluster.with_cluster_settings(deployment.for_host(deployment.hosts[0]))
    assert head.serve_args == {
        "tensor-parallel-size": 8,
        "pipeline-parallel-size": 2,
        "distributed-executor-backend": "ray",
        "max-model-len": 4096,
    }
    assert head.env["RAY_ADDRESS"] == "192.168.1.1:6379"
    assert head.env["NCCL_SOCKET_IFNAME"] == head.env["GLOO_SOCKET_IFNAME"] == "ens5"
    assert head.env["VLLM_HOST_IP"] == "192.168.1.1"


def test_the_files_own_values_win_over_the_clusters() -> None:
    section = doc(tensor_parallel_size=8)
    section["server"]["args"]["distributed-executor-backend"] = "mp"
    deployment = parse_deployment(section)
    view = cluster.with_cluster_settings(deployment.for_host(deployment.hosts[0]))
    assert view.serve_args["distributed-executor-backend"] == "mp"


def facts(vllm: str, python: str = "3.12.3", gpus: int = 8, gpu: str = "NVIDIA H100") -> Any:
    return SimpleNamespace(
        vllm_version=vllm,
        python=SimpleNamespace(version=python),
        gpus=[SimpleNamespace(name=gpu) for _ in range(gpus)],
    )


def test_nodes_that_agree_give_no_finding() -> None:
    found = {"a": facts("0.15.1"), "b": facts("0.15.1")}
    assert cluster_preflight.compare(found, {"a": "2.58.0", "b": "2.58.0"}, 16) == []


def test_a_different_vllm_is_named_with_both_versions() -> None:
    found = {"a": facts("0.15.1"), "b": facts("0.14.1")}
    [finding] = cluster_preflight.compare(found, {"a": "2.58.0", "b": "2.58.0"}, 16)
    assert finding.message == "vLLM differs between the nodes (a: 0.15.1, b: 0.14.1)"


def test_ray_python_gpu_model_and_gpu_count_are_compared() -> None:
    found = {"a": facts("0.15.1", "3.12.3"), "b": facts("0.15.1", "3.11.2", 4, "NVIDIA H200")}
    findings = cluster_preflight.compare(found, {"a": "2.58.0", "b": "2.49.1"}, 16)
    subjects = [f.subject for f in findings]
    assert subjects == ["Python", "Ray", "GPU model", "GPUs"]
    assert "12 GPU(s), tensor x pipeline parallel needs 16" in findings[-1].message


def test_the_node_probe_finds_and_stops_only_the_processes_naming_its_folder(tmp_path) -> None:
    folder = f"/tmp/opsbook-ray-test-{os.getpid()}"
    program = "import time; time.sleep(60)"
    ours = subprocess.Popen(
        [sys.executable, "-c", program, f"--temp-dir={folder}"], start_new_session=True
    )
    other = subprocess.Popen(
        [sys.executable, "-c", program, "--temp-dir=/tmp/someone-else"], start_new_session=True
    )
    try:
        time.sleep(0.3)
        found = probes.run_local("ray_node", {"temp_dir": folder})
        assert [p["pid"] for p in found["processes"]] == [ours.pid]
        assert found["pgids"] == [ours.pid]
        probes.run_local("ray_node", {"temp_dir": folder, "signal": "TERM"})
        assert ours.wait(5) == -signal.SIGTERM
        assert other.poll() is None
    finally:
        for process in (ours, other):
            if process.poll() is None:
                process.kill()
                process.wait()


def test_the_node_probe_tells_an_address_the_node_lacks_and_an_unknown_interface() -> None:
    # Binding to an address the machine lacks fails at once: nothing is sent.
    answer = probes.run_local(
        "cluster_node",
        {
            "host_ip": "10.255.255.1",
            "interfaces": {"NCCL_SOCKET_IFNAME": "nosuch0", "GLOO_SOCKET_IFNAME": "lo"},
        },
    )
    assert "assign" in answer["host_ip_error"]
    assert answer["bad_interfaces"] == {"NCCL_SOCKET_IFNAME": "nosuch0"}
    fine = probes.run_local(
        "cluster_node", {"host_ip": "127.0.0.1", "interfaces": {"NCCL_SOCKET_IFNAME": "^docker"}}
    )
    assert fine["host_ip_error"] is None and fine["bad_interfaces"] == {}


def test_the_node_probe_tells_a_taken_port() -> None:
    import socket

    with socket.socket() as holder:
        holder.bind(("127.0.6.50", 0))
        holder.listen()
        port = holder.getsockname()[1]
        answer = probes.run_local("cluster_node", {"ports": [["127.0.6.50", port]]})
    assert [entry[:2] for entry in answer["taken_ports"]] == [["127.0.6.50", port]]


def shards_check(*rows: tuple[str, int]) -> Any:
    from opsbook.download import SHARD_COLUMNS
    from opsbook.results import Result, Table

    records = [
        {
            "file": f,
            "status": "ok",
            "size": s,
            "expected_size": s,
            "header_len": 800,
            "tensors": 12,
            "detail": "",
        }
        for f, s in rows
    ]
    return Result(True, "ok", {"shards": Table.from_records(records, SHARD_COLUMNS)})


def test_the_checkpoint_fingerprint_follows_the_shards_not_the_order_or_path() -> None:
    from opsbook.stages.cluster_download import fingerprint

    one = fingerprint(shards_check(("a.safetensors", 10), ("b.safetensors", 20)))
    same = fingerprint(shards_check(("b.safetensors", 20), ("a.safetensors", 10)))
    other = fingerprint(shards_check(("a.safetensors", 10), ("b.safetensors", 21)))
    assert one == same != other


def two_node_deployment() -> Any:
    return parse_deployment(
        {
            "hosts": [{"address": "gpu-01", "user": "ops"}, {"address": "gpu-02", "user": "ops"}],
            "model": {"path": "/models/m"},
            "python": "/venv/bin/python",
            "cluster": {"tensor_parallel_size": 8, "pipeline_parallel_size": 2, "ray_port": 6380},
        }
    )


def fake_pair(join: bool = True) -> tuple[Any, Any, list[str]]:
    """Two FakeHosts whose `ray start` adds their node to a shared cluster listing."""
    from opsbook.testing import FakeHost

    members: list[str] = []
    order: list[str] = []

    def listing(args: dict) -> dict:
        return {
            "ray_version": "2.58.0",
            "nodes": [{"address": a, "alive": True, "gpus": 8.0} for a in members],
        }

    hosts = []
    for address in ("gpu-01", "gpu-02"):

        def started(args: dict, address: str = address) -> dict:
            return {"processes": [], "pgids": [], "signalled": []}

        host = FakeHost(
            address,
            commands={"ray start": "", "mkdir|rm -rf": ""},
            probes={"ray_cluster": listing, "ray_node": started},
        )
        hosts.append(host)
    original = [h.run for h in hosts]

    def runner(index: int):
        def run(command: str, **kwargs: Any):
            if "ray start" in command:
                order.append(hosts[index].spec.address)
                if join or index == 0:
                    members.append(hosts[index].spec.address)
            return original[index](command, **kwargs)

        return run

    for index, host in enumerate(hosts):
        host.run = runner(index)
    return hosts[0], hosts[1], order


def test_the_head_starts_first_then_the_worker_once_the_head_is_in_the_cluster() -> None:
    head, worker, order = fake_pair()
    result = cluster.start_cluster([worker, head], two_node_deployment())
    assert result.ok, result
    assert order == ["gpu-01", "gpu-02"]
    assert result.data["nodes"] == {"gpu-01": 8.0, "gpu-02": 8.0}
    head_start = next(c for k, c in head.calls if k == "run" and "ray start" in c)
    assert "--head" in head_start and "--port=6380" in head_start
    worker_start = next(c for k, c in worker.calls if k == "run" and "ray start" in c)
    assert "--address=gpu-01:6380" in worker_start and worker_start.startswith("setsid ")


def test_running_it_again_starts_nothing() -> None:
    head, worker, order = fake_pair()
    deployment = two_node_deployment()
    cluster.start_cluster([head, worker], deployment)
    again = cluster.start_cluster([head, worker], deployment)
    assert again.ok and order == ["gpu-01", "gpu-02"]


def test_a_worker_that_never_joins_is_named(monkeypatch) -> None:
    monkeypatch.setattr(cluster, "JOIN_POLL", 0.01)
    head, worker, _ = fake_pair(join=False)
    result = cluster.start_cluster([head, worker], two_node_deployment(), join_timeout=0.2)
    assert not result.ok
    assert result.message.startswith("node gpu-02 did not join the Ray cluster at gpu-01:6380")
