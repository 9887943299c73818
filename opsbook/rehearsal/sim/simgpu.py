"""The simulated GPU machine of the rehearsal host: its GPUs and the memory processes hold.

This file is copied to the rehearsal host next to ``gpus.json`` and runs there with the
system Python, so it uses the standard library only and never imports opsbook.

State lives in a *sim dir*:

- ``gpus.json``: the machine (driver and CUDA versions, one record per GPU, the topology);
- ``procs/<pid>.json``: one record per process holding GPU memory,
  ``{"pid", "name", "gpu", "used_mib"}``; records of dead processes are ignored and pruned.

The values of the profiles come from real ``nvidia-smi`` output: ``rtxpro6000`` from an
8-GPU RTX PRO 6000 Blackwell box (driver 595.58.03, CUDA 13.2, PCIe switches), ``h200``
from an H200 machine (driver 580.159.04, CUDA 13.0), extended to several GPUs joined by
NVLink (NV18) as on an HGX H200 board; ``b200`` from an 8-GPU B200 machine (driver 575.57.08,
CUDA 12.9; the table in modal-labs/gpu-glossary@e05d085, gpu-glossary/host-software/
nvidia-smi.md), whose GPUs are joined by NV18 with CPU sets ``0-55,112-167`` and
``56-111,168-223`` (``nvidia-smi topo -m`` of 8-B200 machines in vllm-project/vllm#16336 and
sgl-project/sglang#9064).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import uuid
from pathlib import Path
from typing import Any

CONFIG_FILE = "gpus.json"
PROCS_DIR = "procs"
VENV_MARKER = "opsbook-sim.json"

# Facts of the real 8-GPU RTX PRO 6000 box, in PCI order (nvidia-smi's index order).
_RTXPRO_BOARDS = [
    ("00000000:06:00.0", "GPU-e588912b-1368-6b4f-0e2a-0d08f8afb39b", 2, "1795125027133", 26, 39.17),
    ("00000000:07:00.0", "GPU-f91adc5c-e267-c673-393b-dae0b5217ca6", 3, "1790126062672", 26, 38.58),
    ("00000000:75:00.0", "GPU-1bb613ed-490d-5b4d-d2b2-9f386ae262e0", 0, "1790126018450", 26, 38.85),
    ("00000000:76:00.0", "GPU-546805a9-3012-6e47-b753-aa1d031b6d14", 1, "1790126020383", 26, 37.45),
    ("00000000:84:00.0", "GPU-82383b2b-58e3-1ca5-d958-f53d1752f4f6", 6, "1790126060333", 28, 38.60),
    ("00000000:85:00.0", "GPU-098086aa-080d-c2d7-d316-53de2adae104", 7, "1790426012726", 26, 38.48),
    ("00000000:F4:00.0", "GPU-f47b62c4-d007-983b-6be1-edd04f9e5dd9", 4, "1790426011341", 27, 38.21),
    ("00000000:F5:00.0", "GPU-53470f47-c556-d819-75b5-408c8eec03e4", 5, "1790126017069", 26, 38.53),
]
_H200_BOARD = (
    "00000000:00:06.0",
    "GPU-d02cf7f0-62cd-35e9-8294-3c350cfb105c",
    0,
    "1654524133289",
    40,
    126.0,
)

# The 8 boards of that B200 table: bus id, temperature, power draw. The table shows no UUID,
# serial, minor number or VBIOS: those are made up (see _synthetic_board) or N/A.
_B200_BOARDS = [
    ("00000000:51:00.0", None, 0, None, 27, 136.0),
    ("00000000:52:00.0", None, 1, None, 25, 140.0),
    ("00000000:62:00.0", None, 2, None, 27, 138.0),
    ("00000000:63:00.0", None, 3, None, 26, 138.0),
    ("00000000:75:00.0", None, 4, None, 27, 139.0),
    ("00000000:76:00.0", None, 5, None, 25, 140.0),
    ("00000000:86:00.0", None, 6, None, 27, 142.0),
    ("00000000:87:00.0", None, 7, None, 26, 138.0),
]

PROFILES: dict[str, dict[str, Any]] = {
    "rtxpro6000": {
        "name": "NVIDIA RTX PRO 6000 Blackwell Workstation Edition",
        "driver_version": "595.58.03",
        "cuda_version": "13.2",
        "compute_cap": "12.0",
        "memory_total_mib": 97887,
        # Total minus free on an idle board, as the real -q reports it.
        "memory_reserved_mib": 635,
        "power_limit_w": 600.0,
        "perf": "P8",
        "persistence": "On",
        "ecc": "0",
        "mig": "Disabled",
        "vbios": "98.02.67.00.0A",
        "architecture": "Blackwell",
        "boards": _RTXPRO_BOARDS,
        "cpu_sets": ["0-63,128-191", "64-127,192-238"],
        "interconnect": "pcie",
    },
    "h200": {
        "name": "NVIDIA H200",
        "driver_version": "580.159.04",
        "cuda_version": "13.0",
        "compute_cap": "9.0",
        "memory_total_mib": 143771,
        "memory_reserved_mib": 615,
        "power_limit_w": 700.0,
        "perf": "P0",
        "persistence": "On",
        "ecc": "0",
        "mig": "Disabled",
        "vbios": "96.00.A5.00.1A",
        "architecture": "Hopper",
        "boards": [_H200_BOARD],
        "cpu_sets": ["0-47,96-143", "48-95,144-191"],
        # The real H200 machine was a one-GPU VM with 16 CPUs.
        "single_gpu_cpu_set": "0-15",
        "interconnect": "nvlink",
    },
    "b200": {
        "name": "NVIDIA B200",
        "driver_version": "575.57.08",
        "cuda_version": "12.9",
        "compute_cap": "10.0",
        "memory_total_mib": 183359,
        # 183359 MiB less the 178.35 GiB CUDA reports on a B200 (pytorch/ao#4002).
        "memory_reserved_mib": 729,
        "power_limit_w": 1000.0,
        "perf": "P0",
        "persistence": "On",
        "ecc": "0",
        "mig": "Disabled",
        "vbios": "N/A",
        "architecture": "Blackwell",
        "boards": _B200_BOARDS,
        "cpu_sets": ["0-55,112-167", "56-111,168-223"],
        "interconnect": "nvlink",
    },
}
PROFILES["rtxpro6000-server"] = {
    **PROFILES["rtxpro6000"],
    "name": "NVIDIA RTX PRO 6000 Blackwell Server Edition",
}


def sim_dir() -> Path:
    """Find the sim dir of this machine.

    Returns:
        ``$OPSBOOK_SIM_DIR`` if set; else the ``sim_dir`` named by ``<sys.prefix>/opsbook-sim.json``
        (the marker the rehearsal host writes into its venv); else the folder of this file.
    """
    from_env = os.environ.get("OPSBOOK_SIM_DIR")
    if from_env:
        return Path(from_env)
    marker = Path(sys.prefix) / VENV_MARKER
    try:
        named = json.loads(marker.read_text()).get("sim_dir")
    except (OSError, ValueError, AttributeError):
        named = None
    if named:
        return Path(named)
    return Path(__file__).resolve().parent


def build_config(profile: str = "rtxpro6000", count: int = 8) -> dict[str, Any]:
    """Describe a simulated machine of ``count`` GPUs of a named profile.

    Args:
        profile: a key of ``PROFILES``.
        count: the number of GPUs (1 or more).

    Returns:
        The document stored as ``gpus.json``.

    Raises:
        ValueError: the profile is unknown or the count is not positive.
    """
    if profile not in PROFILES:
        raise ValueError(f"unknown GPU profile {profile!r}; known: {sorted(PROFILES)}")
    if count < 1:
        raise ValueError(f"a simulated machine needs at least one GPU, not {count}")
    spec = PROFILES[profile]
    numa = _numa_nodes(count)
    gpus = [_gpu_record(spec, profile, i, numa[i], count) for i in range(count)]
    for gpu in gpus:
        gpu["links"] = [_link(spec, gpu, other) for other in gpus]
    return {
        "profile": profile,
        "driver_version": spec["driver_version"],
        "cuda_version": spec["cuda_version"],
        "gpus": gpus,
    }


def write_config(directory: Path, profile: str = "rtxpro6000", count: int = 8) -> Path:
    """Create a sim dir (``gpus.json`` and an empty ``procs/``) for a profile.

    Args:
        directory: the sim dir to create or refresh.
        profile: a key of ``PROFILES``.
        count: the number of GPUs.

    Returns:
        The path of ``gpus.json``.
    """
    directory.mkdir(parents=True, exist_ok=True)
    (directory / PROCS_DIR).mkdir(exist_ok=True)
    target = directory / CONFIG_FILE
    _write_json(target, build_config(profile, count))
    return target


def load_config(directory: Path) -> dict[str, Any]:
    """Read ``gpus.json`` of a sim dir.

    Raises:
        FileNotFoundError: the sim dir has no ``gpus.json``.
    """
    config: dict[str, Any] = json.loads((Path(directory) / CONFIG_FILE).read_text())
    return config


def load_gpus(directory: Path) -> list[dict[str, Any]]:
    """The GPU records of a sim dir, in index order."""
    gpus: list[dict[str, Any]] = load_config(directory)["gpus"]
    return gpus


def register_process(directory: Path, pid: int, name: str, gpu: int, used_mib: int) -> None:
    """Record that process ``pid`` holds ``used_mib`` MiB on GPU ``gpu``.

    The record also keeps the process's start time, so that a later process reusing the
    pid is not mistaken for it.
    """
    procs = Path(directory) / PROCS_DIR
    procs.mkdir(parents=True, exist_ok=True)
    record = {
        "pid": int(pid),
        "name": str(name),
        "gpu": int(gpu),
        "used_mib": int(used_mib),
        "start_time": _start_time(int(pid)),
    }
    _write_json(procs / f"{int(pid)}.json", record)


def release_process(directory: Path, pid: int) -> None:
    """Forget the GPU memory of process ``pid`` (no error if it held none)."""
    try:
        (Path(directory) / PROCS_DIR / f"{int(pid)}.json").unlink()
    except FileNotFoundError:
        pass


def live_processes(directory: Path) -> list[dict[str, Any]]:
    """Records of the processes that hold GPU memory and still run, by GPU then pid.

    Records of dead processes are removed when permissions allow.
    """
    procs = Path(directory) / PROCS_DIR
    live = []
    for path in sorted(procs.glob("*.json")) if procs.is_dir() else []:
        try:
            record = json.loads(path.read_text())
            pid = int(record["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if _is_alive(pid, record.get("start_time")):
            live.append(record)
        else:
            _prune(path)
    return sorted(live, key=lambda r: (int(r["gpu"]), int(r["pid"])))


def used_mib(directory: Path, gpu: int) -> int:
    """Memory used on GPU ``gpu``: its idle usage plus that of its live processes."""
    base = int(load_gpus(directory)[gpu].get("base_used_mib", 0))
    held = sum(int(r["used_mib"]) for r in live_processes(directory) if int(r["gpu"]) == gpu)
    return base + held


def _gpu_record(
    spec: dict[str, Any], profile: str, index: int, node: int, count: int
) -> dict[str, Any]:
    boards = spec["boards"]
    if index < len(boards):
        bus, gpu_uuid, minor, serial, temp, power = boards[index]
        made_up = _synthetic_board(profile, index, boards[0])
        gpu_uuid, serial = gpu_uuid or made_up[1], serial or made_up[3]
    else:
        bus, gpu_uuid, minor, serial, temp, power = _synthetic_board(profile, index, boards[0])
    cpu_sets = spec["cpu_sets"]
    cpu_set = cpu_sets[min(node, len(cpu_sets) - 1)]
    if count == 1:
        cpu_set = spec.get("single_gpu_cpu_set", cpu_set)
    return {
        "index": index,
        "name": spec["name"],
        "uuid": gpu_uuid,
        "pci_bus_id": bus,
        "minor_number": minor,
        "serial": serial,
        "vbios_version": spec["vbios"],
        "architecture": spec["architecture"],
        "compute_cap": spec["compute_cap"],
        "memory_total_mib": spec["memory_total_mib"],
        "memory_reserved_mib": spec["memory_reserved_mib"],
        "base_used_mib": 0,
        "persistence": spec["persistence"],
        "display_active": "Off",
        "ecc": spec["ecc"],
        "mig": spec["mig"],
        "fan": "N/A",
        "temperature_c": temp,
        "perf": spec["perf"],
        "power_draw_w": power,
        "power_limit_w": spec["power_limit_w"],
        "utilization_pct": 0,
        "compute_mode": "Default",
        "numa_affinity": node,
        "cpu_affinity": cpu_set,
        "gpu_numa_id": "N/A",
    }


def _synthetic_board(profile: str, index: int, first: tuple[Any, ...]) -> tuple[Any, ...]:
    """A stable made-up board for GPUs beyond those seen on the real machine."""
    digest = hashlib.sha256(f"{profile}/{index}".encode()).hexdigest()
    gpu_uuid = "GPU-" + str(uuid.UUID(digest[:32]))
    bus = f"00000000:{(0x10 + 8 * index) % 256:02X}:00.0"
    return (bus, gpu_uuid, index, str(1790000000000 + index), first[4], first[5])


def _numa_nodes(count: int) -> list[int]:
    """Place the first half of the GPUs on NUMA node 0 and the rest on node 1."""
    half = (count + 1) // 2
    return [0 if i < half or count == 1 else 1 for i in range(count)]


def _link(spec: dict[str, Any], gpu: dict[str, Any], other: dict[str, Any]) -> str:
    if gpu["index"] == other["index"]:
        return " X "
    if spec["interconnect"] == "nvlink":
        return "NV18"
    if gpu["numa_affinity"] != other["numa_affinity"]:
        return "SYS"
    # Boards sit in pairs behind one PCIe switch, as on the real machine.
    return "PIX" if gpu["index"] // 2 == other["index"] // 2 else "NODE"


def _start_time(pid: int) -> int | None:
    """Field 22 of /proc/PID/stat (start time in clock ticks), or None when unreadable."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()
    return int(fields[19]) if len(fields) > 19 else None


def _is_alive(pid: int, start_time: object) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    fields = stat[stat.rfind(")") + 2 :].split()
    if not fields or fields[0] in ("Z", "X"):
        return False
    if isinstance(start_time, int) and len(fields) > 19 and int(fields[19]) != start_time:
        return False
    return True


def _prune(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass


def _write_json(path: Path, document: dict[str, Any]) -> None:
    """Write atomically, so a reader never sees half a file."""
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temp.write_text(json.dumps(document, indent=2) + "\n")
    os.replace(temp, path)
