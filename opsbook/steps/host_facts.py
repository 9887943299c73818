"""Preflight (00_preflight): what a host has, and what stands in the way of a launch.

One probe (``opsbook/remote/probes/facts.py``) gathers everything in one round trip; this module
parses its raw ``nvidia-smi`` outputs, builds :class:`HostFacts`, turns problems into
findings and lays the facts out as tables for the notebook. Nothing here changes the host.
"""

from __future__ import annotations

import posixpath
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from opsbook.core.deployment import Deployment
from opsbook.core.results import Finding, Result, Table
from opsbook.remote.protocol import RemoteHost

QUERY_GPU_FIELDS = (
    "index",
    "name",
    "compute_cap",
    "memory.total",
    "memory.used",
    "memory.free",
    "driver_version",
    "uuid",
)
COMPUTE_APPS_FIELDS = ("pid", "process_name", "used_memory", "gpu_uuid")

PROBE_TIMEOUT = 180.0
LOW_SHM_BYTES = 1 << 30
# Below this, memory in use on a GPU is the driver's own bookkeeping, not a workload.
IDLE_GPU_MIB = 1024

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_UNIT_SUFFIX = re.compile(r"\s*\[[^\]]*\]$")
_FIELD_NAME = re.compile(r"^[a-z][a-z0-9_.]*$")
_DEVICE = re.compile(r"^(?:GPU|NIC)\d+$")
_NVLINK = re.compile(r"^NV\d+$")
_CUDA_VERSION = re.compile(r"CUDA(?: UMD)? Version\s*:\s*([0-9][0-9.]*)")
_DRIVER_VERSION = re.compile(r"(?:Driver|KMD) Version\s*:\s*([0-9][0-9.]*)")
# Header names nvidia-smi prints for some query fields differ from the names queried.
_FIELD_ALIASES = {"used_gpu_memory": "used_memory"}


@dataclass(frozen=True)
class Gpu:
    """One GPU as ``nvidia-smi --query-gpu`` reports it (memory in MiB; None when N/A)."""

    index: int
    name: str
    compute_cap: str | None = None
    memory_total_mib: int | None = None
    memory_used_mib: int | None = None
    memory_free_mib: int | None = None
    driver_version: str | None = None
    uuid: str | None = None


@dataclass(frozen=True)
class GpuProcess:
    """A process holding GPU memory (``nvidia-smi --query-compute-apps``)."""

    pid: int
    process_name: str
    used_memory_mib: int | None = None
    gpu_uuid: str | None = None
    gpu_index: int | None = None


@dataclass(frozen=True)
class Topology:
    """The link matrix of ``nvidia-smi topo -m`` (links such as ``NV18``, ``PIX``, ``SYS``)."""

    devices: list[str] = field(default_factory=list)
    links: dict[str, dict[str, str]] = field(default_factory=dict)
    cpu_affinity: dict[str, str] = field(default_factory=dict)
    numa_affinity: dict[str, str] = field(default_factory=dict)

    @property
    def gpus(self) -> list[str]:
        """The GPU devices (``GPU0``...), leaving out NICs."""
        return [d for d in self.devices if d.startswith("GPU")]

    def link(self, a: str, b: str) -> str:
        """The link between two devices, e.g. ``link("GPU0", "GPU1") == "PIX"``."""
        return self.links.get(a, {}).get(b, "")

    @property
    def gpu_link_kinds(self) -> list[str]:
        """The distinct kinds of GPU-to-GPU link, sorted."""
        gpus = self.gpus
        return sorted({self.link(a, b) for a in gpus for b in gpus if a != b} - {""})

    @property
    def interconnect(self) -> str:
        """``NVLink`` if any GPU pair is NVLinked, else ``PCIe-only``.

        ``single GPU`` when there is nothing to connect, ``unknown`` when no matrix was read.
        """
        if not self.gpus:
            return "unknown"
        if len(self.gpus) == 1:
            return "single GPU"
        if any(_NVLINK.match(kind) for kind in self.gpu_link_kinds):
            return "NVLink"
        return "PCIe-only"

    def table(self) -> Table:
        """The matrix as a table, with the CPU and NUMA affinity of each device."""
        return Table(
            ["", *self.devices, "CPU affinity", "NUMA affinity"],
            [
                [
                    d,
                    *(self.link(d, o) for o in self.devices),
                    self.cpu_affinity.get(d, ""),
                    self.numa_affinity.get(d, ""),
                ]
                for d in self.devices
            ],
        )


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
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

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
        return [
            *_gpu_findings(self),
            *_python_findings(self),
            *_port_findings(self),
            *_shm_findings(self),
            *_own_server_findings(self),
            *_server_findings(self),
            *_disk_findings(self),
        ]


