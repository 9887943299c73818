"""Preflight's verdict on a host's facts: a finding per problem or notable fact (GPUs and who
holds their memory, the interpreter and its vLLM, the server port, shared memory, servers
running, disk), and the result that is ok unless one is an error.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from opsbook.core.results import Finding, Result
from opsbook.steps.facts_tables import gib, gpu_summary, mib, short, summary_table, when

if TYPE_CHECKING:
    from opsbook.steps.host_facts import HostFacts

LOW_SHM_BYTES = 1 << 30
# Below this, memory in use on a GPU is the driver's own bookkeeping, not a workload.
IDLE_GPU_MIB = 1024


@dataclass(kw_only=True, repr=False)
class FactsVerdict(Result):
    """Preflight's verdict with the facts it was given."""

    facts: HostFacts

    @property
    def summary(self) -> dict[str, Any]:
        """The host at a glance, fact name -> value (the rows of :func:`summary_table`)."""
        return {row[0]: row[1] for row in summary_table(self.facts).rows}


def check_facts(facts: HostFacts, judged: Sequence[Finding] = ()) -> FactsVerdict:
    """Preflight's verdict: ok unless a finding is an error.

    Args:
        facts: from :func:`gather_facts`.
        judged: findings on the facts against the deployment (they come first).

    Returns:
        A :class:`FactsVerdict` whose findings are :meth:`HostFacts.findings`, with the
        ``facts`` and their ``summary``.
    """
    findings = [*judged, *facts.findings()]
    errors = [f for f in findings if f.severity == "error"]
    if errors:
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        message = f"{facts.host}: {errors[0].message}{more}"
    else:
        message = (
            f"{facts.host}: {gpu_summary(facts)}; vLLM {facts.vllm_version or 'not installed'}"
        )
    return FactsVerdict(not errors, message, findings=findings, facts=facts)


def findings_of(facts: HostFacts) -> list[Finding]:
    """Problems and notable facts, most important kinds first."""
    return [
        *_gpu_findings(facts),
        *_python_findings(facts),
        *_port_findings(facts),
        *_shm_findings(facts),
        *_own_server_findings(facts),
        *_server_findings(facts),
        *_disk_findings(facts),
    ]


def _gpu_findings(facts: HostFacts) -> list[Finding]:
    if facts.nvidia_smi_path is None:
        return [
            Finding(
                "error",
                "nvidia-smi",
                "nvidia-smi not found on the host (PATH of a non-interactive shell, /usr/bin, "
                "/usr/local/nvidia/bin): no NVIDIA driver, or it is not on PATH",
                remedy="install the NVIDIA driver (it ships nvidia-smi); if it is installed, add "
                "its folder to PATH for non-interactive shells (e.g. /etc/environment)",
                source="facts probe",
            )
        ]
    if facts.nvidia_smi_error is not None:
        return [
            Finding(
                "error",
                "nvidia-smi",
                f"nvidia-smi failed ({facts.nvidia_smi_error})",
                remedy="check that the driver is loaded (`nvidia-smi` on the host, `dmesg | grep "
                "-i nvrm`); after a driver upgrade the host needs a reboot",
                source="nvidia-smi --query-gpu",
            )
        ]
    if not facts.gpus:
        return [
            Finding(
                "error",
                "gpus",
                "nvidia-smi runs but lists no GPUs",
                remedy="check that this user or container can see the GPUs (`nvidia-smi -L`, "
                "CUDA_VISIBLE_DEVICES, `--gpus all` for containers)",
                source="nvidia-smi --query-gpu",
            )
        ]
    return [*_memory_holder_findings(facts), *_hidden_usage_findings(facts)]


def _memory_holder_findings(facts: HostFacts) -> list[Finding]:
    findings = []
    for proc in facts.processes:
        if facts.is_own(proc.pid):
            continue  # opsbook's own server: one finding of its own says so
        where = f"GPU {proc.gpu_index}" if proc.gpu_index is not None else "GPU"
        findings.append(
            Finding(
                "warning",
                where,
                f"{mib(proc.used_memory_mib)} held by pid {proc.pid} ({proc.process_name})",
                remedy="if it is a leftover server, stop it (05_diagnose tells what it is); "
                "otherwise launch on other GPUs: vLLM needs the memory free when it starts",
                source="nvidia-smi --query-compute-apps",
            )
        )
    return findings


def _hidden_usage_findings(facts: HostFacts) -> list[Finding]:
    """GPUs with memory in use but no process listed (another container or PID namespace)."""
    listed = {p.gpu_index for p in facts.processes}
    return [
        Finding(
            "warning",
            f"GPU {g.index}",
            f"{g.memory_used_mib} MiB in use by processes not visible from here",
            remedy="look for a server in another container or PID namespace on this machine",
            source="nvidia-smi --query-gpu",
        )
        for g in facts.gpus
        if g.index not in listed and (g.memory_used_mib or 0) > IDLE_GPU_MIB
    ]


