"""One model across nodes: the Ray cluster under vLLM, as vLLM's multi-node serving documents it.

A deployment with a ``cluster:`` section (:class:`opsbook.core.deployment.ClusterSpec`) is served by
one vLLM on its head with ``--distributed-executor-backend ray``, its ranks placed by Ray on
every host. This module starts and stops that cluster:

- :func:`start_cluster`: the head first (``ray start --head``), then the workers one at a time,
  each started detached and proven to have joined before the next: the cluster's node and GPU
  counts are read through Ray's own state API (``ray.nodes()``, probe ``ray_cluster``), never
  by sleeping. A node already in the cluster is left as it is, so running it again changes
  nothing.
- :func:`stop_cluster`: stops on each node only the Ray processes opsbook started there: those
  naming the node's own temp folder and the process groups recorded at start (probe
  ``ray_node``); never a broad ``ray stop``, which would end every Ray of the machine's user.

Each node's address for Ray is its ``VLLM_HOST_IP`` when the deployment sets one for it, else
the address opsbook reaches it at. The node's temp folder (``--temp-dir``) is its own:
``/tmp/opsbook-ray-<port>-<address>`` (short: Ray's Unix sockets live under it).
"""

from __future__ import annotations

import dataclasses
import json
import posixpath
import shlex
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from opsbook.core.deployment import ClusterSpec, Deployment, HostSpec
from opsbook.core.exceptions import DeploymentError, OpsbookError, ProbeError
from opsbook.core.results import Finding, Result
from opsbook.knowledge.logscan import diagnose_log, failure_for
from opsbook.knowledge.logscan.catalogue import entry_by_id, entry_with
from opsbook.remote.protocol import RemoteHost

NODE_RECORD = "ray-node.json"
JOIN_TIMEOUT = 60.0
JOIN_POLL = 0.5
STOP_GRACE = 5.0
START_TIMEOUT = 120.0
# Small nodes: the rehearsal hosts share one machine. Real nodes get Ray's defaults except
# the dashboard, which vLLM does not need.
RAY_START_OPTIONS = ("--disable-usage-stats",)
HEAD_OPTIONS = ("--include-dashboard=false",)


@dataclass(frozen=True)
class Node:
    """One host of the cluster as Ray sees it."""

    host: HostSpec
    address: str
    head: bool
    python: str
    state_dir: str
    env: dict[str, str] = field(default_factory=dict)

    @property
    def ray(self) -> str:
        """The ``ray`` command of the deployment's python env."""
        folder = posixpath.dirname(self.python)
        return posixpath.join(folder, "ray") if folder else "ray"

    def temp_dir(self, port: int) -> str:
        return f"/tmp/opsbook-ray-{port}-{self.address}"


@dataclass(frozen=True)
class Member:
    """A node as the cluster's state API lists it: the address Ray registered it under, its
    liveness and GPUs, its ``--temp-dir`` and whether the address is loopback or one of the
    head machine's own (``local``)."""

    address: str
    alive: bool
    gpus: float
    temp_dir: str = ""
    local: bool = False


@dataclass(frozen=True)
class ClusterNodes:
    """What the cluster state API reports, or why it could not be asked (``error``; ``holder``:
    what holds the head's port instead of this cluster's Ray head, described)."""

    members: tuple[Member, ...]
    ray_version: str = ""
    error: str = ""
    holder: str = ""

    @classmethod
    def parse(cls, answer: Mapping[str, Any]) -> ClusterNodes:
        """The ``ray_cluster`` probe's answer (opsbook/remote/probes/ray_cluster.py)."""
        if answer.get("error"):
            held = answer.get("holder")
            return cls((), error=str(answer["error"]), holder=_holder_text(held) if held else "")
        members = tuple(
            Member(
                str(n["address"]),
                bool(n["alive"]),
                float(n["gpus"]),
                str(n.get("temp_dir") or ""),
                bool(n.get("local")),
            )
            for n in answer.get("nodes", [])
        )
        return cls(members, str(answer.get("ray_version") or ""))

    def registered(self) -> dict[str, float]:
        """Per address Ray registered an alive node under, its GPUs."""
        return {m.address: m.gpus for m in self.members if m.alive}

    def member(self, node: Node, port: int) -> Member | None:
        """The alive member that is ``node``: the one whose temp folder is the node's own, else
        the one at the node's address. Ray registers a node told ``127.0.0.1`` (or
        ``localhost``, ``::1``) under the machine's own address instead (ray 2.58.0
        python/ray/scripts/scripts.py ``start``: ``services.resolve_ip_for_localhost``); that
        address is taken only when it is a loopback one or the machine's own."""
        alive = [m for m in self.members if m.alive]
        for m in alive:
            if m.temp_dir == node.temp_dir(port):
                if m.address == node.address or (node.address in RAY_LOCALHOST and m.local):
                    return m
        return next((m for m in alive if m.address == node.address), None)

    def alive(self, nodes: Sequence[Node], port: int) -> dict[str, float]:
        """Per address of ``nodes`` (as the deployment names it) in the cluster, its GPUs."""
        found = {}
        for node in nodes:
            m = self.member(node, port)
            if m is not None:
                found[node.address] = m.gpus
        return found


