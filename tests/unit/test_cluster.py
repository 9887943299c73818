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

from opsbook.core.deployment import ClusterSpec, parse_deployment
from opsbook.core.exceptions import DeploymentError
from opsbook.remote import probes
from opsbook.stages import cluster_preflight
from opsbook.stages.cluster_preflight import Libraries, NodeAnswer
from opsbook.steps import cluster


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
        found = cluster.RayNodeAnswer.parse(probes.run_local("ray_node", {"temp_dir": folder}))
        assert [p.pid for p in found.processes] == [ours.pid]
        assert found.pgids == [ours.pid]
        probes.run_local("ray_node", {"temp_dir": folder, "signal": "TERM"})
        assert ours.wait(5) == -signal.SIGTERM
        assert other.poll() is None
    finally:
        for process in (ours, other):
            if process.poll() is None:
                process.kill()
                process.wait()


def node_answer(args: dict[str, Any]) -> NodeAnswer:
    return NodeAnswer.parse(probes.run_local("cluster_node", args))


def test_the_node_probe_tells_an_address_the_node_lacks_and_an_unknown_interface() -> None:
    # Binding to an address the machine lacks fails at once: nothing is sent.
    answer = node_answer(
        {
            "host_ip": "10.255.255.1",
            "interfaces": {"NCCL_SOCKET_IFNAME": "nosuch0", "GLOO_SOCKET_IFNAME": "lo"},
        }
    )
    assert answer.host_ip_error is not None and "assign" in answer.host_ip_error
    assert answer.bad_interfaces == {"NCCL_SOCKET_IFNAME": "nosuch0"}
    fine = node_answer({"host_ip": "127.0.0.1", "interfaces": {"NCCL_SOCKET_IFNAME": "^docker"}})
    assert fine.host_ip_error is None and fine.bad_interfaces == {}


def test_the_node_probe_tells_a_taken_port() -> None:
    import socket

    with socket.socket() as holder:
        holder.bind(("127.0.6.50", 0))
        holder.listen()
        port = holder.getsockname()[1]
        answer = node_answer({"ports": [["127.0.6.50", port]]})
    assert [(t.address, t.port) for t in answer.taken_ports] == [("127.0.6.50", port)]


def test_a_port_whose_last_connection_waits_in_time_wait_is_free() -> None:
    # An earlier cluster's closed connections leave the head's port in TIME_WAIT for a minute;
    # Ray's gRPC listener binds with SO_REUSEADDR (so do its accepted sockets) and binds the
    # port again at once, so the preflight must not call it taken.
    import socket

    with socket.socket() as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.6.55", 0))
        server.listen()
        port = server.getsockname()[1]
        client = socket.create_connection(("127.0.6.55", port))
        accepted, _ = server.accept()
        accepted.close()  # the server side closes first: its end waits in TIME_WAIT
        client.close()
    answer = node_answer({"ports": [["127.0.6.55", port]]})
    assert answer.taken_ports == []


def shards_check(*rows: tuple[str, int]) -> Any:
    from opsbook.core.results import Table
    from opsbook.steps.shard_check import CheckResult, CheckSummary, ShardRow, Where

    shards = [ShardRow(f, "ok", s, s, 800, 12, "") for f, s in rows]
    return CheckResult(
        True,
        "ok",
        where=Where(input="/m", model_dir="/m"),
        index=None,
        summary=CheckSummary(shards=len(shards), ok=len(shards)),
        shards=shards,
        files=Table(["file", "status", "detail"], []),
        partials=[],
    )


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
    from opsbook.remote.testing import FakeHost

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
    assert result.nodes == {"gpu-01": 8.0, "gpu-02": 8.0}
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


