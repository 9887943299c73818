"""What can be known before a running server is stopped for a new start: whether the new start
can succeed at all. A restart that cannot succeed must leave the healthy server alone.

Checked from the host's facts, read before the stop: the GPUs the new server needs against the
GPUs it will see, the port against who else listens on it, and the serve flags against those
the installed vLLM release accepts.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from opsbook.core.deployment import Deployment
from opsbook.core.exceptions import OpsbookError
from opsbook.core.results import Finding, Result
from opsbook.knowledge import vllm_facts
from opsbook.steps.host_facts import HostFacts

# The facts a start needs read before the stop: the GPUs, who listens where, the interpreter.
BEFORE_STOP_FACTS = ("user", "nvidia_smi", "listening", "ports", "python")

# vLLM's world size: one worker per GPU for each tensor x pipeline rank, and each data-parallel
# rank a world of its own on this node (vllm 0.15.1 vllm/config/parallel.py, ParallelConfig:
# world_size = pipeline_parallel_size * tensor_parallel_size; world_size_across_dp adds
# data_parallel_size).
PARALLEL_FLAGS = ("tensor-parallel-size", "pipeline-parallel-size", "data-parallel-size")


def check_before_stop(
    facts: HostFacts, deployment: Deployment, server_pids: Collection[int]
) -> Result:
    """Whether a new start with this deployment can succeed on the host as the facts show it,
    judged before the running server (``server_pids``, left out of the port check) is stopped.

    Returns:
        ok, or one error finding per reason the new server could not start.
    """
    findings = [
        *gpu_findings(facts, deployment),
        *_port_findings(facts, deployment.server_port, server_pids),
        *_flag_findings(facts, deployment.serve_args),
    ]
    if findings:
        more = f" (and {len(findings) - 1} more)" if len(findings) > 1 else ""
        why = f"{findings[0].message}{more}"
        return Result(
            False, f"nothing was stopped: the new server could not start: {why}", findings
        )
    return Result(True, "the new server can start: GPUs, port and flags checked")


def gpus_needed(serve_args: Mapping[str, Any]) -> int:
    """The GPUs a single-node server with these serve arguments starts workers on."""
    needed = 1
    for flag in PARALLEL_FLAGS:
        needed *= _count(serve_args.get(flag, serve_args.get(f"--{flag}", 1)))
    return needed


def gpus_visible(facts: HostFacts, env: Mapping[str, str]) -> int:
    """The GPUs the server will see: ``CUDA_VISIBLE_DEVICES`` of its env, else the host's."""
    chosen = env.get("CUDA_VISIBLE_DEVICES")
    if chosen is None:
        return len(facts.gpus)
    return len([d for d in chosen.split(",") if d.strip()])


def _count(value: Any) -> int:
    try:
        return max(int(value), 1)
    except (TypeError, ValueError):
        return 1


def gpu_findings(facts: HostFacts, deployment: Deployment) -> list[Finding]:
    """An error when the server would need more GPUs than it would see (preflight's too)."""
    # A cluster's head serves across nodes: cluster preflight counts the GPUs of every node.
    if deployment.cluster is not None or facts.nvidia_smi_error or not facts.gpus:
        return []
    needed = gpus_needed(deployment.serve_args)
    visible = gpus_visible(facts, deployment.env)
    if needed <= visible:
        return []
    sizes = " x ".join(
        f"{flag} {_count(deployment.serve_args.get(flag, 1))}"
        for flag in PARALLEL_FLAGS
        if flag in deployment.serve_args
    )
    return [
        Finding(
            "error",
            "GPUs",
            f"the server needs {needed} GPU(s) ({sizes}) and would see {visible}",
            "lower the parallel sizes in server.args to the GPUs the host shows, or bring "
            "the missing GPUs back (nvidia-smi lists them; CUDA_VISIBLE_DEVICES in server.env)",
        )
    ]


def _port_findings(facts: HostFacts, port: int, server_pids: Collection[int]) -> list[Finding]:
    others = {
        (s.pid, s.user): s
        for s in facts.listening
        if s.port == port and (s.pid is None or s.pid not in server_pids)
    }
    return [
        Finding(
            "error",
            f"port {port}",
            f"port {port} is already taken by "
            + (
                f"PID {s.pid} ({s.cmdline or s.process})"
                if s.pid
                else f"a process of user {s.user or 'unknown'} (its PID is not visible)"
            )
            + ", not by the server opsbook started: the new server could not bind it",
            "stop that process, or set server.port to a free port",
        )
        for s in others.values()
    ]


def _flag_findings(facts: HostFacts, serve_args: Mapping[str, Any]) -> list[Finding]:
    release = _exact_release(facts.vllm_version)
    if release is None:
        return []
    version = facts.vllm_version
    unknown = release.flags_refused(serve_args)
    return [
        Finding(
            "error",
            f"--{flag}",
            f"vLLM {version} on this host does not accept --{flag} (its serve flags, read "
            f"from vLLM {version}'s source): the new server would exit at once",
            f"remove {flag} from server.args: vLLM {version} has no --{flag} (its --help "
            "lists the flags it has)",
        )
        for flag in unknown
    ]


def _exact_release(version: str | None) -> vllm_facts.ReleaseFacts | None:
    """The facts of exactly this release (a local build suffix aside); None when it is not a
    release opsbook has read, and then nothing is refused."""
    if not version:
        return None
    try:
        release = vllm_facts.release_at_or_below(version)
    except OpsbookError:
        return None
    if version.split("+")[0] != release:
        return None
    return vllm_facts.load(release)