# The addresses ``ray start --node-ip-address`` replaces by the machine's own (ray 2.58.0
# ray/_raylet.so ``is_localhost``, as python/ray/_private/services.py resolve_ip_for_localhost
# documents it: "localhost", "127.0.0.1" or "::1").
RAY_LOCALHOST = ("localhost", "127.0.0.1", "::1")


def _holder_text(holder: Mapping[str, Any]) -> str:
    what = "a Ray GCS" if holder.get("ray") else "a process"
    pid = holder.get("pid")
    if pid is None:
        among = "; ".join(holder.get("candidates") or []) or "none visible to this user"
        return f"a process of user {holder.get('user')} (one of: {among})"
    return f"{what} of user {holder.get('user')} (PID {pid}: {str(holder.get('cmd'))[:120]})"


@dataclass(frozen=True)
class NodeOptions:
    """How ``ray start`` sizes a node (the rehearsal hosts pass small values)."""

    num_cpus: int | None = None
    num_gpus: int | None = None
    object_store_bytes: int | None = None

    def flags(self) -> list[str]:
        found = []
        if self.num_cpus is not None:
            found.append(f"--num-cpus={int(self.num_cpus)}")
        if self.num_gpus is not None:
            found.append(f"--num-gpus={int(self.num_gpus)}")
        if self.object_store_bytes is not None:
            found.append(f"--object-store-memory={int(self.object_store_bytes)}")
        return found


def cluster_of(deployment: Deployment) -> ClusterSpec:
    """The deployment's cluster section.

    Raises:
        DeploymentError: the deployment has none.
    """
    if deployment.cluster is None:
        raise DeploymentError(
            f"{deployment.source or deployment.name} has no cluster section",
            remedy="add cluster: {head: HOST, tensor_parallel_size: 8, pipeline_parallel_size: 2}",
        )
    return deployment.cluster


def nodes_of(deployment: Deployment) -> list[Node]:
    """The cluster's nodes, head first, each as its host sees the deployment."""
    cluster = cluster_of(deployment)
    nodes = []
    for spec in deployment.hosts:
        view = deployment.for_host(spec)
        address = view.env.get("VLLM_HOST_IP") or spec.address
        head = cluster.head in (spec.name, spec.address)
        nodes.append(Node(spec, address, head, view.python, view.state_dir, dict(view.env)))
    return sorted(nodes, key=lambda n: not n.head)


def head_address(deployment: Deployment) -> str:
    """``HOST:PORT`` of the Ray head's GCS, as ``RAY_ADDRESS`` names it."""
    head = nodes_of(deployment)[0]
    return f"{head.address}:{cluster_of(deployment).ray_port}"


