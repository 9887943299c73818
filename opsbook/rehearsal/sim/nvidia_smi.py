#!/usr/bin/python3
"""A simulated ``nvidia-smi`` for the rehearsal host, answering in the real output formats.

It runs on the rehearsal host with the system Python (standard library only, never
opsbook) and reads the simulated machine through ``simgpu.py`` from the sim dir.
Supported forms: the default table, ``-L``, ``-q``, ``--query-gpu=... --format=csv[,noheader]
[,nounits]``, ``--query-compute-apps=... --format=...``, ``-i``, ``topo -m`` and ``--version``.
Anything else is answered with the real error text and exit code 2.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

EXIT_INVALID_ARGUMENT = 2
EXIT_NOT_FOUND = 6
EXIT_NO_DRIVER = 9

INVALID_COMBINATION = "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help."
NO_DRIVER = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running."
)

WIDE_RULE = "+" + "-" * 89 + "+"
GPU_RULE = "+" + "-" * 41 + "+" + "-" * 24 + "+" + "-" * 22 + "+"
# Drivers before 580 open the line under the version banner with "|" (575.57.08 on B200).
OLD_BANNER_RULE = "|" + GPU_RULE[1:]
NEW_BANNER_RULE_SINCE = 580
GPU_HEADER = [
    "| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |",
    "| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |",
    "|                                         |                        |               MIG M. |",
    "|" + "=" * 41 + "+" + "=" * 24 + "+" + "=" * 22 + "|",
]
PROCESS_HEADER = [
    "| Processes:" + " " * 78 + "|",
    "|  GPU   GI   CI              PID   Type   Process name                        GPU Memory |",
    "|        ID   ID                                                               Usage      |",
    "|" + "=" * 89 + "|",
]
TOPO_LEGEND = "\n".join(
    [
        "",
        "Legend:",
        "",
        "  X    = Self",
        "  SYS  = Connection traversing PCIe as well as the SMP interconnect"
        " between NUMA nodes (e.g., QPI/UPI)",
        "  NODE = Connection traversing PCIe as well as the interconnect"
        " between PCIe Host Bridges within a NUMA node",
        "  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)",
        "  PXB  = Connection traversing multiple PCIe bridges"
        " (without traversing the PCIe Host Bridge)",
        "  PIX  = Connection traversing at most a single PCIe bridge",
        "  NV#  = Connection traversing a bonded set of # NVLinks",
        "",
    ]
)
HELP = """NVIDIA System Management Interface -- v{driver}

nvidia-smi [OPTION1 [ARG1]] [OPTION2 [ARG2]] ...

    -h,   --help                Print usage information and exit.
    -L,   --list-gpus           Display a list of GPUs connected to the system.
    -q,   --query               Display GPU or Unit info.
    -i,   --id=                 Target a specific GPU.
    --query-gpu=                Information about GPU.
    --query-compute-apps=       List of active compute processes.
    --format=                   Comma separated list of format options: csv, noheader, nounits.
    topo -m                     Display the GPU topology matrix.
    --version                   Print the version and exit.
