"""Probe: everything 00_preflight needs to know about a host, gathered in one round trip.

Stdlib only and Python 3.8 compatible, because it runs under whatever ``python3`` the host
has. It never fails because a command is missing: each command's outcome is reported as
data (found, exit code, output), and the caller turns it into findings. The nvidia-smi
outputs are returned raw and parsed by ``opsbook.steps.host_facts``, so the parsers are tested on
real
output rather than on what this probe would make of it.

Args (the dict given to ``main``):
    python: the deployment's interpreter (a path, or a name looked up on PATH).
    model_path: the checkpoint directory (it may not exist yet).
    ports: the ports the deployment will listen on.
    launch_record: where 04_launch records the server it started (``launch.json``; relative
        paths are taken from the home folder), so that its processes are known as opsbook's.
"""

from __future__ import annotations

import json
import os
import platform
import pwd
import re
import shutil
import subprocess
import threading
from collections.abc import Callable
from typing import Any

NVIDIA_SMI_TIMEOUT = 20.0
PYTHON_TIMEOUT = 30.0
OUTPUT_LIMIT = 200_000

QUERY_GPU = (
    "--query-gpu=index,name,compute_cap,memory.total,memory.used,memory.free,driver_version,uuid"
)
QUERY_APPS = "--query-compute-apps=pid,process_name,used_memory,gpu_uuid"
CSV_FORMAT = "--format=csv,noheader,nounits"

# Non-interactive shells often lack the driver's folder on PATH; these are where drivers and
# container runtimes put nvidia-smi.
NVIDIA_SMI_FALLBACKS = ("/usr/bin/nvidia-smi", "/usr/local/nvidia/bin/nvidia-smi")

TCP_LISTEN = "0A"
SERVER_PATTERN = re.compile(r"(^|[\s/])vllm\s+serve(\s|$)|vllm\.entrypoints|^VLLM::")
STALE_SHM_PATTERN = re.compile(r"^(psm_|sem\.mp-)")

# Run by the deployment's interpreter: its identity and its vLLM, without importing vLLM
# (which imports torch and takes seconds); the version is read from the package's files.
INTERPRETER_SCRIPT = r"""
import json, os, re, sys
out = {"version": sys.version, "executable": sys.executable, "prefix": sys.prefix,
       "version_info": list(sys.version_info[:3]), "vllm_dist": None,
       "vllm_module": None, "vllm_location": None}
try:
    import importlib.metadata as m
    out["vllm_dist"] = m.version("vllm")
except Exception:
    pass
try:
    import importlib.util as u
    spec = u.find_spec("vllm")
    if spec is not None and spec.origin:
        folder = os.path.dirname(spec.origin)
        out["vllm_location"] = folder
        for name in ("_version.py", "version.py", "__init__.py"):
            try:
                with open(os.path.join(folder, name)) as f:
                    found = re.search(r"^__version__\s*(?::\s*str\s*)?=\s*(?:version\s*=\s*)?"
                                      r"['\"]([^'\"]+)['\"]", f.read(), re.M)
            except OSError:
                continue
            if found:
                out["vllm_module"] = found.group(1)
                break
except Exception:
    pass
print(json.dumps(out))
"""


def main(args: dict[str, Any]) -> dict[str, Any]:
    """Gather the host's facts.

    Args:
        args: ``python``, ``model_path`` and ``ports`` (see the module docstring); ``parts``,
            the names of the facts wanted (default: all of them).

    Returns:
        A JSON-ready dict: raw nvidia-smi outputs under ``nvidia_smi`` and structured facts.
    """
    gather: dict[str, Any] = {
        "user": lambda: _user_name(os.getuid()),
        "nvidia_smi": _nvidia_smi,
        "os": _os_facts,
        "cpu_count": _cpu_count,
        "memory": _meminfo,
        "python": lambda: _interpreter(str(args.get("python") or "python3")),
        "disk": lambda: _disk(str(args.get("model_path") or "")),
        "shm": _shm,
        "listening": _listening,
        "servers": _servers,
        "own_launch": lambda: _own_launch(str(args.get("launch_record") or "")),
        "ports": lambda: [int(p) for p in args.get("ports") or []],
    }
    wanted = [name for name in args.get("parts") or list(gather) if name in gather]
    # The parts that start programs (nvidia-smi, the interpreter) wait on them side by side:
    # on a GPU host each nvidia-smi start takes a fraction of a second.
    waits = [name for name in wanted if name in STARTS_PROGRAMS]
    answers = _at_once({name: gather[name] for name in waits})
    answers.update((name, gather[name]()) for name in wanted if name not in answers)
    return {"probe_pid": os.getpid(), **{name: answers[name] for name in wanted}}


