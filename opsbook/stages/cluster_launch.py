"""Launch across nodes: the Ray cluster first, then one vLLM on the head over all of them.

For a deployment with a ``cluster`` section the launch stage acts on its hosts together: stop
the server opsbook started on the head, start the Ray head and then each worker (proven joined,
:func:`opsbook.steps.cluster.start_cluster`), start the launch script on the head (it carries
``--distributed-executor-backend ray`` and the parallel sizes), follow it to ready while
watching the cluster, and smoke-test it. A node that is missing or leaves while the model loads
ends the launch within seconds, naming the node; whatever opsbook started for it is stopped.

The head's server is restarted only when needed, by the rule of the launch on one host
(:mod:`opsbook.steps.restart_rule`: not ready, or its script, env, patched configs or engine
changed, or ``restart="always"``) with the cluster's membership in the decision: every node in
the Ray cluster with the GPUs its nvidia-smi lists. A node missing (or short of GPUs) is
started again and the server restarted, since its ranks went with it; a ready, unchanged server
over a whole cluster is left alone, as its dry run says.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from opsbook.core.deployment import Deployment
from opsbook.core.exceptions import OpsbookError
from opsbook.core.results import Finding, Result, State
from opsbook.knowledge.logscan import failure_for
from opsbook.remote.protocol import RemoteHost
from opsbook.stages import cluster_reach
from opsbook.stages.base import Report
from opsbook.stages.launch_server import Options, _phases
from opsbook.steps import cluster, plots, restart_rule, script, server, triage

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
RAY_PORT_HELD = failure_for("ray-port-held")


class NodeLost(OpsbookError):
    """A node of the cluster left while the server was starting."""


def run(hosts: Sequence[RemoteHost], deployment: Deployment, options: Options) -> dict[str, Report]:
    """The launch stage on a cluster: one report per host (head and workers)."""
    stop_grace = options.stop_grace
    nodes = cluster.nodes_of(deployment)
    head = nodes[0]
    if head.host.name not in {h.name for h in hosts}:
        verdict = Result(False, f"the cluster's head {head.host.name} is not in this run")
        return {h.name: Report(State.FAILED, verdict) for h in hosts}
    reached, lost = cluster_reach.split(hosts)
    if lost:
        verdict = cluster_reach.without(lost, "launched")
        return lost | {h.name: Report(State.FAILED, verdict) for h in reached}
    by_name = {h.name: h for h in hosts}
    head_host = by_name[head.host.name]
    view = cluster.with_cluster_settings(deployment.for_host(head.host))
    paths = server.resolve_paths(head_host, view)
    node_options = {n.host.name: _node_options(by_name.get(n.host.name), n) for n in nodes}
    pending = options.pending.get(head.host.name, ())
    decision = _decide(head_host, deployment, view, paths, node_options, options.restart, pending)
    if not options.apply or not decision.restart:
        return _as_found(hosts, deployment, decision)
    stopped = server.stop_previous(head_host, paths, grace=stop_grace)
    if not stopped.ok:
        return _all(hosts, head.host.name, Report(State.FAILED, stopped, [stopped]))
    joined = _start_cluster(hosts, deployment, node_options)
    if not joined.ok:
        cluster.stop_cluster(hosts, deployment)
        failed = Report(State.FAILED, joined, [joined], joined.failure_id)
        return _all(hosts, head.host.name, failed)
    report = _launch_on_head(head_host, hosts, deployment, view, paths, options.ready_timeout)
    if report.state is State.FAILED:
        server.stop_server(head_host, paths, grace=stop_grace)
        cluster.stop_cluster(hosts, deployment)
    elif decision.server.was_ready:
        said = f"{report.verdict.message}; restarted: {decision.reason()}"
        report = dataclasses.replace(
            report, verdict=dataclasses.replace(report.verdict, message=said)
        )
    return _per_node(hosts, deployment, report, joined)


@dataclass(frozen=True)
class ClusterDecision:
    """Whether the launch restarts the head's server (and starts missing nodes), and why: the
    single-host rule's decision for the head's server, with the nodes the cluster lacks."""

    server: restart_rule.RestartDecision
    state: triage.ServerState
    members: dict[str, float]
    missing: list[str]

    @property
    def restart(self) -> bool:
        return self.server.restart or bool(self.missing)

    def reason(self) -> str:
        """Why an apply restarts (or, when it does not, why it leaves everything alone)."""
        lacking = "; ".join(self.missing)
        if not self.missing:
            return self.server.reason
        if not self.server.restart:
            return f"{lacking} (the server's ranks there went with it)"
        return f"{self.server.reason}; {lacking}"


def _decide(
    head_host: RemoteHost,
    deployment: Deployment,
    view: Deployment,
    paths: server.LaunchPaths,
    sizes: dict[str, cluster.NodeOptions],
    restart: str,
    pending: Sequence[str] = (),
) -> ClusterDecision:
    """The single-host rule on the head's server, and every node's place in the Ray cluster
    with the GPUs its nvidia-smi lists (Ray's count of a node's GPUs is what it was started
    with)."""
    inputs = restart_rule.run_inputs(view, paths)
    state = triage.server_state(
        head_host, paths, view.server_port, notes=(server.RUNNING_SCRIPT,), inputs=inputs
    )
    nodes = cluster.nodes_of(deployment)
    port = cluster.cluster_of(deployment).ray_port
    found = cluster.cluster_nodes(head_host, nodes[0], cluster.head_address(deployment))
    members = found.alive(nodes, port)
    missing = []
    for node in nodes:
        want = sizes[node.host.name].num_gpus or 0
        if node.address not in members:
            missing.append(f"node {node.host.name} ({node.address}) is not in the Ray cluster")
        elif members[node.address] < want:
            missing.append(
                f"node {node.host.name} offers Ray {members[node.address]:g} of its {want} GPU(s)"
            )
    decided = restart_rule.decide(state, restart, pending)
    return ClusterDecision(decided, state, members, missing)


def _as_found(
    hosts: Sequence[RemoteHost], deployment: Deployment, decision: ClusterDecision
) -> dict[str, Report]:
    """A dry run's reports (would change where an apply would act), or an apply's that left
    the server and the cluster alone (ok): the same words for the same decision."""
    nodes = cluster.nodes_of(deployment)
    names = {h.name for h in hosts}
    head = nodes[0]
    reports: dict[str, Report] = {}
    if decision.restart:
        message = (
            f"would restart the server: {decision.reason()}; apply=True does it"
            if decision.server.was_ready
            else f"{decision.server.dry_run_message()}"
            + (f"; {'; '.join(decision.missing)}" if decision.missing else "")
        )
        verdict = Result(True, message)
        reports[head.host.name] = Report(State.WOULD_CHANGE, verdict, [verdict])
    else:
        verdict = Result(True, f"{decision.server.reason}; every node in the Ray cluster")
        reports[head.host.name] = Report(State.OK, verdict, [decision.state.processes_table()])
    for node in nodes[1:]:
        if node.host.name not in names:
            continue
        gpus = decision.members.get(node.address)
        lacking = [m for m in decision.missing if f"node {node.host.name} " in m]
        if lacking:
            verdict = Result(True, f"{lacking[0]}; apply=True starts it and relaunches")
            reports[node.host.name] = Report(State.WOULD_CHANGE, verdict, [verdict])
        else:
            verdict = Result(True, f"in the Ray cluster: {gpus or 0:g} GPU(s)")
            reports[node.host.name] = Report(State.OK, verdict, [verdict])
    return {h.name: reports[h.name] for h in hosts if h.name in reports}


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
    # The errors the server started past (warnings of the wait) stay in the record.
    verdict = dataclasses.replace(smoke, findings=[*ready.findings, *smoke.findings])
    return Report(State.CHANGED if smoke.ok else State.FAILED, verdict, shows, "", digest)


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
    the Ray cluster (a worker runs no server of its own). A node out of reach is unreachable;
    with the head out of reach the workers' place cannot be asked."""
    from opsbook.stages import diagnose as single

    nodes = cluster.nodes_of(deployment)
    reached, reports = cluster_reach.split(hosts)
    by_name = {h.name: h for h in reached}
    head = nodes[0]
    state = cluster.ClusterNodes((), error=f"the head {head.host.name} is not in this run")
    if head.host.name in by_name:
        head_host = by_name[head.host.name]
        view = cluster.with_cluster_settings(deployment.for_host(head.host))
        reports[head.host.name] = single.run(head_host, view, options)
        state = cluster.cluster_nodes(head_host, head, cluster.head_address(deployment))
        if state.holder:
            held = cluster.port_held(head, cluster.cluster_of(deployment).ray_port, state)
            reports[head.host.name] = _with_problem(reports[head.host.name], held)
    elif head.host.name in reports:
        state = cluster.ClusterNodes((), error=f"the head {head.host.name} is unreachable")
    alive = state.alive(nodes, cluster.cluster_of(deployment).ray_port)
    for node in nodes[1:]:
        if node.host.name not in by_name:
            continue
        reports[node.host.name] = _worker_report(node, head, alive, state)
    return reports


def _worker_report(
    node: cluster.Node, head: cluster.Node, alive: dict[str, float], state: cluster.ClusterNodes
) -> Report:
    if node.address in alive:
        verdict = Result(
            True, f"Ray worker node {node.address}: in the cluster, {alive[node.address]:g} GPU(s)"
        )
        return Report(State.OK, verdict, [verdict])
    why = f" ({state.error})" if state.error else ""
    message = f"Ray worker node {node.address} is not in the cluster of {head.address}{why}"
    verdict = Result(False, message, findings=[Finding("error", node.host.name, message)])
    failure = RAY_PORT_HELD if state.holder else RAY_NODE_DIED
    return Report(State.FAILED, verdict, [verdict], failure)


def _with_problem(report: Report, problem: Result) -> Report:
    """The head's report failed by a cluster problem found beside its server's state."""
    message = f"{problem.message}; server: {report.verdict.message}"
    findings = [*problem.findings, *report.verdict.findings]
    verdict = Result(False, message, findings=findings)
    failure = problem.failure_id if isinstance(problem, cluster.JoinResult) else ""
    return dataclasses.replace(report, state=State.FAILED, verdict=verdict, failure_id=failure)