def test_the_same_torch_and_nccl_everywhere_or_nowhere_give_no_finding() -> None:
    found = {"a": facts("0.15.1"), "b": facts("0.15.1")}
    rays = {"a": "2.58.0", "b": "2.58.0"}
    same = cluster_preflight.Libraries("2.14.1+cu130", "2.30.7 (nvidia-nccl-cu13)")
    assert cluster_preflight.compare(found, rays, 16, {"a": same, "b": same}) == []
    # A CPU-only deployment has neither torch nor NCCL on any node: nothing differs.
    absent = cluster_preflight.Libraries()
    assert cluster_preflight.compare(found, rays, 16, {"a": absent, "b": absent}) == []


def test_a_different_torch_and_nccl_are_named_with_both_versions_and_the_heads() -> None:
    found = {"a": facts("0.15.1"), "b": facts("0.15.1")}
    libraries = {
        "a": cluster_preflight.Libraries("2.14.1+cu130", "2.30.7 (nvidia-nccl-cu13)"),
        "b": cluster_preflight.Libraries("2.13.0+cu128", "2.27.5 (nvidia-nccl-cu12)"),
    }
    torch, nccl = cluster_preflight.compare(found, {"a": "2.58.0", "b": "2.58.0"}, 16, libraries)
    assert torch.subject == "torch" and torch.severity == "error"
    assert torch.message == "torch differs between the nodes (a: 2.14.1+cu130, b: 2.13.0+cu128)"
    assert "2.14.1+cu130, on a" in torch.remedy and "in place of 2.13.0+cu128" in torch.remedy
    assert nccl.subject == "NCCL"
    assert "a: 2.30.7 (nvidia-nccl-cu13), b: 2.27.5 (nvidia-nccl-cu12)" in nccl.message
    assert "install the torch that brings it" in nccl.remedy


def test_torch_missing_on_one_node_only_is_a_difference() -> None:
    versions = {"a": "2.14.1+cu130", "b": None}
    finding = cluster_preflight.library_finding("torch", versions)
    assert finding is not None
    assert finding.message == "torch differs between the nodes (a: 2.14.1+cu130, b: not installed)"


# What the torch 2.14.1 wheel from PyPI (cu130) carries, as read from it: its torch/version.py
# names no NCCL; its METADATA requires the NCCL package.
TORCH_VERSION_PY = """from typing import Optional

__all__ = ['__version__', 'debug', 'cuda', 'git_version', 'hip', 'rocm', 'xpu']
__version__ = '2.14.1+cu130'
debug = False
cuda: Optional[str] = '13.0'
git_version = '5c4886908584029761b579af026dcfb627c84070'
hip: Optional[str] = None
rocm: Optional[str] = None
xpu: Optional[str] = None
"""


def install_distribution(site: Any, name: str, version: str, files: dict[str, str]) -> None:
    """Lay out an installed distribution as pip does: its dist-info and its files."""
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.4\nName: {name}\nVersion: {version}\n")
    for path, text in files.items():
        (site / path).parent.mkdir(parents=True, exist_ok=True)
        (site / path).write_text(text)


def test_the_node_probe_reads_torch_and_nccl_from_the_deployment_pythons_packages(
    tmp_path,
) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    [site] = venv.glob("lib/python*/site-packages")
    python = str(venv / "bin" / "python")
    assert node_answer({"python": python}).libraries == Libraries(None, None, None)
    # torch/__init__.py raises: the probe must not import torch (it takes seconds on a node).
    install_distribution(
        site,
        "torch",
        "2.14.1",
        {"torch/__init__.py": "raise SystemExit(7)\n", "torch/version.py": TORCH_VERSION_PY},
    )
    install_distribution(site, "nvidia-nccl-cu13", "2.30.7", {"nvidia/nccl/__init__.py": ""})
    answer = node_answer({"python": python})
    assert answer.libraries == Libraries("2.14.1+cu130", "2.30.7 (nvidia-nccl-cu13)", None)