def parse_query_gpu(csv_text: str, fields: tuple[str, ...] = QUERY_GPU_FIELDS) -> list[Gpu]:
    """Parse ``nvidia-smi --query-gpu=... --format=csv[,noheader][,nounits]``.

    Args:
        csv_text: the command's output, with or without header line and units.
        fields: the queried fields, used when there is no header. A shorter row is read
            as a prefix of them.

    Returns:
        One :class:`Gpu` per row; without an ``index`` column, rows are numbered in order.
    """
    gpus = []
    for position, row in enumerate(_csv_records(csv_text, fields, merge_into="name")):
        index = _int(row.get("index"))
        gpus.append(
            Gpu(
                index=position if index is None else index,
                name=row.get("name") or "",
                compute_cap=row.get("compute_cap"),
                memory_total_mib=_int(row.get("memory.total")),
                memory_used_mib=_int(row.get("memory.used")),
                memory_free_mib=_int(row.get("memory.free")),
                driver_version=row.get("driver_version"),
                uuid=row.get("uuid"),
            )
        )
    return gpus


def parse_compute_apps(
    csv_text: str, fields: tuple[str, ...] = COMPUTE_APPS_FIELDS
) -> list[GpuProcess]:
    """Parse ``nvidia-smi --query-compute-apps=pid,process_name,used_memory,gpu_uuid``.

    Args:
        csv_text: the command's output; header, units and "No running processes" tolerated.
        fields: the queried fields, used when there is no header.

    Returns:
        One :class:`GpuProcess` per row that names a PID; ``gpu_index`` is left unset.
    """
    processes = []
    for row in _csv_records(csv_text, fields, merge_into="process_name"):
        pid = _int(row.get("pid"))
        if pid is None:
            continue
        processes.append(
            GpuProcess(
                pid=pid,
                process_name=row.get("process_name") or "",
                used_memory_mib=_int(row.get("used_memory")),
                gpu_uuid=row.get("gpu_uuid"),
            )
        )
    return processes


def parse_topology(topo_text: str) -> Topology:
    """Parse ``nvidia-smi topo -m``: its ANSI underline codes are dropped, its legend ignored.

    Args:
        topo_text: the command's output.

    Returns:
        The matrix; an empty :class:`Topology` when there is none (e.g. an error message).
    """
    lines = _ANSI.sub("", topo_text).splitlines()
    devices: list[str] = []
    links: dict[str, dict[str, str]] = {}
    cpu: dict[str, str] = {}
    numa: dict[str, str] = {}
    for line in lines:
        if line.strip().startswith("Legend"):
            break
        cells = line.split()
        if not devices:
            devices = [c for c in cells if _DEVICE.match(c)]
            continue
        if not cells or cells[0] not in devices:
            continue
        name, values = cells[0], cells[1:]
        links[name] = {other: values[i] for i, other in enumerate(devices) if i < len(values)}
        rest = values[len(devices) :]
        if rest:
            cpu[name] = rest[0]
        if len(rest) > 1:
            numa[name] = rest[1]
    return Topology(devices=devices, links=links, cpu_affinity=cpu, numa_affinity=numa)


def parse_cuda_version(nvidia_smi_text: str) -> str | None:
    """The CUDA version in the header of plain ``nvidia-smi`` (``CUDA Version: 13.0``)."""
    found = _CUDA_VERSION.search(nvidia_smi_text)
    return found.group(1) if found else None


def parse_driver_version(nvidia_smi_text: str) -> str | None:
    """The driver version in the header of plain ``nvidia-smi`` (``Driver Version: ...``)."""
    found = _DRIVER_VERSION.search(nvidia_smi_text)
    return found.group(1) if found else None


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


def gather_facts(host: RemoteHost, deployment: Deployment, parts: Sequence[str] = ()) -> HostFacts:
    """Learn a host's facts in one round trip (the ``facts`` probe).

    Args:
        host: the host to look at (an :class:`opsbook.remote.hosts.Host`).
        deployment: gives the interpreter, model path and server port to check.
        parts: only these facts (the probe's answer keys, e.g. :data:`START_FACTS`); the
            others are left empty. Default: all of them.

    Returns:
        The parsed facts; call :meth:`HostFacts.findings` or :func:`check_facts` on them.

    Raises:
        HostError: the host could not be reached or the probe did not answer.
    """
    args = probe_args(deployment)
    if parts:
        args["parts"] = list(parts)
    answer = host.probe("facts", args, timeout=PROBE_TIMEOUT)
    return facts_from_probe(answer, host=deployment.host.name, server_port=deployment.server_port)


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
        raw=answer,
    )


def _own_server_from(own: Any) -> OwnServer | None:
    if not isinstance(own, dict):
        return None
    return OwnServer(int(own["pid"]), int(own["pgid"]), frozenset(map(int, own["group"])))


def check_facts(facts: HostFacts) -> Result:
    """Preflight's verdict: ok unless a finding is an error.

    Args:
        facts: from :func:`gather_facts`.

    Returns:
        A :class:`Result` whose findings are :meth:`HostFacts.findings` and whose data holds
        the facts (``data["facts"]``) and the summary (``data["summary"]``).
    """
    findings = facts.findings()
    errors = [f for f in findings if f.severity == "error"]
    if errors:
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        message = f"{facts.host}: {errors[0].message}{more}"
    else:
        message = (
            f"{facts.host}: {_gpu_summary(facts)}; vLLM {facts.vllm_version or 'not installed'}"
        )
    summary = {row[0]: row[1] for row in summary_table(facts).rows}
    return Result(
        ok=not errors,
        message=message,
        data={"facts": facts, "summary": summary},
        findings=findings,
    )


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
                ", ".join(f"{p.pid} {p.process_name} ({_mib(p.used_memory_mib)})" for p in holders),
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
                _when(server.started) if server else "",
                server.cmdline if server else "",
            ]
        )
    return Table(["gpu", "pid", "process", "used MiB", "user", "started", "command line"], rows)


