"""Preflight across the nodes of a cluster, before anything starts.

Each node gets the single-host preflight; then the nodes are compared, each difference a named
finding with its fix: the same Python, vLLM and Ray on every node (Ray refuses a node whose
versions differ from the head's: ray-project/ray ``python/ray/_private/utils.py``
``check_version_info``, "Version mismatch"), the same torch and NCCL (read from the installed
distributions, torch not imported: probe ``cluster_node``), the same GPU model, GPUs enough in
total for tensor parallel x pipeline parallel; on each node, its address for Ray and vLLM
(``VLLM_HOST_IP``) is one of its own, ``NCCL_SOCKET_IFNAME`` / ``GLOO_SOCKET_IFNAME`` name
interfaces it has, every other node's address answers a TCP connection from it (on that
node's SSH port, the one port known to listen before anything starts), and on the head the Ray
port is free. One probe per node asks all of it. A node that disagrees fails, and so does
every node that takes part: one model is served by all of them or by none.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from opsbook.core.deployment import ClusterSpec, Deployment
from opsbook.core.results import Finding, Result, State
from opsbook.knowledge.logscan import failure_for
from opsbook.remote.protocol import RemoteHost
from opsbook.stages import cluster_reach, preflight
from opsbook.stages.base import Report
from opsbook.steps import cluster
from opsbook.steps.host_facts import HostFacts

RAY_VERSION_COMMAND = "import ray; print(ray.__version__)"


@dataclasses.dataclass(frozen=True)
class Libraries:
    """The torch and NCCL a node's deployment python has (None: not installed), or why they
    could not be read."""

    torch: str | None = None
    nccl: str | None = None
    error: str | None = None

    @classmethod
    def parse(cls, answer: Mapping[str, Any] | None) -> Libraries:
        found = answer or {}
        return cls(found.get("torch"), found.get("nccl"), found.get("error"))


@dataclasses.dataclass(frozen=True)
class TakenPort:
    """A port this node must listen on that something else holds."""

    address: str
    port: int
    error: str


@dataclasses.dataclass(frozen=True)
class Unreached:
    """A peer address a TCP connection from this node did not reach; ``refused``: something
    answered (a closed port, a rejecting firewall), rather than nothing (a timeout)."""

    address: str
    port: int
    error: str
    refused: bool


@dataclasses.dataclass(frozen=True)
class NodeAnswer:
    """The ``cluster_node`` probe's answer (opsbook/remote/probes/cluster_node.py), parsed once
    here where it is read; the tests that run the probe read it through this type too."""

    host_ip_error: str | None = None
    interfaces: list[str] = dataclasses.field(default_factory=list)
    bad_interfaces: dict[str, str] = dataclasses.field(default_factory=dict)
    taken_ports: list[TakenPort] = dataclasses.field(default_factory=list)
    unreached: list[Unreached] = dataclasses.field(default_factory=list)
    libraries: Libraries = Libraries()

    @classmethod
    def parse(cls, answer: Mapping[str, Any]) -> NodeAnswer:
        return cls(
            host_ip_error=answer.get("host_ip_error"),
            interfaces=[str(n) for n in answer.get("interfaces") or []],
            bad_interfaces={
                str(k): str(v) for k, v in (answer.get("bad_interfaces") or {}).items()
            },
            taken_ports=[
                TakenPort(str(a), int(p), str(e)) for a, p, e in answer.get("taken_ports") or []
            ],
            unreached=[
                Unreached(str(a), int(p), str(e), bool(r))
                for a, p, e, r in answer.get("unreached") or []
            ],
            libraries=Libraries.parse(answer.get("libraries")),
        )


def run(
    hosts: Sequence[RemoteHost], deployment: Deployment, options: preflight.Options
) -> dict[str, Report]:
    """Preflight each node, then compare them; one report per host."""
    spec = cluster.cluster_of(deployment)
    nodes = {n.host.name: n for n in cluster.nodes_of(deployment)}
    hosts, lost = cluster_reach.split(hosts)
    reports: dict[str, Report] = {
        h.name: preflight.run(h, deployment.for_host(h.spec), options) for h in hosts
    }
    if lost:
        verdict = cluster_reach.without(lost, "compared")
        failed = {n: Report(State.FAILED, verdict, [verdict, *r.shows]) for n, r in reports.items()}
        return lost | failed
    found = {
        name: r.facts for name, r in reports.items() if isinstance(r, preflight.PreflightReport)
    }
    rays = {h.name: ray_version(h, nodes[h.name].python) for h in hosts if h.name in nodes}
    by_name = {h.name: h for h in hosts}
    # Head first, so that "the head's" version is the first one named.
    answers = {
        name: node_probe(by_name[name], node, spec, list(nodes.values()))
        for name, node in nodes.items()
        if name in by_name
    }
    libraries = {name: answer.libraries for name, answer in answers.items()}
    findings = compare(found, rays, spec.world_size, libraries)
    for name, answer in answers.items():
        findings += node_findings(name, nodes[name], answer, list(nodes.values()))
    problems = [f for f in findings if f.severity == "error"]
    if not problems:
        return {name: _noted(report, findings) for name, report in reports.items()}
    findings = problems + [f for f in findings if f not in problems]
    problem = "; ".join(f.message for f in problems)
    for name, report in reports.items():
        verdict = Result(False, f"the nodes differ: {problem}", findings=findings)
        ray_differs = any(f.subject == "Ray" for f in findings)
        failure = failure_for("ray-versions-differ") if ray_differs else ""
        reports[name] = Report(State.FAILED, verdict, [verdict, *report.shows], failure)
    return reports


def _noted(report: Report, warnings: list[Finding]) -> Report:
    """The report with the cluster's warnings among its findings, its state unchanged."""
    if not warnings:
        return report
    verdict = dataclasses.replace(report.verdict, findings=[*report.verdict.findings, *warnings])
    shown = Result(True, "; ".join(f.message for f in warnings), findings=warnings)
    return dataclasses.replace(report, verdict=verdict, shows=[*report.shows, shown])