def test_the_node_probe_tells_which_peer_addresses_answer() -> None:
    import socket

    with socket.socket() as listening, socket.socket() as closed:
        listening.bind(("127.0.6.51", 0))
        listening.listen()
        closed.bind(("127.0.6.52", 0))  # bound, not listening: a connection is refused
        open_port, closed_port = listening.getsockname()[1], closed.getsockname()[1]
        reach = [["127.0.6.51", open_port], ["127.0.6.52", closed_port]]
        answer = node_answer({"reach": reach})
    [miss] = answer.unreached
    assert (miss.address, miss.port, miss.refused) == ("127.0.6.52", closed_port, True)
    assert "refused" in miss.error.lower()


def pair_deployment(head_port: int, worker_port: int, worker_ip: str | None = None) -> Any:
    worker_env = {"VLLM_HOST_IP": worker_ip} if worker_ip else {}
    return parse_deployment(
        {
            "hosts": [
                {"address": "127.0.6.53", "port": head_port},
                {
                    "address": "127.0.6.54",
                    "port": worker_port,
                    "vars": {"server": {"env": worker_env}},
                },
            ],
            "model": {"path": "/models/m"},
            "server": {"args": {"max-model-len": 4096}},
            "cluster": {"tensor_parallel_size": 1, "pipeline_parallel_size": 1},
        }
    )


def node_host(node: cluster.Node) -> Any:
    from opsbook.remote.testing import FakeHost, local_probe

    host = FakeHost(
        node.host.address,
        probes={"cluster_node": local_probe("cluster_node"), "ray_node": {"processes": []}},
        commands={r"ray-node\.json": ""},  # no Ray of opsbook's on the node yet
    )
    host.spec = node.host  # FakeHost takes no SSH port; the reach targets use the spec's
    host.name = node.host.name
    return host


def reach_findings(deployment: Any) -> dict[str, list[Any]]:
    """Each node's findings from its own run of the real probe."""
    spec = cluster.cluster_of(deployment)
    nodes = cluster.nodes_of(deployment)
    found = {}
    for node in nodes:
        host = node_host(node)
        answer = cluster_preflight.node_probe(host, node, spec, nodes)
        found[node.host.name] = cluster_preflight.node_findings(host.name, node, answer, nodes)
        [(_, sent)] = [call for call in host.probe_args if call[0] == "cluster_node"]
        assert sent["reach"] == [[p.address, p.host.port] for p in nodes if p is not node]
        assert sent["python"] == node.python
    return found


def test_nodes_whose_ssh_ports_answer_each_other_give_no_reach_finding() -> None:
    import socket

    with socket.socket() as head_ssh, socket.socket() as worker_ssh:
        for listener, address in ((head_ssh, "127.0.6.53"), (worker_ssh, "127.0.6.54")):
            listener.bind((address, 0))
            listener.listen()
        ports = head_ssh.getsockname()[1], worker_ssh.getsockname()[1]
        found = reach_findings(pair_deployment(*ports))
    assert found == {name: [] for name in found}


def test_a_peer_refusing_on_the_address_opsbook_reaches_it_at_is_an_error_naming_it() -> None:
    import socket

    with socket.socket() as head_ssh, socket.socket() as worker_ssh:
        head_ssh.bind(("127.0.6.53", 0))
        head_ssh.listen()
        worker_ssh.bind(("127.0.6.54", 0))  # nothing listens: the worker refuses the head
        deployment = pair_deployment(head_ssh.getsockname()[1], worker_ssh.getsockname()[1])
        found = reach_findings(deployment)
    head, worker = cluster.nodes_of(deployment)
    assert found[worker.host.name] == []
    [finding] = found[head.host.name]
    assert finding.severity == "error"
    assert f"cannot reach {worker.host.name}'s address for Ray and vLLM 127.0.6.54" in (
        finding.message
    )
    assert "firewall" in finding.remedy and "VLLM_HOST_IP" in finding.remedy