"""


class UsageError(Exception):
    """The command line cannot be answered; carries the text and the exit code."""

    def __init__(self, text: str, code: int = EXIT_INVALID_ARGUMENT):
        super().__init__(text)
        self.text = text
        self.code = code


def load_simgpu() -> ModuleType:
    """Import ``simgpu`` from the sim dir, from ``../sim`` or from the folder of this script."""
    here = Path(__file__).resolve().parent
    candidates = [os.environ.get("OPSBOOK_SIM_DIR", ""), str(here.parent / "sim"), str(here)]
    for folder in candidates:
        if folder and (Path(folder) / "simgpu.py").is_file():
            sys.path.insert(0, folder)
            break
    import simgpu

    return simgpu


class Machine:
    """A snapshot of the simulated machine: its GPUs and the processes holding memory."""

    def __init__(self, config: dict[str, Any], processes: list[dict[str, Any]]):
        self.driver = str(config["driver_version"])
        self.cuda = str(config["cuda_version"])
        self.gpus: list[dict[str, Any]] = list(config["gpus"])
        self.processes = processes

    def used(self, gpu: dict[str, Any]) -> int:
        held = sum(int(p["used_mib"]) for p in self.processes if int(p["gpu"]) == gpu["index"])
        return int(gpu.get("base_used_mib", 0)) + held

    def free(self, gpu: dict[str, Any]) -> int:
        total = int(gpu["memory_total_mib"])
        return max(0, total - int(gpu["memory_reserved_mib"]) - self.used(gpu))

    def select(self, ids: str | None) -> list[dict[str, Any]]:
        """The GPUs named by ``-i`` (indices, UUIDs or bus ids, comma separated)."""
        if ids is None:
            return self.gpus
        chosen = []
        for wanted in ids.split(","):
            match = [g for g in self.gpus if wanted.strip() in _identities(g)]
            if not match:
                raise UsageError("No devices were found", EXIT_NOT_FOUND)
            chosen += match
        return chosen

    def gpu_of(self, process: dict[str, Any]) -> dict[str, Any]:
        return self.gpus[int(process["gpu"])]


def _identities(gpu: dict[str, Any]) -> set[str]:
    bus = str(gpu["pci_bus_id"])
    return {str(gpu["index"]), str(gpu["uuid"]), bus, bus.lower(), bus[4:], bus[4:].lower()}


# The default table.


def render_table(machine: Machine, gpus: list[dict[str, Any]], now: float) -> str:
    """The default ``nvidia-smi`` output, laid out as the machine's driver prints it."""
    lines = [time.strftime("%a %b %e %H:%M:%S %Y", time.localtime(now)) + " " * 7, WIDE_RULE]
    lines.append(
        f"| NVIDIA-SMI {machine.driver:<22} Driver Version: {machine.driver:<14} "
        f"CUDA Version: {machine.cuda:<9}|"
    )
    lines += [_banner_rule(machine.driver), *GPU_HEADER]
    for position, gpu in enumerate(gpus):
        if position:
            lines.append(GPU_RULE)
        lines += _gpu_rows(machine, gpu)
    lines += [GPU_RULE, "", WIDE_RULE, *PROCESS_HEADER]
    shown = {g["index"] for g in gpus}
    processes = [p for p in machine.processes if int(p["gpu"]) in shown]
    if processes:
        lines += [_process_row(p) for p in processes]
    else:
        lines.append("|  No running processes found" + " " * 61 + "|")
    lines.append(WIDE_RULE)
    return "\n".join(lines) + "\n"


def _banner_rule(driver: str) -> str:
    major = driver.split(".")[0]
    return (
        GPU_RULE if not major.isdigit() or int(major) >= NEW_BANNER_RULE_SINCE else OLD_BANNER_RULE
    )


def _gpu_rows(machine: Machine, gpu: dict[str, Any]) -> list[str]:
    name = _truncate_end(str(gpu["name"]), 27)
    fan = str(gpu["fan"])
    power = f"{round(float(gpu['power_draw_w']))}W"
    cap = f"{round(float(gpu['power_limit_w']))}W"
    used = f"{machine.used(gpu)}MiB"
    total = f"{gpu['memory_total_mib']}MiB"
    util = f"{gpu['utilization_pct']}%"
    return [
        f"|{gpu['index']:>4}  {name:<27}    {gpu['persistence']:<4}"
        f"|{gpu['pci_bus_id']:>19} {gpu['display_active']:>3} |{gpu['ecc']:>21} |",
        f"| {fan:>3}  {gpu['temperature_c']:>3}C{gpu['perf']:>6}{power:>16} / {cap:>5} "
        f"|{used:>11} / {total:>9} |{util:>8}{gpu['compute_mode']:>13} |",
        f"|{'':41}|{'':24}|{gpu['mig']:>21} |",
    ]


def _process_row(process: dict[str, Any]) -> str:
    name = _truncate_start(str(process["name"]), 37)
    memory = f"{process['used_mib']}MiB"
    return (
        f"|{process['gpu']:>5}{'N/A':>6}{'N/A':>5}{process['pid']:>16}{'C':>7}   "
        f"{name:<37}{memory:>9} |"
    )


