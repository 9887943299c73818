"""Preflight across the nodes of a cluster, before anything starts.

Each node gets the single-host preflight; then the nodes are compared, each difference a named
finding with its fix: the same Python, vLLM and Ray on every node (Ray refuses a node whose
versions differ from the head's: ray-project/ray ``python/ray/_private/utils.py``
``check_version_info``, "Version mismatch"), the same GPU model, GPUs enough in total for
tensor parallel x pipeline parallel; on each node, its address for Ray and vLLM
(``VLLM_HOST_IP``) is one of its own, ``NCCL_SOCKET_IFNAME`` / ``GLOO_SOCKET_IFNAME`` name
interfaces it has, and on the head the Ray port is free (probe ``cluster_node``). A node that
disagrees fails, and so does every node that takes part: one model is served by all of them or
by none.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from opsbook import cluster
from opsbook.deployment import ClusterSpec, Deployment
from opsbook.facts import HostFacts
from opsbook.results import Finding, Result, State
from opsbook.stages import preflight
from opsbook.stages.base import Report

RAY_VERSION_COMMAND = "import ray; print(ray.__version__)"


def run(hosts: Sequence[Any], deployment: Deployment) -> dict[str, Report]:
    """Preflight each node, then compare them; one report per host."""
    spec = cluster.cluster_of(deployment)
    nodes = {n.host.name: n for n in cluster.nodes_of(deployment)}
    reports = {h.name: preflight.run(h, deployment.for_host(h.spec)) for h in hosts}
    found = {name: r.detail for name, r in reports.items() if isinstance(r.detail, HostFacts)}
    rays = {h.name: ray_version(h, nodes[h.name].python) for h in hosts if h.name in nodes}
    findings = compare(found, rays, spec.world_size)
    for host in hosts:
        if host.name in nodes:
            findings += node_findings(host, nodes[host.name], spec)
    if not findings:
        return reports
    problem = "; ".join(f.message for f in findings)
    for name, report in reports.items():
        verdict = Result(False, f"the nodes differ: {problem}", findings=findings)
        ray_differs = any(f.subject == "Ray" for f in findings)
        failure = "ray-version-mismatch" if ray_differs else ""
        reports[name] = Report(State.FAILED, verdict, [verdict, *report.shows], failure)
    return reports


INTERFACE_VARIABLES = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")


def node_findings(host: Any, node: cluster.Node, spec: ClusterSpec) -> list[Finding]:
    """This node's address for Ray and vLLM exists here, its NCCL/Gloo interfaces exist, and
    (on the head) the Ray port is free unless opsbook's own Ray holds it."""
    interfaces = {v: node.env.get(v) or spec.interface for v in INTERFACE_VARIABLES}
    ports = []
    if node.head and not cluster.node_processes(host, node, spec):
        ports.append([node.address, spec.ray_port])
    answer = host.probe(
        "cluster_node",
        {"host_ip": node.address, "interfaces": interfaces, "ports": ports},
    )
    findings = []
    if answer.get("host_ip_error"):
        findings.append(
            Finding(
                "error",
                host.name,
                f"{node.address}, this node's address for Ray and vLLM (VLLM_HOST_IP), is not an "
                f"address of this node ({answer['host_ip_error']})",
                remedy="set VLLM_HOST_IP in this host's vars to an address the node has, one the "
                "other nodes reach",
            )
        )
    for variable, value in (answer.get("bad_interfaces") or {}).items():
        findings.append(
            Finding(
                "error",
                host.name,
                f"{variable}={value} names no interface of this node "
                f"(it has {', '.join(answer.get('interfaces') or [])})",
                remedy="name the interface the nodes reach each other over (cluster.interface)",
            )
        )
    for address, port, error in answer.get("taken_ports") or []:
        findings.append(
            Finding(
                "error",
                host.name,
                f"the Ray port {address}:{port} is taken ({error})",
                remedy="stop what holds it, or choose another cluster.ray_port",
            )
        )
    return findings


def ray_version(host: Any, python: str) -> str | None:
    """The version of Ray the deployment's python imports on a host, or None."""
    import shlex

    done = host.run(
        f"{shlex.quote(python)} -c {shlex.quote(RAY_VERSION_COMMAND)} 2>/dev/null",
        label="the Ray version of the deployment's python",
    )
    return done.stdout.strip() or None if done.ok else None


def compare(
    facts: dict[str, HostFacts], rays: dict[str, str | None], world_size: int
) -> list[Finding]:
    """The differences between nodes that stop one vLLM across them."""
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


__all__ = ["compare", "run"]