def test_a_refusal_on_a_vllm_host_ip_other_than_the_ssh_address_is_only_a_warning() -> None:
    from opsbook.core.deployment import HostSpec

    worker = cluster.Node(HostSpec("127.0.6.54", port=2222), "127.0.6.55", False, "python3", "/s")
    refused = cluster_preflight.reach_finding("head", worker, 2222, "Connection refused", True)
    lost = cluster_preflight.reach_finding("head", worker, 2222, "timed out after 3s", False)
    assert refused.severity == "warning" and lost.severity == "error"
    assert "127.0.6.55" in lost.message and "VLLM_HOST_IP" in lost.remedy


def run_pair(monkeypatch, deployment: Any, libraries: dict[str, dict[str, Any]]) -> dict:
    """cluster_preflight.run over two FakeHosts: each node's single-host preflight passes with
    the same facts, Ray answers 2.58.0, and the real ``cluster_node`` probe runs locally with
    the scripted torch and NCCL in place of the local python's."""
    from opsbook.core.results import Result, State
    from opsbook.remote.testing import FakeHost, local_probe
    from opsbook.stages import preflight

    def single_host(host: Any, view: Any, options: Any) -> preflight.PreflightReport:
        return preflight.PreflightReport(State.OK, Result(True, "ready"), facts=facts("0.15.1"))

    monkeypatch.setattr(preflight, "run", single_host)
    hosts = []
    for spec in deployment.hosts:

        def answer(args: dict, name: str = spec.name) -> Any:
            return {**local_probe("cluster_node")(args), "libraries": libraries[name]}

        host = FakeHost(
            spec.address,
            probes={"cluster_node": answer, "ray_node": {"processes": []}},
            commands={r"ray-node\.json": "", r"import ray": "2.58.0\n", "^true$": ""},
        )
        host.spec, host.name = spec, spec.name
        hosts.append(host)
    return cluster_preflight.run(hosts, deployment, preflight.Options())


def test_the_cluster_preflight_fails_every_node_when_torch_differs(monkeypatch) -> None:
    import socket

    from opsbook.core.results import State

    with socket.socket() as head_ssh, socket.socket() as worker_ssh:
        for listener, address in ((head_ssh, "127.0.6.53"), (worker_ssh, "127.0.6.54")):
            listener.bind((address, 0))
            listener.listen()
        deployment = pair_deployment(head_ssh.getsockname()[1], worker_ssh.getsockname()[1])
        head, worker = (n.host.name for n in cluster.nodes_of(deployment))
        reports = run_pair(
            monkeypatch,
            deployment,
            {
                head: {"torch": "2.14.1+cu130", "nccl": None},
                worker: {"torch": "2.13.0+cpu", "nccl": None},
            },
        )
    assert [r.state for r in reports.values()] == [State.FAILED, State.FAILED]
    message = reports[worker].verdict.message
    assert message == (
        f"the nodes differ: torch differs between the nodes ({head}: 2.14.1+cu130, "
        f"{worker}: 2.13.0+cpu)"
    )


def test_a_refused_vllm_host_ip_is_a_warning_that_does_not_fail_the_nodes(monkeypatch) -> None:
    import socket

    from opsbook.core.results import State

    same = {"torch": "2.14.1+cu130", "nccl": "2.30.7 (nvidia-nccl-cu13)"}
    with socket.socket() as head_ssh, socket.socket() as worker_ssh:
        for listener, address in ((head_ssh, "127.0.6.53"), (worker_ssh, "127.0.6.54")):
            listener.bind((address, 0))
            listener.listen()
        # The worker's VLLM_HOST_IP is another address of it, where SSH does not listen (not
        # 127.0.0.1, which Ray replaces: an error of its own).
        deployment = pair_deployment(
            head_ssh.getsockname()[1], worker_ssh.getsockname()[1], worker_ip="127.0.6.55"
        )
        head, worker = (n.host.name for n in cluster.nodes_of(deployment))
        reports = run_pair(monkeypatch, deployment, {head: same, worker: same})
    assert [r.state for r in reports.values()] == [State.OK, State.OK]
    [warning] = reports[head].verdict.findings
    assert warning.severity == "warning"
    assert f"{head} cannot reach {worker}'s address for Ray and vLLM 127.0.6.55" in warning.message