INTERFACE_VARIABLES = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")


def node_probe(
    host: RemoteHost, node: cluster.Node, spec: ClusterSpec, nodes: Sequence[cluster.Node]
) -> NodeAnswer:
    """Probe ``cluster_node`` on one node: its address, interfaces and (on the head) Ray port,
    the other nodes' addresses reached from it, its deployment python's torch and NCCL."""
    interfaces = {v: node.env.get(v) or spec.interface for v in INTERFACE_VARIABLES}
    ports = []
    if node.head and not cluster.node_processes(host, node, spec):
        ports.append([node.address, spec.ray_port])
    reach = [[peer.address, peer.host.port] for peer in nodes if peer.host != node.host]
    answer = host.probe(
        "cluster_node",
        {
            "host_ip": node.address,
            "interfaces": interfaces,
            "ports": ports,
            "reach": reach,
            "python": node.python,
        },
    )
    return NodeAnswer.parse(answer)


def node_findings(
    name: str, node: cluster.Node, answer: NodeAnswer, nodes: Sequence[cluster.Node] = ()
) -> list[Finding]:
    """From a node's ``cluster_node`` answer: its address for Ray and vLLM exists there, its
    NCCL/Gloo interfaces exist, the other nodes' addresses answer from it, and (on the head)
    the Ray port is free unless opsbook's own Ray holds it."""
    findings = []
    if node.address in cluster.RAY_LOCALHOST:
        findings.append(ray_replaces(name, node))
    if answer.host_ip_error:
        findings.append(
            Finding(
                "error",
                name,
                f"{node.address}, this node's address for Ray and vLLM (VLLM_HOST_IP), is not an "
                f"address of this node ({answer.host_ip_error})",
                remedy="set VLLM_HOST_IP in this host's vars to an address the node has, one the "
                "other nodes reach",
            )
        )
    for variable, value in answer.bad_interfaces.items():
        findings.append(
            Finding(
                "error",
                name,
                f"{variable}={value} names no interface of this node "
                f"(it has {', '.join(answer.interfaces)})",
                remedy="name the interface the nodes reach each other over (cluster.interface)",
            )
        )
    for taken in answer.taken_ports:
        findings.append(
            Finding(
                "error",
                name,
                f"the Ray port {taken.address}:{taken.port} is taken ({taken.error})",
                remedy="stop what holds it, or choose another cluster.ray_port",
            )
        )
    peers = {peer.address: peer for peer in nodes}
    for miss in answer.unreached:
        peer = peers.get(miss.address)
        if peer is not None:
            findings.append(reach_finding(name, peer, miss.port, miss.error, miss.refused))
    return findings


def ray_replaces(name: str, node: cluster.Node) -> Finding:
    """A node's address for Ray that Ray itself replaces: told ``127.0.0.1`` (``localhost``,
    ``::1``), ``ray start`` registers the node under the machine's own address (ray 2.58.0
    python/ray/scripts/scripts.py ``start``: services.resolve_ip_for_localhost), while vLLM on
    the head asks Ray for a bundle on ``node:<VLLM_HOST_IP>`` (vLLM 0.32.0
    vllm/v1/executor/ray_utils.py initialize_ray_cluster), which no node then offers: the
    placement group waits until vLLM gives up."""
    return Finding(
        "error",
        name,
        f"{node.address}, this node's address for Ray and vLLM, is one Ray replaces by the "
        "machine's own address, so vLLM's placement on node:" + node.address + " never happens",
        remedy="set VLLM_HOST_IP in this host's vars to another address of the node (on one "
        "machine: another loopback address, such as 127.0.0.2)",
    )