def _python_findings(facts: HostFacts) -> list[Finding]:
    py = facts.python
    if not py.found:
        return [
            Finding(
                "error",
                "python",
                f"the deployment interpreter {py.requested!r} cannot be used: {py.error}",
                remedy="set `python:` in the deployment file to the interpreter of the "
                "environment where vLLM is installed (e.g. /opt/vllm/.venv/bin/python)",
                source="facts probe",
            )
        ]
    if facts.vllm_version is None:
        return [
            Finding(
                "warning",
                "vllm",
                f"vLLM is not installed in {py.executable}",
                remedy=f"install it there (`{py.executable} -m pip install vllm`) or point "
                "`python:` at the environment that has it",
                source="importlib.metadata",
            )
        ]
    return []


def _port_findings(facts: HostFacts) -> list[Finding]:
    servers = {s.pid for s in facts.servers}
    findings = []
    for sock in facts.port_holders():
        if facts.is_own(sock.pid):
            continue
        if sock.pid is None:
            findings.append(
                Finding(
                    "error",
                    f"port {sock.port}",
                    f"port {sock.port} is already in use by a process of user {sock.user} that "
                    "this account cannot see",
                    remedy="ask its owner to stop it, or set server.port to a free port",
                    source="/proc/net/tcp",
                )
            )
        elif sock.pid in servers:
            findings.append(
                Finding(
                    "warning",
                    f"port {sock.port}",
                    f"a model server already listens on port {sock.port}: pid {sock.pid} "
                    f"({short(sock.cmdline or sock.process)})",
                    remedy="stop it before launching (04_launch stops the server it started), "
                    "or set server.port to a free port",
                    source="/proc/net/tcp",
                )
            )
        else:
            findings.append(
                Finding(
                    "error",
                    f"port {sock.port}",
                    f"port {sock.port} is already in use by pid {sock.pid} ({sock.process})",
                    remedy="stop that process if it is not needed, or set server.port to a "
                    "free port",
                    source="/proc/net/tcp",
                )
            )
    return findings


def _shm_findings(facts: HostFacts) -> list[Finding]:
    findings = []
    if facts.shm_total is None:
        findings.append(
            Finding(
                "warning",
                "/dev/shm",
                "/dev/shm is missing or unreadable",
                remedy="vLLM's workers share data through /dev/shm; mount a tmpfs there "
                "(containers: --ipc=host or --shm-size=16g)",
                source="statvfs",
            )
        )
    elif (facts.shm_free or 0) < LOW_SHM_BYTES:
        findings.append(
            Finding(
                "warning",
                "/dev/shm",
                f"/dev/shm has only {gib(facts.shm_free)} free (of {gib(facts.shm_total)})",
                remedy="vLLM's tensor-parallel workers share data through /dev/shm: enlarge it "
                "(containers: --ipc=host or --shm-size=16g) or remove leftovers of dead servers",
                source="statvfs",
            )
        )
    if facts.shm_leftover_files:
        findings.append(
            Finding(
                "info",
                "/dev/shm",
                f"{facts.shm_leftover_files} psm_*/sem.mp-* files in /dev/shm "
                f"({gib(facts.shm_leftover_bytes)}), possibly left by killed servers",
                remedy="04_launch removes the ones whose owners are gone",
                source="/dev/shm",
            )
        )
    return findings


def _own_server_findings(facts: HostFacts) -> list[Finding]:
    """The server opsbook launched, once: its GPUs and port are in use by design."""
    own = facts.own_server
    if own is None:
        return []
    mine = [p for p in facts.processes if facts.is_own(p.pid)]
    gpus = {p.gpu_index for p in mine if p.gpu_index is not None}
    held = sum(p.used_memory_mib or 0 for p in mine)
    port = next((s.port for s in facts.port_holders() if facts.is_own(s.pid)), None)
    parts = [f"{len(gpus)} GPU(s) ({held / 1024:.1f} GiB in all)" if gpus else "no GPU memory"]
    if port is not None:
        parts.append(f"port {port}")
    return [
        Finding(
            "info",
            f"pid {own.pid}",
            f"opsbook's server (pid {own.pid}, group {own.pgid}, {len(own.group)} processes, "
            f"started by 04_launch) is running and holds {' and '.join(parts)}",
            remedy="04_launch stops it (by its recorded group) before starting again",
            source="launch.json, /proc",
        )
    ]


def _server_findings(facts: HostFacts) -> list[Finding]:
    """One info row per running server tree (its renamed workers are children), other than
    opsbook's own."""
    pids = {s.pid for s in facts.servers}
    return [
        Finding(
            "info",
            f"pid {s.pid}",
            f"model server running since {when(s.started)} as {s.user}: {short(s.cmdline)}",
            source="/proc",
        )
        for s in facts.servers
        if s.ppid not in pids and not facts.is_own(s.pid)
    ]


def _disk_findings(facts: HostFacts) -> list[Finding]:
    if facts.model_path_exists or not facts.model_path:
        return []
    return [
        Finding(
            "info",
            "model path",
            f"{facts.model_path} does not exist yet; {gib(facts.disk_free_bytes)} free at "
            f"{facts.disk_checked_path}",
            source="statvfs",
        )
    ]
