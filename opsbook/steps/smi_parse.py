"""nvidia-smi's outputs parsed: ``--query-gpu`` and ``--query-compute-apps`` CSV (with the
headers, units and extra cells real drivers print), ``topo -m`` and the versions in its banner.
The facts probe returns them raw; :mod:`opsbook.steps.host_facts` builds a host's facts on them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from opsbook.core.results import Table

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