# The parts of the answer that run other programs.
STARTS_PROGRAMS = frozenset({"nvidia_smi", "python"})


def _at_once(calls: dict[str, Callable[[], Any]]) -> dict[str, Any]:
    """Each call's value, the calls made on threads of their own (the last one here)."""
    answers: dict[str, Any] = {}
    if not calls:
        return answers

    def call(name: str) -> None:
        answers[name] = calls[name]()

    *others, last = calls
    threads = [threading.Thread(target=call, args=(name,)) for name in others]
    for thread in threads:
        thread.start()
    call(last)
    for thread in threads:
        thread.join()
    return answers


def _run(argv: list[str], timeout: float) -> dict[str, Any]:
    """Run a command; report what happened instead of raising."""
    outcome: dict[str, Any] = {
        "argv": argv,
        "found": True,
        "exit_code": None,
        "stdout": "",
        "stderr": "",
        "error": None,
    }
    try:
        proc = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout)
    except FileNotFoundError:
        outcome["found"] = False
        outcome["error"] = "not found"
        return outcome
    except PermissionError as e:
        outcome["error"] = f"not executable: {e}"
        return outcome
    except subprocess.TimeoutExpired:
        outcome["error"] = f"timed out after {timeout:g}s"
        return outcome
    except OSError as e:
        outcome["error"] = str(e)
        return outcome
    outcome["exit_code"] = proc.returncode
    outcome["stdout"] = proc.stdout.decode("utf-8", "replace")[:OUTPUT_LIMIT]
    outcome["stderr"] = proc.stderr.decode("utf-8", "replace")[:OUTPUT_LIMIT]
    return outcome


def _find_nvidia_smi() -> str | None:
    found = shutil.which("nvidia-smi")
    if found:
        return found
    for candidate in NVIDIA_SMI_FALLBACKS:
        if os.access(candidate, os.X_OK):
            return candidate
    return None


def _nvidia_smi() -> dict[str, Any]:
    path = _find_nvidia_smi()
    if path is None:
        return {"path": None}
    found = _at_once(
        {
            "query_gpu": lambda: _run([path, QUERY_GPU, CSV_FORMAT], NVIDIA_SMI_TIMEOUT),
            "compute_apps": lambda: _run([path, QUERY_APPS, CSV_FORMAT], NVIDIA_SMI_TIMEOUT),
        }
    )
    query_gpu = found["query_gpu"]
    answer: dict[str, Any] = {
        "path": path,
        "query_gpu": query_gpu,
        "compute_apps": found["compute_apps"],
    }
    answer.update(_static_smi(path, query_gpu))
    return answer


def _static_smi(path: str, query_gpu: dict[str, Any]) -> dict[str, Any]:
    """``nvidia-smi topo -m`` and the banner table (read only for the driver and CUDA
    versions): fixed until the machine reboots or the driver changes, so kept on the host
    for that long. Each nvidia-smi start costs a real host a fraction of a second of CPU; a
    fleet's nightly preflight needs only the two live queries."""
    key = _static_key(path, query_gpu)
    cache = os.path.join(_cache_folder(), "nvidia-smi-static.json")
    try:
        with open(cache) as f:
            kept = json.load(f)
        if key is not None and kept.get("key") == key:
            return {"topo": kept["topo"], "table": kept["table"], "static_cached": True}
    except (OSError, ValueError, KeyError, AttributeError):
        pass
    found = _at_once(
        {
            "topo": lambda: _run([path, "topo", "-m"], NVIDIA_SMI_TIMEOUT),
            "table": lambda: _run([path], NVIDIA_SMI_TIMEOUT),
        }
    )
    if key is not None and all(found[k]["exit_code"] == 0 for k in found):
        _write_json(cache, dict(found, key=key))
    found["static_cached"] = False
    return found


def _static_key(path: str, query_gpu: dict[str, Any]) -> list[Any] | None:
    """What the static outputs depend on: this boot, the nvidia-smi binary (a driver update
    replaces it) and the GPUs present (index, name, driver and UUID of each)."""
    boot = _read("/proc/sys/kernel/random/boot_id")
    try:
        st = os.stat(os.path.realpath(path))
    except OSError:
        return None
    if not boot or query_gpu.get("exit_code") != 0:
        return None
    gpus = [
        [cell.strip() for i, cell in enumerate(line.split(",")) if i in (0, 1, 6, 7)]
        for line in str(query_gpu.get("stdout") or "").splitlines()
        if line.strip()
    ]
    return [1, boot.strip(), os.path.realpath(path), st.st_mtime_ns, st.st_size, gpus]