def _truncate_end(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def _truncate_start(text: str, width: int) -> str:
    return text if len(text) <= width else "..." + text[-(width - 3) :]


# -L and --version.


def render_list(gpus: list[dict[str, Any]]) -> str:
    return "".join(f"GPU {g['index']}: {g['name']} (UUID: {g['uuid']})\n" for g in gpus)


def render_version(machine: Machine) -> str:
    nvml = ".".join(machine.driver.split(".")[:2])
    return (
        f"NVIDIA-SMI version  : {machine.driver}\n"
        f"NVML version        : {nvml}\n"
        f"DRIVER version      : {machine.driver}\n"
        f"CUDA Version        : {machine.cuda}\n"
    )


# CSV queries.


def _mib(value: int) -> tuple[str, str]:
    return (str(value), "MiB")


def _watts(value: object) -> tuple[str, str]:
    return (f"{float(str(value)):.2f}", "W")


GpuField = Callable[[Machine, dict[str, Any]], tuple[str, str]]

GPU_FIELDS: dict[str, tuple[str, str, GpuField]] = {
    # query name: (header, unit in header, value and its unit)
    "timestamp": ("timestamp", "", lambda m, g: (_csv_time(), "")),
    "driver_version": ("driver_version", "", lambda m, g: (m.driver, "")),
    "count": ("count", "", lambda m, g: (str(len(m.gpus)), "")),
    "index": ("index", "", lambda m, g: (str(g["index"]), "")),
    "name": ("name", "", lambda m, g: (str(g["name"]), "")),
    "serial": ("serial", "", lambda m, g: (str(g["serial"]), "")),
    "uuid": ("uuid", "", lambda m, g: (str(g["uuid"]), "")),
    "pci.bus_id": ("pci.bus_id", "", lambda m, g: (str(g["pci_bus_id"]), "")),
    "vbios_version": ("vbios_version", "", lambda m, g: (str(g["vbios_version"]), "")),
    "compute_cap": ("compute_cap", "", lambda m, g: (str(g["compute_cap"]), "")),
    "persistence_mode": (
        "persistence_mode",
        "",
        lambda m, g: ("Enabled" if g["persistence"] == "On" else "Disabled", ""),
    ),
    "pstate": ("pstate", "", lambda m, g: (str(g["perf"]), "")),
    "compute_mode": ("compute_mode", "", lambda m, g: (str(g["compute_mode"]), "")),
    "mig.mode.current": ("mig.mode.current", "", lambda m, g: (str(g["mig"]), "")),
    "fan.speed": ("fan.speed", " [%]", lambda m, g: _optional(g["fan"], "%")),
    "memory.total": ("memory.total", " [MiB]", lambda m, g: _mib(int(g["memory_total_mib"]))),
    "memory.reserved": (
        "memory.reserved",
        " [MiB]",
        lambda m, g: _mib(int(g["memory_reserved_mib"])),
    ),
    "memory.used": ("memory.used", " [MiB]", lambda m, g: _mib(m.used(g))),
    "memory.free": ("memory.free", " [MiB]", lambda m, g: _mib(m.free(g))),
    "utilization.gpu": ("utilization.gpu", " [%]", lambda m, g: (str(g["utilization_pct"]), "%")),
    "utilization.memory": ("utilization.memory", " [%]", lambda m, g: ("0", "%")),
    "temperature.gpu": ("temperature.gpu", "", lambda m, g: (str(g["temperature_c"]), "")),
    "power.draw": ("power.draw", " [W]", lambda m, g: _watts(g["power_draw_w"])),
    "power.limit": ("power.limit", " [W]", lambda m, g: _watts(g["power_limit_w"])),
}
GPU_ALIASES = {
    "gpu_name": "name",
    "gpu_serial": "serial",
    "gpu_uuid": "uuid",
    "gpu_bus_id": "pci.bus_id",
    "persistence-mode": "persistence_mode",
    "enforced.power.limit": "power.limit",
    "power.draw.instant": "power.draw",
    "power.draw.average": "power.draw",
}

AppField = Callable[[Machine, dict[str, Any]], tuple[str, str]]

APP_FIELDS: dict[str, tuple[str, str, AppField]] = {
    "timestamp": ("timestamp", "", lambda m, p: (_csv_time(), "")),
    "gpu_name": ("gpu_name", "", lambda m, p: (str(m.gpu_of(p)["name"]), "")),
    "gpu_bus_id": ("gpu_bus_id", "", lambda m, p: (str(m.gpu_of(p)["pci_bus_id"]), "")),
    "gpu_serial": ("gpu_serial", "", lambda m, p: (str(m.gpu_of(p)["serial"]), "")),
    "gpu_uuid": ("gpu_uuid", "", lambda m, p: (str(m.gpu_of(p)["uuid"]), "")),
    "pid": ("pid", "", lambda m, p: (str(p["pid"]), "")),
    "process_name": ("process_name", "", lambda m, p: (str(p["name"]), "")),
    "used_gpu_memory": ("used_gpu_memory", " [MiB]", lambda m, p: _mib(int(p["used_mib"]))),
}
APP_ALIASES = {"name": "process_name", "used_memory": "used_gpu_memory"}


def _optional(value: object, unit: str) -> tuple[str, str]:
    return ("[N/A]", "") if value == "N/A" else (str(value), unit)


def _csv_time() -> str:
    now = time.time()
    return time.strftime("%Y/%m/%d %H:%M:%S", time.localtime(now)) + f".{int(now % 1 * 1000):03d}"


def render_csv(
    fields: str,
    options: str,
    rows: list[Any],
    table: dict[str, tuple[str, str, Any]],
    aliases: dict[str, str],
    machine: Machine,
) -> str:
    """Answer a ``--query-*=fields --format=options`` request in nvidia-smi's CSV.

    Raises:
        UsageError: a field or a format option is unknown.
    """
    flags = [o.strip() for o in options.split(",") if o.strip()]
    if "csv" not in flags or set(flags) - {"csv", "noheader", "nounits"}:
        raise UsageError(f'"{options}" is not a valid format.')
    names = []
    for field in (f.strip() for f in fields.split(",")):
        canonical = aliases.get(field, field)
        if canonical not in table:
            raise UsageError(f'Field "{field}" is not a valid field to query.\n')
        names.append(canonical)
    units = "nounits" not in flags
    lines = []
    if "noheader" not in flags:
        lines.append(", ".join(table[n][0] + (table[n][1] if units else "") for n in names))
    for row in rows:
        cells = []
        for n in names:
            value, unit = table[n][2](machine, row)
            cells.append(f"{value} {unit}" if unit and units else value)
        lines.append(", ".join(cells))
    return "".join(line + "\n" for line in lines)


# topo -m


def render_topology(gpus: list[dict[str, Any]]) -> str:
    """``nvidia-smi topo -m``: the matrix (with its underlined header) and the legend."""
    columns = [f"GPU{g['index']}" for g in gpus] + ["CPU Affinity", "NUMA Affinity", "GPU NUMA ID"]
    lines = ["\t\x1b[4m" + "\t".join(columns) + "\x1b[0m"]
    for gpu in gpus:
        links = [gpu["links"][other["index"]] for other in gpus]
        tail = [str(gpu["cpu_affinity"]), str(gpu["numa_affinity"]), "", str(gpu["gpu_numa_id"])]
        lines.append("\t".join([f"GPU{gpu['index']}", *links, *tail]))
    return "\n".join(lines) + "\n" + TOPO_LEGEND


# -q


def render_query(machine: Machine, gpus: list[dict[str, Any]], now: float) -> str:
    """A shortened ``nvidia-smi -q``: the sections and keys tools read, in the real layout."""
    out = ["", "==============NVSMI LOG==============", ""]
    out.append(_kv(0, "Timestamp", time.strftime("%a %b %e %H:%M:%S %Y", time.localtime(now))))
    out.append(_kv(0, "Driver Version", machine.driver))
    out.append(_kv(0, "CUDA Version", machine.cuda))
    out += ["", _kv(0, "Attached GPUs", str(len(machine.gpus)))]
    for gpu in gpus:
        out += _query_gpu(machine, gpu)
    return "\n".join(out) + "\n"


def _query_gpu(machine: Machine, gpu: dict[str, Any]) -> list[str]:
    processes = [p for p in machine.processes if int(p["gpu"]) == gpu["index"]]
    lines = [
        f"GPU {gpu['pci_bus_id']}",
        _kv(1, "Product Name", gpu["name"]),
        _kv(1, "Product Brand", "NVIDIA"),
        _kv(1, "Product Architecture", gpu["architecture"]),
        _kv(1, "Persistence Mode", "Enabled" if gpu["persistence"] == "On" else "Disabled"),
        _head(1, "MIG Mode"),
        _kv(2, "Current", gpu["mig"]),
        _kv(2, "Pending", gpu["mig"]),
        _kv(1, "Serial Number", gpu["serial"]),
        _kv(1, "GPU UUID", gpu["uuid"]),
        _kv(1, "Minor Number", gpu["minor_number"]),
        _kv(1, "VBIOS Version", gpu["vbios_version"]),
        _head(1, "PCI"),
        _kv(2, "Bus Id", gpu["pci_bus_id"]),
        _kv(1, "Fan Speed", gpu["fan"]),
        _kv(1, "Performance State", gpu["perf"]),
        _head(1, "FB Memory Usage"),
        _kv(2, "Total", f"{gpu['memory_total_mib']} MiB"),
        _kv(2, "Reserved", f"{gpu['memory_reserved_mib']} MiB"),
        _kv(2, "Used", f"{machine.used(gpu)} MiB"),
        _kv(2, "Free", f"{machine.free(gpu)} MiB"),
        _kv(1, "Compute Mode", gpu["compute_mode"]),
        _head(1, "Utilization"),
        _kv(2, "GPU", f"{gpu['utilization_pct']} %"),
        _kv(2, "Memory", "0 %"),
        _head(1, "Temperature"),
        _kv(2, "GPU Current Temp", f"{gpu['temperature_c']} C"),
        _head(1, "GPU Power Readings"),
        _kv(2, "Average Power Draw", f"{float(gpu['power_draw_w']):.2f} W"),
        _kv(2, "Current Power Limit", f"{float(gpu['power_limit_w']):.2f} W"),
    ]
    if not processes:
        return [*lines, _kv(1, "Processes", "None"), ""]
    lines.append(_head(1, "Processes"))
    for p in processes:
        lines += [
            _kv(2, "GPU instance ID", "N/A"),
            _kv(2, "Compute instance ID", "N/A"),
            _kv(2, "Process ID", p["pid"]),
            _kv(3, "Type", "C"),
            _kv(3, "Name", p["name"]),
            _kv(3, "Used GPU Memory", f"{p['used_mib']} MiB"),
        ]
    return [*lines, ""]


def _kv(depth: int, key: str, value: object) -> str:
    return f"{' ' * 4 * depth}{key}".ljust(55) + f": {value}"


def _head(depth: int, key: str) -> str:
    return " " * 4 * depth + key


# The command line.


def parse(argv: list[str]) -> dict[str, Any]:
    """Read nvidia-smi's options into a dict of what was asked.

    Raises:
        UsageError: an option is unknown or misses its value.
    """
    asked: dict[str, Any] = {"topo": False}
    args = list(argv)
    if args and args[0] == "topo":
        args.pop(0)
        asked["topo"] = True
    valued = {
        "-i": "id",
        "--id": "id",
        "--query-gpu": "query_gpu",
        "--query-compute-apps": "query_apps",
        "--format": "format",
    }
    flags = {
        "-h": "help",
        "--help": "help",
        "-L": "list",
        "--list-gpus": "list",
        "-q": "query",
        "--query": "query",
        "--version": "version",
        "-m": "matrix",
        "--matrix": "matrix",
    }
    while args:
        arg = args.pop(0)
        name, has_value, value = arg.partition("=")
        if name in valued:
            if not has_value:
                if not args:
                    raise UsageError(
                        f"ERROR: Option {arg} requires a value. Please run 'nvidia-smi -h'."
                    )
                value = args.pop(0)
            asked[valued[name]] = value
        elif arg in flags:
            asked[flags[arg]] = True
        else:
            raise UsageError(f"ERROR: Option {arg} is not recognized. Please run 'nvidia-smi -h'.")
    return asked


def answer(asked: dict[str, Any], machine: Machine, now: float) -> str:
    """The output for a parsed command line.

    Raises:
        UsageError: the options do not go together.
    """
    if asked.get("help"):
        return HELP.format(driver=machine.driver)
    if asked.get("version"):
        return render_version(machine)
    gpus = machine.select(asked.get("id"))
    if asked["topo"]:
        if not asked.get("matrix") or set(asked) - {"topo", "matrix", "id"}:
            raise UsageError(INVALID_COMBINATION)
        return render_topology(gpus)
    _check_combination(asked)
    modes = [k for k in ("list", "query", "query_gpu", "query_apps") if asked.get(k)]
    if not modes:
        return render_table(machine, gpus, now)
    if modes == ["list"]:
        return render_list(gpus)
    if modes == ["query"]:
        return render_query(machine, gpus, now)
    if modes == ["query_gpu"]:
        query = asked["query_gpu"]
        return render_csv(query, asked["format"], gpus, GPU_FIELDS, GPU_ALIASES, machine)
    shown = {g["index"] for g in gpus}
    apps = [p for p in machine.processes if int(p["gpu"]) in shown]
    return render_csv(asked["query_apps"], asked["format"], apps, APP_FIELDS, APP_ALIASES, machine)


def _check_combination(asked: dict[str, Any]) -> None:
    modes = [k for k in ("list", "query", "query_gpu", "query_apps") if asked.get(k)]
    csv_query = bool(modes) and modes[0] in ("query_gpu", "query_apps")
    if len(modes) > 1 or asked.get("matrix") or ("format" in asked) != csv_query:
        raise UsageError(INVALID_COMBINATION)


def main(argv: list[str] | None = None) -> int:
    """Run the simulated nvidia-smi; returns the exit code."""
    simgpu = load_simgpu()
    directory = simgpu.sim_dir()
    try:
        config = simgpu.load_config(directory)
    except (OSError, ValueError):
        sys.stdout.write(NO_DRIVER + "\n")
        return EXIT_NO_DRIVER
    machine = Machine(config, simgpu.live_processes(directory))
    try:
        text = answer(parse(sys.argv[1:] if argv is None else argv), machine, time.time())
    except UsageError as error:
        sys.stdout.write(error.text + "\n")
        return error.code
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
