"""A host's facts laid out for the preflight notebook: GPUs, processes holding GPU memory,
servers, sockets on the server port, and a summary of the rest.
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime
from typing import TYPE_CHECKING, Any

from opsbook.core.results import Table

if TYPE_CHECKING:
    from opsbook.steps.host_facts import HostFacts, PythonInfo
    from opsbook.steps.smi_parse import Topology


def gpu_table(facts: HostFacts) -> Table:
    """One row per GPU: name, compute capability, memory, and who holds memory on it."""
    rows = []
    for gpu in facts.gpus:
        holders = [p for p in facts.processes if p.gpu_index == gpu.index]
        rows.append(
            [
                gpu.index,
                gpu.name,
                gpu.compute_cap,
                gpu.memory_total_mib,
                gpu.memory_used_mib,
                gpu.memory_free_mib,
                ", ".join(f"{p.pid} {p.process_name} ({mib(p.used_memory_mib)})" for p in holders),
            ]
        )
    return Table(
        ["gpu", "name", "compute capability", "total MiB", "used MiB", "free MiB", "held by"],
        rows,
    )


def process_table(facts: HostFacts) -> Table:
    """Processes holding GPU memory, with owner, start and command line when visible."""
    servers = {s.pid: s for s in facts.servers}
    rows = []
    for proc in facts.processes:
        server = servers.get(proc.pid)
        rows.append(
            [
                proc.gpu_index,
                proc.pid,
                proc.process_name,
                proc.used_memory_mib,
                server.user if server else "",
                when(server.started) if server else "",
                server.cmdline if server else "",
            ]
        )
    return Table(["gpu", "pid", "process", "used MiB", "user", "started", "command line"], rows)


def server_table(facts: HostFacts) -> Table:
    """Running model server processes (API servers and their renamed engine workers)."""
    return Table(
        ["pid", "parent", "user", "started", "command line"],
        [[s.pid, s.ppid, s.user, when(s.started), s.cmdline] for s in facts.servers],
    )


def port_table(facts: HostFacts) -> Table:
    """Listening TCP sockets with their owning process where it is visible."""
    return Table(
        ["port", "address", "pid", "process", "user"],
        [[s.port, s.address, s.pid, s.process, s.user] for s in facts.listening],
    )


def summary_table(facts: HostFacts) -> Table:
    """The host at a glance: one fact per row."""
    rows: list[list[Any]] = [
        ["host", facts.host],
        ["os", facts.os.pretty_name],
        ["kernel", facts.os.kernel],
        ["cpus", facts.cpu_count],
        ["memory", f"{gib(facts.memory_available)} available of {gib(facts.memory_total)}"],
        ["gpus", gpu_summary(facts)],
        ["driver", facts.driver],
        ["cuda", facts.cuda],
        ["interconnect", _interconnect(facts.topology)],
        ["python", _python_summary(facts.python)],
        ["vllm", facts.vllm_version or "not installed"],
        ["model path", f"{facts.model_path} ({'exists' if facts.model_path_exists else 'absent'})"],
        ["disk free", f"{gib(facts.disk_free_bytes)} at {facts.disk_checked_path}"],
        ["/dev/shm", f"{gib(facts.shm_free)} free of {gib(facts.shm_total)}"],
        ["server port", _port_summary(facts)],
        ["model servers", len(facts.servers)],
    ]
    return Table(["fact", "value"], rows)


def gpu_summary(facts: HostFacts) -> str:
    if not facts.gpus:
        return "no GPUs"
    kinds = Counter((g.name, g.compute_cap, g.memory_total_mib) for g in facts.gpus)
    return "; ".join(
        f"{count} × {name} (compute capability {cap}, {total} MiB)"
        for (name, cap, total), count in kinds.items()
    )


def _interconnect(topology: Topology) -> str:
    kinds = topology.gpu_link_kinds
    return f"{topology.interconnect} ({', '.join(kinds)})" if kinds else topology.interconnect


def _python_summary(py: PythonInfo) -> str:
    if not py.found:
        return f"{py.requested}: {py.error}"
    return f"{py.executable} ({py.version})"


def _port_summary(facts: HostFacts) -> str:
    holders = facts.port_holders()
    if not holders:
        return f"{facts.server_port} free"
    who = ", ".join(f"pid {h.pid} ({h.process})" if h.pid else f"user {h.user}" for h in holders)
    return f"{facts.server_port} in use by {who}"


def gib(value: int | None) -> str:
    return "?" if value is None else f"{value / (1 << 30):.1f} GiB"


def mib(value: int | None) -> str:
    return "memory (amount not reported)" if value is None else f"{value} MiB"


def when(started: datetime | None) -> str:
    return started.strftime("%Y-%m-%d %H:%M:%S UTC") if started else "?"


def short(text: str | None, limit: int = 160) -> str:
    text = text or ""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def first_line(text: str | None) -> str | None:
    return text.splitlines()[0] if text else None


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""
