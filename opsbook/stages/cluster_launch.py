"""Launch across nodes: the Ray cluster first, then one vLLM on the head over all of them.

For a deployment with a ``cluster`` section the launch stage acts on its hosts together: stop
the server opsbook started on the head, start the Ray head and then each worker (proven joined,
:func:`opsbook.steps.cluster.start_cluster`), start the launch script on the head (it carries
``--distributed-executor-backend ray`` and the parallel sizes), follow it to ready while
watching the cluster, and smoke-test it. A node that is missing or leaves while the model loads
ends the launch within seconds, naming the node; whatever opsbook started for it is stopped.

Unlike the launch on one host, a cluster's apply restarts the head's server and Ray on every
node each time (``restart`` is not read): leaving a ready server alone would also need every
node's place in the Ray cluster in the decision (a worker that left must restart it), and its
dry run reports that place, not the head's server. The head's launch record notes what the
server runs all the same (:func:`opsbook.steps.restart_rule.run_inputs`), for that rule.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from opsbook.core.deployment import Deployment
from opsbook.core.exceptions import OpsbookError
from opsbook.core.results import Finding, Result, State
from opsbook.knowledge.logscan import failure_for
from opsbook.remote.protocol import RemoteHost
from opsbook.stages.base import Report
from opsbook.stages.launch_server import Options, _phases
from opsbook.steps import cluster, plots, restart_rule, script, server

if TYPE_CHECKING:
    from opsbook.stages import diagnose as single

# How often the cluster's nodes are counted while the model loads.
WATCH_EVERY = 3.0
# Variables of a node's environment (the deployment's server.env, as that node sees it) that
# size its Ray node: the rehearsal hosts share one machine.
NUM_CPUS_VAR = "OPSBOOK_RAY_NUM_CPUS"
OBJECT_STORE_VAR = "OPSBOOK_RAY_OBJECT_STORE_BYTES"
# The failure ids of the catalogue's entries raised by these findings (their raised_by).
RAY_NODE_DIED = failure_for("ray-node-lost")
RAY_RESOURCES = failure_for("ray-resources-short")


class NodeLost(OpsbookError):
    """A node of the cluster left while the server was starting."""


def run(hosts: Sequence[RemoteHost], deployment: Deployment, options: Options) -> dict[str, Report]:
    """The launch stage on a cluster: one report per host (head and workers)."""
    stop_grace = options.stop_grace
    nodes = cluster.nodes_of(deployment)
    by_name = {h.name: h for h in hosts}
    head = nodes[0]
    if head.host.name not in by_name:
        verdict = Result(False, f"the cluster's head {head.host.name} is not in this run")
        return {h.name: Report(State.FAILED, verdict) for h in hosts}
    if not options.apply:
        return _dry_run(by_name, deployment)
    head_host = by_name[head.host.name]
    view = cluster.with_cluster_settings(deployment.for_host(head.host))
    paths = server.resolve_paths(head_host, view)
    stopped = server.stop_previous(head_host, paths, grace=stop_grace)
    if not stopped.ok:
        return _all(hosts, head.host.name, Report(State.FAILED, stopped, [stopped]))
    node_options = {n.host.name: _node_options(by_name.get(n.host.name), n) for n in nodes}
    joined = _start_cluster(hosts, deployment, node_options)
    if not joined.ok:
        cluster.stop_cluster(hosts, deployment)
        return _all(hosts, head.host.name, Report(State.FAILED, joined, [joined], RAY_RESOURCES))
    report = _launch_on_head(head_host, hosts, deployment, view, paths, options.ready_timeout)
    if report.state is State.FAILED:
        server.stop_server(head_host, paths, grace=stop_grace)
        cluster.stop_cluster(hosts, deployment)
    return _per_node(hosts, deployment, report, joined)


def _node_options(host: RemoteHost | None, node: cluster.Node) -> cluster.NodeOptions:
    """Each node offers Ray the GPUs its nvidia-smi lists (vLLM's bundles ask for ``GPU``)."""
    gpus = None
    if host is not None:
        done = host.run(
            "nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null | wc -l",
            label="count the GPUs nvidia-smi lists",
        )
        gpus = int(done.stdout.strip() or 0) if done.ok else None
    cpus = node.env.get(NUM_CPUS_VAR)
    store = node.env.get(OBJECT_STORE_VAR)
    return cluster.NodeOptions(
        num_cpus=int(cpus) if cpus else None,
        num_gpus=gpus or None,
        object_store_bytes=int(store) if store else None,
    )


def _start_cluster(
    hosts: Sequence[RemoteHost], deployment: Deployment, options: dict[str, cluster.NodeOptions]
) -> cluster.JoinResult:
    return cluster.start_cluster(hosts, deployment, options=options)


def _launch_on_head(
    head_host: RemoteHost,
    hosts: Sequence[RemoteHost],
    deployment: Deployment,
    view: Deployment,
    paths: server.LaunchPaths,
    ready_timeout: float,
) -> Report:
    inputs = restart_rule.run_inputs(view, paths)
    started = server.start_server(head_host, paths, view.server_port, inputs=inputs)
    shows: list[object] = [started]
    if not started.ok:
        return Report(State.FAILED, started, shows, _failure_of(started))
    watch = _watch_nodes(head_host, deployment)
    try:
        ready = server.wait_until_ready(
            head_host,
            paths,
            view.server_port,
            timeout=ready_timeout,
            on_progress=_both(_phases(head_host), watch),
        )
    except NodeLost as lost:
        verdict = Result(False, lost.message, findings=[Finding("error", "cluster", lost.message)])
        return Report(State.FAILED, verdict, [*shows, verdict], RAY_NODE_DIED)
    shows.append(ready)
    digest = server.record_running_script(head_host, paths)
    if not ready.ok:
        return Report(State.FAILED, ready, shows, _failure_of(ready), digest)
    smoke = server.smoke_test(head_host, view.server_port, api_key=script.server_api_key(view))
    diagnosis = server.diagnosis_of(ready)
    if diagnosis is not None:
        timeline = server.timeline(diagnosis.phases)
        shows += [timeline, plots.startup_timeline(timeline)]
    shows.append(smoke)
    return Report(State.CHANGED if smoke.ok else State.FAILED, smoke, shows, "", digest)


def _watch_nodes(
    head_host: RemoteHost, deployment: Deployment
) -> Callable[[server.Progress], None]:
    """Count the cluster's nodes every few seconds while the server starts; raise
    :class:`NodeLost` naming the nodes that left."""
    last = [0.0]

    def check(progress: server.Progress) -> None:
        now = time.monotonic()
        if now - last[0] < WATCH_EVERY:
            return
        last[0] = now
        missing = cluster.missing_nodes(head_host, deployment)
        if missing:
            names = ", ".join(f"{n.host.name} ({n.address})" for n in missing)
            raise NodeLost(
                f"node {names} left the Ray cluster {progress.seconds:.0f} s into the start "
                f"({progress.phase or progress.state}); the server was stopped",
                remedy="see why the node's Ray stopped (its raylet log under its --temp-dir, "
                "the OOM killer, the network), then launch again",
            )

    return check


def _both(*calls: Callable[[server.Progress], None]) -> Callable[[server.Progress], None]:
    def call(progress: server.Progress) -> None:
        for one in calls:
            one(progress)

    return call


def _dry_run(by_name: dict[str, RemoteHost], deployment: Deployment) -> dict[str, Report]:
    nodes = cluster.nodes_of(deployment)
    head_host = by_name[nodes[0].host.name]
    state = cluster.cluster_nodes(head_host, nodes[0], cluster.head_address(deployment))
    alive = state.alive()
    reports = {}
    for node in nodes:
        if node.host.name not in by_name:
            continue
        if node.address in alive:
            verdict = Result(True, f"in the Ray cluster: {alive[node.address]:g} GPU(s)")
            reports[node.host.name] = Report(State.OK, verdict)
        else:
            verdict = Result(True, "not in the Ray cluster; apply=True starts it and launches")
            reports[node.host.name] = Report(State.WOULD_CHANGE, verdict)
    return reports


def _all(hosts: Sequence[RemoteHost], head: str, report: Report) -> dict[str, Report]:
    """The head's report, and the same verdict for each worker (the launch is one)."""
    reports = {head: report}
    for host in hosts:
        if host.name != head:
            reports[host.name] = Report(report.state, report.verdict, [], report.failure_id)
    return reports


def _per_node(
    hosts: Sequence[RemoteHost],
    deployment: Deployment,
    head_report: Report,
    joined: cluster.JoinResult,
) -> dict[str, Report]:
    nodes = cluster.nodes_of(deployment)
    members = joined.nodes
    reports = {nodes[0].host.name: head_report}
    for node in nodes[1:]:
        gpus = members.get(node.address, 0)
        if head_report.state is State.FAILED:
            verdict = Result(False, f"worker of a failed launch: {head_report.verdict.message}")
            reports[node.host.name] = Report(State.FAILED, verdict, [], head_report.failure_id)
            continue
        verdict = Result(
            True,
            f"Ray worker node {node.address} ({gpus:g} GPU(s)) serving "
            f"{deployment.model_path} with the head {nodes[0].address}",
        )
        reports[node.host.name] = Report(State.CHANGED, verdict, [verdict])
    return {h.name: reports[h.name] for h in hosts if h.name in reports}


def _failure_of(result: Result) -> str:
    diagnosis = server.diagnosis_of(result)
    return diagnosis.failure or "" if diagnosis is not None else ""


def stop_serving(
    hosts: Sequence[RemoteHost], deployment: Deployment, grace: float = 10.0
) -> Result:
    """Stop the server on the head, then the Ray processes opsbook started on every node."""
    head = cluster.nodes_of(deployment)[0]
    by_name = {h.name: h for h in hosts}
    findings: list[Finding] = []
    if head.host.name in by_name:
        head_host = by_name[head.host.name]
        view = cluster.with_cluster_settings(deployment.for_host(head.host))
        stopped = server.stop_server(head_host, server.resolve_paths(head_host, view), grace=grace)
        findings.append(Finding("ok" if stopped.ok else "error", head.host.name, stopped.message))
    rays = cluster.stop_cluster(hosts, deployment)
    findings += rays.findings
    ok = not any(f.is_problem for f in findings)
    return Result(ok, f"server and Ray stopped on {len(hosts)} node(s)", findings=findings)


__all__ = ["run", "stop_serving"]


def diagnose(
    hosts: Sequence[RemoteHost], deployment: Deployment, options: single.Options
) -> dict[str, Report]:
    """Diagnose on a cluster: the head's server as on one host; each worker by its place in
    the Ray cluster (a worker runs no server of its own)."""
    from opsbook.stages import diagnose as single

    nodes = cluster.nodes_of(deployment)
    by_name = {h.name: h for h in hosts}
    reports: dict[str, Report] = {}
    head = nodes[0]
    alive: dict[str, float] = {}
    if head.host.name in by_name:
        head_host = by_name[head.host.name]
        view = cluster.with_cluster_settings(deployment.for_host(head.host))
        reports[head.host.name] = single.run(head_host, view, options)
        alive = cluster.cluster_nodes(head_host, head, cluster.head_address(deployment)).alive()
    for node in nodes[1:]:
        if node.host.name not in by_name:
            continue
        if node.address in alive:
            verdict = Result(
                True,
                f"Ray worker node {node.address}: in the cluster, {alive[node.address]:g} GPU(s)",
            )
            reports[node.host.name] = Report(State.OK, verdict, [verdict])
        else:
            verdict = Result(
                False,
                f"Ray worker node {node.address} is not in the cluster of {head.address}",
                findings=[Finding("error", node.host.name, "not in the Ray cluster")],
            )
            reports[node.host.name] = Report(State.FAILED, verdict, [verdict], RAY_NODE_DIED)
    return reports