def _cache_folder() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "opsbook")


def _write_json(path: str, data: dict[str, Any]) -> None:
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        temp = f"{path}.{os.getpid()}.tmp"
        with open(temp, "w") as f:
            json.dump(data, f)
        os.replace(temp, path)
    except OSError:
        pass  # a read-only home only costs the next preflight two nvidia-smi runs


def _os_facts() -> dict[str, Any]:
    release: dict[str, str] = {}
    try:
        with open("/etc/os-release") as f:
            for line in f:
                key, sep, value = line.strip().partition("=")
                if sep:
                    release[key] = value.strip().strip("\"'")
    except OSError:
        pass
    uname = os.uname()
    return {
        "pretty_name": release.get("PRETTY_NAME"),
        "id": release.get("ID"),
        "version_id": release.get("VERSION_ID"),
        "hostname": uname.nodename,
        "system": uname.sysname,
        "kernel": uname.release,
        "kernel_version": uname.version,
        "machine": uname.machine,
        "probe_python": platform.python_version(),
    }


def _cpu_count() -> dict[str, Any]:
    usable = None
    if hasattr(os, "sched_getaffinity"):
        try:
            usable = len(os.sched_getaffinity(0))
        except OSError:
            pass
    return {"total": os.cpu_count(), "usable": usable}


def _meminfo() -> dict[str, Any]:
    values: dict[str, int] = {}
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                key, _, rest = line.partition(":")
                parts = rest.split()
                if parts and parts[0].isdigit():
                    scale = 1024 if parts[1:2] == ["kB"] else 1
                    values[key] = int(parts[0]) * scale
    except OSError:
        pass
    return {
        "total_bytes": values.get("MemTotal"),
        "available_bytes": values.get("MemAvailable"),
        "swap_total_bytes": values.get("SwapTotal"),
    }


def _interpreter(python: str) -> dict[str, Any]:
    expanded = os.path.expanduser(python)
    resolved = expanded if "/" in expanded else shutil.which(expanded)
    facts: dict[str, Any] = {"requested": python, "resolved": resolved, "run": None, "info": None}
    if resolved is None:
        return facts
    run = _run([resolved, "-c", INTERPRETER_SCRIPT], PYTHON_TIMEOUT)
    facts["run"] = {k: run[k] for k in ("found", "exit_code", "stderr", "error")}
    if run["exit_code"] == 0:
        try:
            facts["info"] = json.loads(run["stdout"].strip().splitlines()[-1])
        except (ValueError, IndexError):
            facts["run"]["error"] = f"unexpected output: {run['stdout'][:200]!r}"
    return facts


def _statvfs(path: str) -> dict[str, int]:
    st = os.statvfs(path)
    return {
        "total_bytes": st.f_blocks * st.f_frsize,
        "free_bytes": st.f_bavail * st.f_frsize,
    }


def _nearest_existing(path: str) -> str:
    current = os.path.abspath(os.path.expanduser(path or "."))
    while not os.path.exists(current) and current != os.path.dirname(current):
        current = os.path.dirname(current)
    return current


def _disk(model_path: str) -> dict[str, Any]:
    checked = _nearest_existing(model_path)
    facts: dict[str, Any] = {
        "path": model_path,
        "checked": checked,
        "exists": bool(model_path) and os.path.exists(os.path.expanduser(model_path)),
        "total_bytes": None,
        "free_bytes": None,
        "error": None,
    }
    try:
        facts.update(_statvfs(checked))
    except OSError as e:
        facts["error"] = str(e)
    return facts


def _shm() -> dict[str, Any]:
    facts: dict[str, Any] = {
        "path": "/dev/shm",
        "exists": os.path.isdir("/dev/shm"),
        "total_bytes": None,
        "free_bytes": None,
        "leftover_files": 0,
        "leftover_bytes": 0,
        "error": None,
    }
    if not facts["exists"]:
        return facts
    try:
        facts.update(_statvfs("/dev/shm"))
        for entry in os.scandir("/dev/shm"):
            if STALE_SHM_PATTERN.match(entry.name):
                facts["leftover_files"] += 1
                facts["leftover_bytes"] += entry.stat(follow_symlinks=False).st_blocks * 512
    except OSError as e:
        facts["error"] = str(e)
    return facts


def _pids() -> list[int]:
    return sorted(int(name) for name in os.listdir("/proc") if name.isdigit())


