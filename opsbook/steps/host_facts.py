"""Preflight (00_preflight): what a host has, and what stands in the way of a launch.

One probe (``opsbook/remote/probes/facts.py``) gathers everything in one round trip; this module
builds :class:`HostFacts` from its answer, with nvidia-smi's raw outputs parsed by
:mod:`opsbook.steps.smi_parse`; :mod:`opsbook.steps.facts_verdict` turns problems into
findings and :mod:`opsbook.steps.facts_tables` lays the facts out as tables for the notebook
(both re-exported here). Nothing here changes the host.
"""

from __future__ import annotations

import json
import posixpath
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from opsbook.core.deployment import Deployment
from opsbook.core.results import Finding
from opsbook.remote.protocol import RemoteHost
from opsbook.steps.facts_tables import (
    first_line,
    gpu_table,
    last_line,
    port_table,
    process_table,
    server_table,
    summary_table,
)
from opsbook.steps.facts_verdict import check_facts, findings_of
from opsbook.steps.smi_parse import (
    QUERY_GPU_FIELDS,
    Gpu,
    GpuProcess,
    Topology,
    parse_compute_apps,
    parse_cuda_version,
    parse_driver_version,
    parse_query_gpu,
    parse_topology,
)

PROBE_TIMEOUT = 180.0


@dataclass(frozen=True)
class OsInfo:
    """The host's operating system."""

    pretty_name: str | None = None
    kernel: str | None = None
    machine: str | None = None
    hostname: str | None = None


@dataclass(frozen=True)
class PythonInfo:
    """The deployment's interpreter as found on the host."""

    requested: str
    executable: str | None = None
    version: str | None = None
    error: str | None = None

    @property
    def found(self) -> bool:
        return self.executable is not None and self.error is None


@dataclass(frozen=True)
class ListeningSocket:
    """A TCP socket in LISTEN state; ``pid`` is None when its owner is not visible."""

    port: int
    address: str
    family: str
    user: str
    pid: int | None = None
    process: str | None = None
    cmdline: str | None = None


@dataclass(frozen=True)
class ServerProcess:
    """A running model server process (``vllm serve``, ``vllm.entrypoints``, ``VLLM::``)."""

    pid: int
    ppid: int | None
    user: str
    started: datetime | None
    comm: str
    cmdline: str


@dataclass(frozen=True)
class OwnServer:
    """The server 04_launch started and recorded, still running: its pid and process group
    with the group's members (vLLM's engine core and workers)."""

    pid: int
    pgid: int
    group: frozenset[int]


@dataclass
class HostFacts:
    """Everything preflight learned about a host. Sizes in bytes unless named otherwise.

    ``nvidia_smi_path`` is None when nvidia-smi was not found; ``nvidia_smi_error`` says why
    it did not answer when it was found.
    """

    host: str
    gpus: list[Gpu]
    processes: list[GpuProcess]
    topology: Topology
    driver: str | None
    cuda: str | None
    os: OsInfo
    python: PythonInfo
    vllm_version: str | None
    disk_free_bytes: int | None
    shm_total: int | None
    shm_free: int | None
    listening: list[ListeningSocket]
    servers: list[ServerProcess]
    nvidia_smi_path: str | None = None
    nvidia_smi_error: str | None = None
    # The topology and banner are asked once per boot and driver; the probe keeps them.
    nvidia_smi_cached: bool = False
    cpu_count: int | None = None
    memory_total: int | None = None
    memory_available: int | None = None
    model_path: str = ""
    model_path_exists: bool = False
    disk_checked_path: str = ""
    shm_leftover_files: int = 0
    shm_leftover_bytes: int = 0
    server_port: int | None = None
    own_server: OwnServer | None = None

    def is_own(self, pid: int | None) -> bool:
        """Whether ``pid`` belongs to the server opsbook launched here."""
        return self.own_server is not None and pid in self.own_server.group

    def port_holders(self) -> list[ListeningSocket]:
        """The sockets listening on the server port, one per owner."""
        seen: set[tuple[int | None, str]] = set()
        holders = []
        for sock in self.listening:
            key = (sock.pid, sock.user)
            if sock.port == self.server_port and key not in seen:
                seen.add(key)
                holders.append(sock)
        return holders

    def findings(self) -> list[Finding]:
        """Problems and notable facts, most important kinds first."""
        return findings_of(self)


# What a server's start needs to know (launch.check_can_start): who holds GPU memory and who
# listens on the port. Not the interpreter's identity, which costs a Python start on the host.
START_FACTS = ("user", "nvidia_smi", "listening", "ports")
# What a config patch predicts from: the GPUs and the interpreter's vLLM; not the processes,
# sockets and disks, which the facts probe otherwise walks /proc and the mounts for.
PATCH_FACTS = ("nvidia_smi", "python")