def reach_finding(name: str, peer: cluster.Node, port: int, error: str, refused: bool) -> Finding:
    """Node ``name`` could not open a TCP connection to ``peer``'s address for Ray and vLLM.

    Lost (a timeout, no route) is an error. Refused means the address answered: when it is
    the address opsbook reaches the peer's SSH at, SSH listens there, so this node is being
    rejected (a firewall), an error too; when it is another address (``VLLM_HOST_IP``), SSH may
    not listen on it, so the refusal proves nothing wrong: a warning.
    """
    whose = f"{peer.host.name}'s address for Ray and vLLM {peer.address}"
    message = f"{name} cannot reach {whose} (TCP port {port}: {error})"
    if refused and peer.address != peer.host.address:
        return Finding(
            "warning",
            name,
            f"{message}; SSH may listen only on {peer.host.address}, so this proves nothing",
            remedy=f"check that {peer.address} is the address the nodes reach each other at",
        )
    return Finding(
        "error",
        name,
        message,
        remedy=f"open the firewall between the nodes, or set VLLM_HOST_IP in {peer.host.name}'s "
        "vars to an address of it that the other nodes reach",
    )


def ray_version(host: RemoteHost, python: str) -> str | None:
    """The version of Ray the deployment's python imports on a host, or None."""
    import shlex

    done = host.run(
        f"{shlex.quote(python)} -c {shlex.quote(RAY_VERSION_COMMAND)} 2>/dev/null",
        label="the Ray version of the deployment's python",
    )
    return done.stdout.strip() or None if done.ok else None


def compare(
    facts: dict[str, HostFacts],
    rays: dict[str, str | None],
    world_size: int,
    libraries: dict[str, Libraries] | None = None,
) -> list[Finding]:
    """The differences between nodes that stop one vLLM across them (``libraries`` head
    first)."""
    findings = []
    checks = {
        "vLLM": {n: f.vllm_version for n, f in facts.items()},
        "Python": {n: f.python.version for n, f in facts.items()},
        "Ray": rays,
        "GPU model": {
            n: ", ".join(sorted({g.name for g in f.gpus})) or None for n, f in facts.items()
        },
    }
    for what, values in checks.items():
        distinct = sorted({str(v) for v in values.values()})
        if len(distinct) > 1:
            each = ", ".join(f"{name}: {value}" for name, value in values.items())
            findings.append(
                Finding(
                    "error",
                    what,
                    f"{what} differs between the nodes ({each})",
                    remedy=f"install the same {what} on every node (the head's), then run again",
                )
            )
        elif what == "Ray" and distinct == ["None"]:
            findings.append(
                Finding(
                    "error", what, "Ray is not installed", remedy="pip install ray on every node"
                )
            )
    for what, versions in _library_versions(libraries or {}).items():
        finding = library_finding(what, versions)
        if finding is not None:
            findings.append(finding)
    total = sum(len(f.gpus) for f in facts.values())
    if total < world_size:
        findings.append(
            Finding(
                "error",
                "GPUs",
                f"the nodes have {total} GPU(s), tensor x pipeline parallel needs {world_size}",
                remedy="add nodes, or lower tensor_parallel_size / pipeline_parallel_size",
            )
        )
    return findings


def _library_versions(libraries: dict[str, Libraries]) -> dict[str, dict[str, str | None]]:
    return {
        "torch": {name: found.torch for name, found in libraries.items()},
        "NCCL": {name: found.nccl for name, found in libraries.items()},
    }


def library_finding(what: str, versions: dict[str, str | None]) -> Finding | None:
    """torch or NCCL differing between the nodes (the first node is the head), naming each
    node's version; absent everywhere is not a difference."""
    if len(set(versions.values())) <= 1:
        return None
    shown = {name: value or "not installed" for name, value in versions.items()}
    each = ", ".join(f"{name}: {value}" for name, value in shown.items())
    head, want = next(iter(shown.items()))
    others = sorted({v for v in shown.values() if v != want})
    how = (
        "torch pins its NCCL (nvidia-nccl-cu* in its requirements): install the torch that "
        "brings it"
        if what == "NCCL"
        else "pip install it in the deployment's python"
    )
    return Finding(
        "error",
        what,
        f"{what} differs between the nodes ({each})",
        remedy=f"install the head's {what} ({want}, on {head}) on every node in place of "
        f"{' / '.join(others)}; {how}, then run again",
    )


__all__ = [
    "Libraries",
    "NodeAnswer",
    "TakenPort",
    "Unreached",
    "compare",
    "library_finding",
    "reach_finding",
    "run",
]