def _read(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            return f.read().decode("utf-8", "replace")
    except OSError:
        return None


def _socket_owners() -> dict[str, int]:
    """Map socket inodes to PIDs, for the processes this user may look into."""
    owners: dict[str, int] = {}
    for pid in _pids():
        folder = f"/proc/{pid}/fd"
        try:
            fds = os.listdir(folder)
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(os.path.join(folder, fd))
            except OSError:
                continue
            if target.startswith("socket:["):
                owners.setdefault(target[8:-1], pid)
    return owners


def _ipv4(hex_address: str) -> str:
    raw = bytes.fromhex(hex_address)
    return ".".join(str(b) for b in raw[::-1])


def _ipv6(hex_address: str) -> str:
    import ipaddress

    raw = bytes.fromhex(hex_address)
    # The kernel prints the address as four host-order (little-endian) 32-bit words.
    ordered = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
    return str(ipaddress.IPv6Address(ordered))


def _listening() -> list[dict[str, Any]]:
    owners: dict[str, int] | None = None
    sockets: list[dict[str, Any]] = []
    for table, family, decode in (
        ("/proc/net/tcp", "tcp", _ipv4),
        ("/proc/net/tcp6", "tcp6", _ipv6),
    ):
        text = _read(table)
        if text is None:
            continue
        for line in text.splitlines()[1:]:
            fields = line.split()
            if len(fields) < 10 or fields[3] != TCP_LISTEN:
                continue
            if owners is None:
                owners = _socket_owners()
            address, _, port = fields[1].partition(":")
            pid = owners.get(fields[9])
            sockets.append(
                {
                    "family": family,
                    "address": decode(address),
                    "port": int(port, 16),
                    "uid": int(fields[7]),
                    "user": _user_name(int(fields[7])),
                    "inode": fields[9],
                    "pid": pid,
                    "process": _comm(pid) if pid else None,
                    "cmdline": _cmdline(pid) if pid else None,
                }
            )
    sockets.sort(key=lambda s: (s["port"], s["family"]))
    return sockets


def _comm(pid: int) -> str | None:
    text = _read(f"/proc/{pid}/comm")
    return text.strip() if text is not None else None


def _cmdline(pid: int) -> str | None:
    text = _read(f"/proc/{pid}/cmdline")
    if text is None:
        return None
    return " ".join(part for part in text.split("\0") if part)


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _boot_time() -> float | None:
    text = _read("/proc/stat") or ""
    for line in text.splitlines():
        if line.startswith("btime "):
            return float(line.split()[1])
    return None


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (state, ppid, pgrp, ...); the
    name itself may hold spaces and parentheses."""
    stat = _read(f"/proc/{pid}/stat")
    return stat[stat.rfind(")") + 2 :].split() if stat else None


def _process(pid: int, boot: float | None, ticks: int) -> dict[str, Any] | None:
    rest = _stat_fields(pid)
    if rest is None:
        return None
    try:
        uid = os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None
    started = boot + int(rest[19]) / ticks if boot is not None and len(rest) > 19 else None
    return {
        "pid": pid,
        "ppid": int(rest[1]) if len(rest) > 1 else None,
        "user": _user_name(uid),
        "started": started,
        "comm": _comm(pid),
        "cmdline": _cmdline(pid) or "",
    }


def _own_launch(path: str) -> dict[str, Any] | None:
    """The server 04_launch recorded, when it still runs: its pid, process group and the
    group's members (the engine core and workers vLLM forks stay in it). The recorded start
    time tells the process from a later one that reused its pid."""
    if not path:
        return None
    path = os.path.expanduser(path)
    if not os.path.isabs(path):
        path = os.path.join(os.path.expanduser("~"), path)
    try:
        with open(path) as f:
            record = json.load(f)
        pid, pgid, start = int(record["pid"]), int(record["pgid"]), int(record["start"])
    except (OSError, ValueError, TypeError, KeyError):
        return None
    fields = _stat_fields(pid)
    if fields is None or len(fields) < 20 or int(fields[19]) != start:
        return None
    group = []
    for other in _pids():
        other_fields = _stat_fields(other)
        if other_fields and len(other_fields) > 2 and int(other_fields[2]) == pgid:
            group.append(other)
    return {"pid": pid, "pgid": pgid, "group": group}


def _servers() -> list[dict[str, Any]]:
    boot = _boot_time()
    ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    skip = {os.getpid(), os.getppid()}
    found: list[dict[str, Any]] = []
    for pid in _pids():
        if pid in skip:
            continue
        cmdline = _cmdline(pid)
        comm = _comm(pid) or ""
        if not cmdline and not comm:
            continue
        if not (SERVER_PATTERN.search(cmdline or "") or comm.startswith("VLLM::")):
            continue
        info = _process(pid, boot, ticks)
        if info is not None:
            found.append(info)
    return found