# Nodes matched by their own temp folder; the head's port holder; failure classes.


def localhost_pair() -> Any:
    return parse_deployment(
        {
            "hosts": [{"address": "127.0.0.1", "user": "ops"}, {"address": "127.0.0.2"}],
            "model": {"path": "/models/m"},
            "cluster": {"tensor_parallel_size": 8, "pipeline_parallel_size": 2, "ray_port": 6380},
        }
    )


def listing(*members: dict[str, Any]) -> cluster.ClusterNodes:
    return cluster.ClusterNodes.parse({"ray_version": "2.58.0", "nodes": list(members)})


def test_a_node_told_127_0_0_1_is_found_under_the_machines_address_by_its_temp_folder() -> None:
    head, worker = cluster.nodes_of(localhost_pair())
    registered = {"address": "192.0.2.2", "alive": True, "gpus": 8.0, "local": True}
    state = listing(
        {**registered, "temp_dir": head.temp_dir(6380)},
        {"address": "127.0.0.2", "alive": True, "gpus": 8.0, "temp_dir": "/elsewhere"},
    )

    assert state.alive([head, worker], 6380) == {"127.0.0.1": 8.0, "127.0.0.2": 8.0}
    # Not an address of the head's machine: never taken for the node.
    foreign = listing({**registered, "local": False, "temp_dir": head.temp_dir(6380)})
    assert foreign.member(head, 6380) is None
    # A node told another address is found only there.
    moved = listing({**registered, "temp_dir": worker.temp_dir(6380)})
    assert moved.member(worker, 6380) is None


def run_ray_cluster_probe(args: dict[str, Any]) -> dict[str, Any]:
    from opsbook.remote.testing import local_probe

    return local_probe("ray_cluster")(args)


def test_the_probe_names_a_listener_on_the_heads_port_at_once_with_its_pid_and_user() -> None:
    import pwd
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    try:
        began = time.monotonic()
        answer = run_ray_cluster_probe(
            {"address": f"127.0.0.1:{port}", "node_ip": "127.0.0.1", "temp_dir": "/tmp/x-ray"}
        )
        took = time.monotonic() - began
    finally:
        listener.close()

    assert took < 5
    holder = answer["holder"]
    assert holder["pid"] == os.getpid() and holder["user"] == pwd.getpwuid(os.getuid()).pw_name
    assert f"port {port} is held by a process of user" in answer["error"]
    state = cluster.ClusterNodes.parse(answer)
    assert state.holder.startswith(f"a process of user {holder['user']} (PID {os.getpid()}")


def test_nothing_on_the_heads_port_is_said_without_joining() -> None:
    import socket

    spare = socket.socket()
    spare.bind(("127.0.0.1", 0))
    port = spare.getsockname()[1]
    spare.close()
    answer = run_ray_cluster_probe(
        {"address": f"127.0.0.1:{port}", "node_ip": "127.0.0.1", "temp_dir": "/tmp/x-ray"}
    )
    assert answer == {
        "error": f"no Ray head answers at 127.0.0.1:{port}: nothing listens on port {port}",
        "holder": None,
    }


def test_only_the_folder_itself_is_named_not_a_longer_one() -> None:
    from opsbook.remote.probes import ray_cluster

    folder = "/tmp/opsbook-ray-6380-127.0.0.1"
    assert ray_cluster.names_folder(f"gcs_server --log_dir={folder}/session_1/logs", folder)
    assert not ray_cluster.names_folder(f"gcs_server --log_dir={folder}0/session_1/logs", folder)