def with_cluster_settings(view: Deployment) -> Deployment:
    """A host's deployment with what serving across the cluster adds: the parallel sizes and
    the Ray executor as serve arguments; ``RAY_ADDRESS`` and, with an interface named,
    ``NCCL_SOCKET_IFNAME`` / ``GLOO_SOCKET_IFNAME`` in the environment. Unchanged without a
    cluster. Values the file sets itself win."""
    cluster = view.cluster
    if cluster is None:
        return view
    args = {
        "tensor-parallel-size": cluster.tensor_parallel_size,
        "pipeline-parallel-size": cluster.pipeline_parallel_size,
        "distributed-executor-backend": "ray",
        **view.serve_args,
    }
    head_ip = cluster.head
    if any(cluster.head in (h.name, h.address) for h in view.hosts):
        head_ip = view.env.get("VLLM_HOST_IP") or view.hosts[0].address
    env = {"RAY_ADDRESS": f"{_host_part(head_ip)}:{cluster.ray_port}"}
    if cluster.interface:
        env |= {"NCCL_SOCKET_IFNAME": cluster.interface, "GLOO_SOCKET_IFNAME": cluster.interface}
    return dataclasses.replace(view, serve_args=args, env={**env, **view.env})


def _host_part(name: str) -> str:
    """The address of a host name in ``user@address:port`` form."""
    return name.split("@")[-1].rsplit(":", 1)[0] if ":" in name.split("@")[-1] else name


@dataclass(frozen=True)
class RayProcess:
    """A Ray process of a node, as the ``ray_node`` probe found it."""

    pid: int
    pgid: int
    uid: int | None = None
    ppid: int | None = None
    cmd: str = ""


@dataclass(frozen=True)
class RayNodeAnswer:
    """The ``ray_node`` probe's answer (opsbook/remote/probes/ray_node.py): the node's Ray
    processes that opsbook started, their process groups, and the groups it signalled."""

    processes: list[RayProcess]
    pgids: list[int] = field(default_factory=list)
    signalled: list[int] = field(default_factory=list)

    @classmethod
    def parse(cls, answer: Mapping[str, Any]) -> RayNodeAnswer:
        found = [
            RayProcess(
                pid=int(p["pid"]),
                pgid=int(p["pgid"]),
                uid=p.get("uid"),
                ppid=p.get("ppid"),
                cmd=str(p.get("cmd") or ""),
            )
            for p in answer.get("processes") or []
        ]
        pgids = [int(g) for g in answer.get("pgids") or []]
        return cls(found, pgids, [int(g) for g in answer.get("signalled") or []])


def _ray_node(host: Any, args: dict[str, Any]) -> RayNodeAnswer:
    return RayNodeAnswer.parse(host.probe("ray_node", args))


@dataclass(kw_only=True, repr=False)
class JoinResult(Result):
    """The cluster's alive nodes (the deployment's address for each: GPUs), the head's address
    when it was started, and the failure id of a cluster that did not form."""

    nodes: dict[str, float] = field(default_factory=dict)
    address: str = ""
    failure_id: str = ""


@dataclass(kw_only=True, repr=False)
class NodeStopResult(Result):
    """A node's Ray stopped: the PIDs signalled."""

    stopped: list[int] = field(default_factory=list)


# Starting.


def start_cluster(
    hosts: Sequence[RemoteHost],
    deployment: Deployment,
    *,
    options: dict[str, NodeOptions] | None = None,
    join_timeout: float = JOIN_TIMEOUT,
) -> JoinResult:
    """Start the head, then each worker in turn, each proven joined before the next.

    Args:
        hosts: one connected :class:`opsbook.remote.hosts.Host` (or test double) per deployment
        host.
        deployment: the deployment, with its cluster section.
        options: per host name, how to size its node (default: Ray's own sizing).
        join_timeout: seconds a node may take to appear in the cluster.

    Returns:
        ok with a finding per node (its address and GPUs) when every node is in the cluster;
        otherwise not ok, naming the node that did not start or join, with the failure id.
    """
    cluster = cluster_of(deployment)
    by_name = {h.name: h for h in hosts}
    nodes = nodes_of(deployment)
    missing = [n.host.name for n in nodes if n.host.name not in by_name]
    if missing:
        absent = [Finding("error", m, "not in this run (a stage before failed?)") for m in missing]
        message = f"the cluster needs every node; not in this run: {', '.join(missing)}"
        return JoinResult(False, message, findings=absent)
    address = head_address(deployment)
    head_host = by_name[nodes[0].host.name]
    findings: list[Finding] = []
    expected: list[Node] = []
    joined = JoinResult(True, "")
    for node in nodes:
        host = by_name[node.host.name]
        state = cluster_nodes(head_host, nodes[0], address)
        if state.holder:
            return port_held(nodes[0], cluster.ray_port, state)
        if state.member(node, cluster.ray_port) is not None:
            findings.append(Finding("ok", node.host.name, f"{node.address} already in the cluster"))
        else:
            sizing = (options or {}).get(node.host.name) or NodeOptions()
            started = start_node(host, node, cluster, address, sizing)
            if not started.ok:
                return dataclasses.replace(started, findings=findings + started.findings)
        expected.append(node)
        joined = wait_joined(head_host, nodes[0], address, expected, join_timeout)
        if not joined.ok:
            return dataclasses.replace(joined, findings=findings + joined.findings)
        gpus = joined.nodes.get(node.address, 0)
        findings.append(Finding("ok", node.host.name, f"joined as {node.address}: {gpus:g} GPU(s)"))
    total = sum(joined.nodes.values())
    message = f"Ray cluster at {address}: {len(nodes)} node(s), {total:g} GPU(s)"
    return JoinResult(True, message, findings=findings, nodes=joined.nodes, address=address)