def server_table(facts: HostFacts) -> Table:
    """Running model server processes (API servers and their renamed engine workers)."""
    return Table(
        ["pid", "parent", "user", "started", "command line"],
        [[s.pid, s.ppid, s.user, _when(s.started), s.cmdline] for s in facts.servers],
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
        ["memory", f"{_gib(facts.memory_available)} available of {_gib(facts.memory_total)}"],
        ["gpus", _gpu_summary(facts)],
        ["driver", facts.driver],
        ["cuda", facts.cuda],
        ["interconnect", _interconnect(facts.topology)],
        ["python", _python_summary(facts.python)],
        ["vllm", facts.vllm_version or "not installed"],
        ["model path", f"{facts.model_path} ({'exists' if facts.model_path_exists else 'absent'})"],
        ["disk free", f"{_gib(facts.disk_free_bytes)} at {facts.disk_checked_path}"],
        ["/dev/shm", f"{_gib(facts.shm_free)} free of {_gib(facts.shm_total)}"],
        ["server port", _port_summary(facts)],
        ["model servers", len(facts.servers)],
    ]
    return Table(["fact", "value"], rows)


def _csv_records(
    text: str, fields: tuple[str, ...], merge_into: str
) -> list[dict[str, str | None]]:
    """Rows of nvidia-smi CSV as dicts keyed by field name, N/A values as None."""
    lines = [line for line in text.splitlines() if line.strip()]
    if lines and _is_header(lines[0]):
        fields = tuple(_field_name(cell) for cell in lines[0].split(","))
        lines = lines[1:]
    records = []
    for line in lines:
        cells = [cell.strip() for cell in line.split(",")]
        cells = _merge_extra_cells(cells, fields, merge_into)
        records.append({name: _value(cell) for name, cell in zip(fields, cells, strict=False)})
    return records


def _merge_extra_cells(cells: list[str], fields: tuple[str, ...], merge_into: str) -> list[str]:
    """Rejoin a text column that itself held commas (a process or GPU name)."""
    extra = len(cells) - len(fields)
    if extra <= 0 or merge_into not in fields:
        return cells
    at = fields.index(merge_into)
    return [*cells[:at], ", ".join(cells[at : at + extra + 1]), *cells[at + extra + 1 :]]


def _field_name(cell: str) -> str:
    name = _UNIT_SUFFIX.sub("", cell.strip()).lower()
    return _FIELD_ALIASES.get(name, name)


def _is_header(line: str) -> bool:
    return all(_FIELD_NAME.match(_field_name(cell)) for cell in line.split(","))


def _value(cell: str) -> str | None:
    text = cell.strip()
    if not text or text == "N/A" or (text.startswith("[") and text.endswith("]")):
        return None
    return text


def _int(text: str | None) -> int | None:
    """An integer from ``"97887"``, ``"97887 MiB"`` or ``"0 %"``; None otherwise."""
    if text is None:
        return None
    found = re.match(r"^\s*(-?\d+)(?:\s*(?:MiB|%))?\s*$", text)
    return int(found.group(1)) if found else None


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
        return [], f"exit code {code}: {_last_line(output) or 'no output'}"
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
        error = run.get("error") or _last_line(str(run.get("stderr") or "")) or "did not run"
    return PythonInfo(
        requested=requested,
        executable=info.get("executable") or data.get("resolved"),
        version=_first_line(info.get("version")),
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
                f"{_mib(proc.used_memory_mib)} held by pid {proc.pid} ({proc.process_name})",
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
                    f"({_short(sock.cmdline or sock.process)})",
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
                f"/dev/shm has only {_gib(facts.shm_free)} free (of {_gib(facts.shm_total)})",
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
                f"({_gib(facts.shm_leftover_bytes)}), possibly left by killed servers",
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
            f"model server running since {_when(s.started)} as {s.user}: {_short(s.cmdline)}",
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
            f"{facts.model_path} does not exist yet; {_gib(facts.disk_free_bytes)} free at "
            f"{facts.disk_checked_path}",
            source="statvfs",
        )
    ]


def _gpu_summary(facts: HostFacts) -> str:
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


def _gib(value: int | None) -> str:
    return "?" if value is None else f"{value / (1 << 30):.1f} GiB"


def _mib(value: int | None) -> str:
    return "memory (amount not reported)" if value is None else f"{value} MiB"


def _when(started: datetime | None) -> str:
    return started.strftime("%Y-%m-%d %H:%M:%S UTC") if started else "?"


def _short(text: str | None, limit: int = 160) -> str:
    text = text or ""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _first_line(text: str | None) -> str | None:
    return text.splitlines()[0] if text else None


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""