def probe_args(deployment: Deployment) -> dict[str, Any]:
    """The arguments of the facts probe for a deployment."""
    return {
        "python": deployment.python,
        "model_path": deployment.model_path,
        "ports": [deployment.server_port],
        "launch_record": posixpath.join(deployment.state_dir, "launch.json"),
    }


class RunReadings:
    """The full facts readings one deploy run made of its hosts, by host and probe arguments:
    preflight keeps its reading here and 02_config_patch takes it (issue 37) instead of
    probing again. Made by the runner for the run's shared kernel
    (:func:`opsbook.stages.base.share_readings`) and given to the stages that take it through
    their options; a stage run on its own has none, and probes."""

    def __init__(self) -> None:
        self._found: dict[str, HostFacts] = {}
        self._lock = threading.Lock()

    def keep(self, host: RemoteHost, args: dict[str, Any], found: HostFacts) -> None:
        """Keep a full reading of ``host`` made with the probe arguments ``args``."""
        with self._lock:
            self._found[_reading_key(host, args)] = found

    def known(self, host: RemoteHost, args: dict[str, Any]) -> HostFacts | None:
        """The full reading of ``host`` kept for these probe arguments, or None."""
        with self._lock:
            return self._found.get(_reading_key(host, args))


def _reading_key(host: RemoteHost, args: dict[str, Any]) -> str:
    return json.dumps([host.name, args], sort_keys=True)


def gather_facts(
    host: RemoteHost,
    deployment: Deployment,
    parts: Sequence[str] = (),
    *,
    readings: RunReadings | None = None,
) -> HostFacts:
    """Learn a host's facts in one round trip (the ``facts`` probe).

    Args:
        host: the host to look at (an :class:`opsbook.remote.hosts.Host`).
        deployment: gives the interpreter, model path and server port to check.
        parts: only these facts (the probe's answer keys, e.g. :data:`START_FACTS`); the
            others are left empty. Default: all of them.
        readings: the run's readings: a full reading is kept there, and ``parts`` are taken
            from a full reading of the host kept there by an earlier stage of the run
            (preflight's), without probing. Given only for facts a stage's own actions
            cannot have changed since (the GPUs, the interpreter's vLLM), never for what
            guards a stop or a start.

    Returns:
        The parsed facts; call :meth:`HostFacts.findings` or :func:`check_facts` on them.

    Raises:
        HostError: the host could not be reached or the probe did not answer.
    """
    args = probe_args(deployment)
    if parts and readings is not None:
        known = readings.known(host, args)
        if known is not None:
            return known
    asked = {**args, "parts": list(parts)} if parts else args
    answer = host.probe("facts", asked, timeout=PROBE_TIMEOUT)
    found = facts_from_probe(answer, host=deployment.host.name, server_port=deployment.server_port)
    if not parts and readings is not None:
        readings.keep(host, args, found)
    return found


def facts_from_probe(
    answer: dict[str, Any], *, host: str = "localhost", server_port: int | None = None
) -> HostFacts:
    """Build :class:`HostFacts` from the facts probe's answer.

    Args:
        answer: the decoded JSON of ``opsbook/remote/probes/facts.py``.
        host: the host's name, for messages.
        server_port: the port the deployment will listen on (defaults to the probe's first).

    Returns:
        The facts, with nvidia-smi outputs parsed.
    """
    smi = answer.get("nvidia_smi") or {}
    gpus, smi_error = _gpus_from(smi)
    processes = _with_gpu_index(parse_compute_apps(_stdout(smi.get("compute_apps"))), gpus)
    table_text = _stdout(smi.get("table"))
    ports = answer.get("ports") or []
    disk = answer.get("disk") or {}
    shm = answer.get("shm") or {}
    memory = answer.get("memory") or {}
    interpreter = _python_from(answer.get("python") or {})
    return HostFacts(
        host=host,
        gpus=gpus,
        processes=processes,
        topology=parse_topology(_stdout(smi.get("topo"))),
        driver=next((g.driver_version for g in gpus if g.driver_version), None)
        or parse_driver_version(table_text),
        cuda=parse_cuda_version(table_text),
        os=_os_from(answer.get("os") or {}),
        python=interpreter,
        vllm_version=_vllm_version(answer.get("python") or {}),
        disk_free_bytes=disk.get("free_bytes"),
        shm_total=shm.get("total_bytes"),
        shm_free=shm.get("free_bytes"),
        listening=[_socket_from(s) for s in answer.get("listening") or []],
        servers=[_server_from(s) for s in answer.get("servers") or []],
        nvidia_smi_path=smi.get("path"),
        nvidia_smi_error=smi_error,
        nvidia_smi_cached=bool(smi.get("static_cached")),
        cpu_count=(answer.get("cpu_count") or {}).get("usable")
        or (answer.get("cpu_count") or {}).get("total"),
        memory_total=memory.get("total_bytes"),
        memory_available=memory.get("available_bytes"),
        model_path=str(disk.get("path") or ""),
        model_path_exists=bool(disk.get("exists")),
        disk_checked_path=str(disk.get("checked") or ""),
        shm_leftover_files=int(shm.get("leftover_files") or 0),
        shm_leftover_bytes=int(shm.get("leftover_bytes") or 0),
        server_port=server_port if server_port is not None else (ports[0] if ports else None),
        own_server=_own_server_from(answer.get("own_launch")),
    )