def port_held(head: Node, port: int, state: ClusterNodes) -> JoinResult:
    """The head's port is held by something that is not this cluster's Ray head."""
    message = (
        f"the Ray head's port {head.address}:{port} on {head.host.name} is held by "
        f"{state.holder}, not by this cluster's Ray head"
    )
    remedy = (
        "stop that process if it is yours (by its PID), or set another cluster.ray_port; never "
        "a bare `ray stop`, which ends every Ray of the user"
    )
    finding = Finding("error", head.host.name, message, remedy=remedy)
    failure = failure_for("ray-port-held")
    return JoinResult(False, message, findings=[finding], failure_id=failure)


def start_node(
    host: RemoteHost, node: Node, cluster: ClusterSpec, head: str, options: NodeOptions
) -> JoinResult:
    """``ray start`` on one node (the head, or a worker joining ``head``, ``HOST:PORT``),
    detached from the SSH session in a session of its own; its processes are recorded."""
    temp_dir = node.temp_dir(cluster.ray_port)
    _clear_stale_session(host, temp_dir)
    words = [node.ray, "start", f"--node-ip-address={node.address}", f"--temp-dir={temp_dir}"]
    if node.head:
        words += ["--head", f"--port={cluster.ray_port}", *HEAD_OPTIONS]
    else:
        words += [f"--address={head}"]
    words += [*RAY_START_OPTIONS, *options.flags()]
    env = {"RAY_USAGE_STATS_ENABLED": "0"}
    for name in ("VLLM_HOST_IP", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"):
        if node.env.get(name):
            env[name] = node.env[name]
    if cluster.interface:
        env |= {"NCCL_SOCKET_IFNAME": cluster.interface, "GLOO_SOCKET_IFNAME": cluster.interface}
    command = "setsid " + " ".join(shlex.quote(w) for w in words) + " </dev/null"
    role = "head" if node.head else "worker"
    done = host.run(
        command, env=env, timeout=START_TIMEOUT, label=f"ray start ({role}) on {node.address}"
    )
    if not done.ok:
        output = done.stderr or done.stdout
        failure, line = start_failure(output)
        detail = line or _last_lines(output)
        return JoinResult(
            False,
            f"`ray start` failed on {node.host.name} ({role}, {node.address}): {detail}",
            findings=[Finding("error", node.host.name, detail, remedy=_start_remedy(failure))],
            failure_id=failure,
        )
    found = _ray_node(host, {"temp_dir": temp_dir})
    record = {
        "address": node.address,
        "port": cluster.ray_port,
        "temp_dir": temp_dir,
        "role": role,
        "pgids": found.pgids,
        "pids": [p.pid for p in found.processes],
    }
    _write_record(host, node, record)
    return JoinResult(True, f"Ray {role} started on {node.address}")


def start_failure(output: str) -> tuple[str, str]:
    """The failure class the catalogue finds in ``ray start``'s output (a version mismatch,
    the head's port taken, the head out of reach) and the line that shows it; ("", "") when
    it knows none (a generic traceback is no class of its own)."""
    diagnosis = diagnose_log(output)
    if diagnosis.failure is None or diagnosis.failure == entry_with("fallback").failure:
        return "", ""
    return diagnosis.failure, diagnosis.line.text.strip() if diagnosis.line is not None else ""


def _clear_stale_session(host: RemoteHost, temp_dir: str) -> None:
    """Remove the node's own temp folder when no process uses it: a node that died (SIGKILL,
    a reboot) leaves sockets and a session there that a new ``ray start`` trips over."""
    if _ray_node(host, {"temp_dir": temp_dir}).processes:
        return
    host.run(f"rm -rf -- {shlex.quote(temp_dir)}", label=f"remove the stale Ray folder {temp_dir}")


def wait_joined(
    head_host: RemoteHost, head: Node, address: str, expected: Sequence[Node], timeout: float
) -> JoinResult:
    """Poll the cluster's state API until every expected node is alive in it."""
    port = int(address.rsplit(":", 1)[1])
    deadline = time.monotonic() + timeout
    state = ClusterNodes(())
    while True:
        state = cluster_nodes(head_host, head, address)
        alive = state.alive(expected, port)
        absent = [n for n in expected if n.address not in alive]
        if not absent or state.holder:
            break
        if time.monotonic() >= deadline:
            break
        time.sleep(JOIN_POLL)
    if not absent:
        return JoinResult(True, f"{len(alive)} node(s) in the cluster", nodes=alive)
    if state.holder:
        return port_held(head, port, state)
    names = ", ".join(n.address for n in absent)
    why = state.error or f"the cluster has {', '.join(sorted(state.registered())) or 'no node'}"
    return JoinResult(
        False,
        f"node {names} did not join the Ray cluster at {address} within {timeout:g} s ({why})",
        findings=[
            Finding(
                "error",
                n.host.name,
                f"{n.address} is not in the Ray cluster",
                remedy=_join_remedy(n.address),
            )
            for n in absent
        ],  # fmt: skip
        nodes=alive,
        failure_id=failure_for("ray-join-timeout"),
    )


def cluster_nodes(head_host: RemoteHost, head: Node, address: str) -> ClusterNodes:
    """The cluster's nodes through Ray's state API, asked from the head: first what holds the
    head's port (named within a second when it is not this cluster's Ray head)."""
    port = int(address.rsplit(":", 1)[1])
    args = {"address": address, "node_ip": head.address, "temp_dir": head.temp_dir(port)}
    try:
        answer = head_host.probe("ray_cluster", args, python=head.python)
    except ProbeError as e:
        # A driver that dies inside Ray (another user's session files) answers no JSON.
        return ClusterNodes((), error=f"asking the Ray cluster failed: {e.message}")
    return ClusterNodes.parse(answer)


def missing_nodes(head_host: RemoteHost, deployment: Deployment) -> list[Node]:
    """The nodes of the deployment that the cluster does not list as alive."""
    nodes = nodes_of(deployment)
    state = cluster_nodes(head_host, nodes[0], head_address(deployment))
    alive = state.alive(nodes, cluster_of(deployment).ray_port)
    return [n for n in nodes if n.address not in alive]


def status(head_host: RemoteHost, deployment: Deployment) -> JoinResult:
    """Which of the deployment's nodes the cluster lists as alive, and their GPUs."""
    nodes = nodes_of(deployment)
    address = head_address(deployment)
    state = cluster_nodes(head_host, nodes[0], address)
    alive = state.alive(nodes, cluster_of(deployment).ray_port)
    findings = [
        Finding("ok", n.host.name, f"{n.address}: {alive[n.address]:g} GPU(s)")
        if n.address in alive
        else Finding("error", n.host.name, f"{n.address} is not in the cluster")
        for n in nodes
    ]
    ok = all(n.address in alive for n in nodes)
    why = f" ({state.error})" if state.error else ""
    message = f"Ray cluster at {address}: {len(alive)} of {len(nodes)} node(s) alive{why}"
    failure = failure_for("ray-port-held") if state.holder else ""
    return JoinResult(ok, message, findings=findings, nodes=alive, failure_id=failure)


# Stopping.


def stop_cluster(hosts: Sequence[RemoteHost], deployment: Deployment) -> Result:
    """Stop the Ray processes opsbook started on each node: workers first, the head last."""
    cluster = cluster_of(deployment)
    by_name = {h.name: h for h in hosts}
    findings: list[Finding] = []
    stopped = 0
    for node in reversed(nodes_of(deployment)):
        host = by_name.get(node.host.name)
        if host is None:
            findings.append(Finding("warning", node.host.name, "not in this run: not stopped"))
            continue
        try:
            done = stop_node(host, node, cluster)
        except OpsbookError as e:
            findings.append(Finding("error", node.host.name, e.message, e.remedy or ""))
            continue
        stopped += len(done.stopped)
        findings += done.findings or [Finding("ok", node.host.name, done.message)]
    ok = not any(f.is_problem for f in findings)
    message = f"Ray stopped on the cluster's nodes: {stopped} process(es)"
    return Result(ok, message, findings=findings)


def stop_node(
    host: RemoteHost, node: Node, cluster: ClusterSpec, grace: float = STOP_GRACE
) -> NodeStopResult:
    """SIGTERM the node's recorded process groups, wait, SIGKILL what is left."""
    record = _read_record(host, node)
    temp_dir = str(record.get("temp_dir") or node.temp_dir(cluster.ray_port))
    args = {"temp_dir": temp_dir, "pgids": record.get("pgids") or []}
    first = _ray_node(host, {**args, "signal": "TERM"})
    pids = [p.pid for p in first.processes]
    args["pids"] = pids
    deadline = time.monotonic() + grace
    left = first
    while left.processes and time.monotonic() < deadline:
        time.sleep(0.25)
        left = _ray_node(host, args)
    if left.processes:
        _ray_node(host, {**args, "signal": "KILL"})
        time.sleep(0.25)
        left = _ray_node(host, args)
    findings = []
    if left.processes:
        still = ", ".join(str(p.pid) for p in left.processes)
        findings.append(Finding("error", node.host.name, f"Ray processes still running: {still}"))
    else:
        # The node's own folder (sessions, sockets, logs) goes with it.
        host.run(f"rm -rf -- {shlex.quote(temp_dir)}", label=f"remove the Ray folder {temp_dir}")
    message = f"{len(pids)} Ray process(es) stopped on {node.address}"
    return NodeStopResult(not findings, message, findings=findings, stopped=pids)


def node_processes(host: RemoteHost, node: Node, cluster: ClusterSpec) -> list[RayProcess]:
    """The Ray processes opsbook started on a node that still run."""
    record = _read_record(host, node)
    temp_dir = str(record.get("temp_dir") or node.temp_dir(cluster.ray_port))
    return _ray_node(host, {"temp_dir": temp_dir, "pgids": record.get("pgids") or []}).processes


# Records on the node.


def _record_path(node: Node) -> str:
    return posixpath.join(node.state_dir, NODE_RECORD)


def _write_record(host: RemoteHost, node: Node, record: dict[str, Any]) -> None:
    path = _record_path(node)
    host.run(f"mkdir -p -- {shlex.quote(node.state_dir)}", label=f"mkdir {node.state_dir}")
    host.upload(path, json.dumps(record, indent=2) + "\n")


def _read_record(host: RemoteHost, node: Node) -> dict[str, Any]:
    path = _record_path(node)
    done = host.run(f"cat -- {shlex.quote(path)} 2>/dev/null || true", label=f"read {path}")
    try:
        found = json.loads(done.stdout or "{}")
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


def _last_lines(text: str, count: int = 3) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return " | ".join(lines[-count:]) or "(no output)"


def _start_remedy(failure: str) -> str:
    """The catalogue's remedy for the class found, else where to look."""
    if failure:
        return entry_by_id(failure).remedy
    return (
        "read the output above (a missing `ray` means: install ray into the deployment's "
        "python env on this node); `ray start` writes its logs under the node's --temp-dir"
    )


def _join_remedy(address: str) -> str:
    return (
        f"check that {address} is this node's address for Ray (VLLM_HOST_IP) and that the "
        "head's port is reachable from it; read the raylet log under its --temp-dir"
    )


__all__ = [
    "ClusterNodes",
    "Node",
    "NodeOptions",
    "cluster_nodes",
    "cluster_of",
    "head_address",
    "missing_nodes",
    "node_processes",
    "nodes_of",
    "start_cluster",
    "stop_cluster",
    "with_cluster_settings",
]