@pytest.mark.parametrize(
    ("output", "failure"),
    [
        (
            "RuntimeError: Version mismatch: The cluster was started with:\n    Ray: 2.58.0\n"
            "This process on node 10.0.0.2 was started with:\n    Ray: 2.57.0",
            "ray-version-mismatch",
        ),
        (
            "(gcs_server) grpc_server.cc:134: Check failed: server_ Failed to start the grpc "
            "server. The specified port is 6380. This means",
            "ray-head-port-taken",
        ),
        (
            "ConnectionError: Unable to connect to GCS (ray head) at 10.0.0.1:6380. Check that",
            "ray-node-not-joined",
        ),
        ("Traceback (most recent call last):\nValueError: boom", ""),
    ],
)
def test_a_failed_ray_start_is_classed_by_the_catalogue(output: str, failure: str) -> None:
    assert cluster.start_failure(output)[0] == failure


def test_a_version_mismatch_at_ray_start_fails_the_launch_with_its_own_class() -> None:
    from opsbook.remote.testing import Answer, FakeHost

    mismatch = (
        "RuntimeError: Version mismatch: The cluster was started with:\n    Ray: 2.58.0\n"
        "This process on node gpu-02 was started with:\n    Ray: 2.57.0\n"
    )
    head, worker, _ = fake_pair()
    broken = FakeHost(
        "gpu-02",
        commands={"ray start": Answer(exit_code=1, stderr=mismatch), "mkdir|rm -rf": ""},
        probes={"ray_node": {"processes": [], "pgids": [], "signalled": []}},
    )
    result = cluster.start_cluster([head, broken], two_node_deployment())
    assert not result.ok and result.failure_id == "ray-version-mismatch"
    assert "Version mismatch" in result.message
    assert "never a bare `ray stop`" in result.findings[-1].remedy


def test_a_worker_that_never_joins_has_its_own_class(monkeypatch) -> None:
    monkeypatch.setattr(cluster, "JOIN_POLL", 0.01)
    head, worker, _ = fake_pair(join=False)
    result = cluster.start_cluster([head, worker], two_node_deployment(), join_timeout=0.1)
    assert result.failure_id == "ray-node-not-joined"


def test_a_node_address_ray_replaces_is_an_error_before_anything_starts() -> None:
    head, worker = cluster.nodes_of(localhost_pair())
    found = cluster_preflight.node_findings(head.host.name, head, NodeAnswer(), [head, worker])
    assert [f.severity for f in found] == ["error"]
    assert "127.0.0.1" in found[0].message and "VLLM_HOST_IP" in found[0].remedy
    assert cluster_preflight.node_findings(worker.host.name, worker, NodeAnswer()) == []


def test_the_cluster_diagnose_reports_an_unreachable_worker_as_unreachable(monkeypatch) -> None:
    from opsbook.core.results import State
    from opsbook.remote.testing import FakeHost
    from opsbook.stages import cluster_launch
    from opsbook.stages import diagnose as single

    head, _, _ = fake_pair()
    head.commands["^true$"] = ""
    lost = FakeHost("gpu-02", unreachable=True)
    monkeypatch.setattr(single, "run", lambda host, view, options: single_ok())

    found = cluster_launch.diagnose([head, lost], two_node_deployment(), single.Options())

    assert found[lost.name].state is State.UNREACHABLE
    assert found[head.name].state is State.OK


def single_ok() -> Any:
    from opsbook.core.results import Result, State
    from opsbook.stages.base import Report

    return Report(State.OK, Result(True, "ready"))


def test_a_node_s_stop_finds_its_own_folder_s_processes_not_a_longer_one_s() -> None:
    import os

    from opsbook.remote.probes import ray_node

    folder = "/tmp/opsbook-ray-6380-127.0.0.1"
    uid = os.getuid()
    mine = {"pid": 101, "ppid": 1, "pgid": 101, "uid": uid, "cmd": f"raylet --temp_dir={folder}"}
    other = {"pid": 202, "ppid": 1, "pgid": 202, "uid": uid, "cmd": f"raylet --temp_dir={folder}0"}
    found, pgids = ray_node._ours([mine, other], folder, [])
    assert [p["pid"] for p in found] == [101] and pgids == [101]