def _own_server_from(own: Any) -> OwnServer | None:
    if not isinstance(own, dict):
        return None
    return OwnServer(int(own["pid"]), int(own["pgid"]), frozenset(map(int, own["group"])))


def _stdout(outcome: dict[str, Any] | None) -> str:
    if not outcome or outcome.get("exit_code") != 0:
        return ""
    return str(outcome.get("stdout") or "")


def _gpus_from(smi: dict[str, Any]) -> tuple[list[Gpu], str | None]:
    """The GPUs, or why nvidia-smi did not list them."""
    if not smi.get("path"):
        return [], None
    outcome = smi.get("query_gpu") or {}
    code = outcome.get("exit_code")
    if outcome.get("error"):
        return [], str(outcome["error"])
    if code != 0:
        output = f"{outcome.get('stdout') or ''}\n{outcome.get('stderr') or ''}"
        return [], f"exit code {code}: {last_line(output) or 'no output'}"
    return parse_query_gpu(str(outcome.get("stdout") or "")), None


def _with_gpu_index(processes: list[GpuProcess], gpus: list[Gpu]) -> list[GpuProcess]:
    by_uuid = {g.uuid: g.index for g in gpus if g.uuid}
    return [
        GpuProcess(
            p.pid,
            p.process_name,
            p.used_memory_mib,
            p.gpu_uuid,
            by_uuid.get(p.gpu_uuid) if p.gpu_uuid else None,
        )
        for p in processes
    ]


def _python_from(data: dict[str, Any]) -> PythonInfo:
    requested = str(data.get("requested") or "")
    info = data.get("info") or {}
    run = data.get("run") or {}
    if not data.get("resolved"):
        error: str | None = "not found on PATH"
    elif not run.get("found", True):
        error = "no such file"
    elif info:
        error = None
    else:
        error = run.get("error") or last_line(str(run.get("stderr") or "")) or "did not run"
    return PythonInfo(
        requested=requested,
        executable=info.get("executable") or data.get("resolved"),
        version=first_line(info.get("version")),
        error=error,
    )


def _vllm_version(data: dict[str, Any]) -> str | None:
    info = data.get("info") or {}
    return info.get("vllm_dist") or info.get("vllm_module")


def _os_from(data: dict[str, Any]) -> OsInfo:
    return OsInfo(
        pretty_name=data.get("pretty_name"),
        kernel=data.get("kernel"),
        machine=data.get("machine"),
        hostname=data.get("hostname"),
    )


def _socket_from(data: dict[str, Any]) -> ListeningSocket:
    return ListeningSocket(
        port=int(data["port"]),
        address=str(data.get("address") or ""),
        family=str(data.get("family") or ""),
        user=str(data.get("user") or ""),
        pid=data.get("pid"),
        process=data.get("process"),
        cmdline=data.get("cmdline"),
    )


def _server_from(data: dict[str, Any]) -> ServerProcess:
    started = data.get("started")
    return ServerProcess(
        pid=int(data["pid"]),
        ppid=data.get("ppid"),
        user=str(data.get("user") or ""),
        started=datetime.fromtimestamp(started, tz=timezone.utc) if started else None,
        comm=str(data.get("comm") or ""),
        cmdline=str(data.get("cmdline") or ""),
    )


# What callers import from here: the facts, how they are gathered, judged and shown.
__all__ = [
    "PATCH_FACTS",
    "QUERY_GPU_FIELDS",
    "START_FACTS",
    "RunReadings",
    "Gpu",
    "GpuProcess",
    "HostFacts",
    "Topology",
    "check_facts",
    "facts_from_probe",
    "gather_facts",
    "gpu_table",
    "parse_compute_apps",
    "parse_cuda_version",
    "parse_driver_version",
    "parse_query_gpu",
    "parse_topology",
    "port_table",
    "process_table",
    "server_table",
    "summary_table",
]
