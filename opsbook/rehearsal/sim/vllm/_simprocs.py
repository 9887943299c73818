"""Process plumbing of the simulated vLLM: renamed children, /dev/shm files, GPU memory records.

Children are started with ``argv[0]`` set to their title (``VLLM::EngineCore``,
``VLLM::Worker_TP0``) and no other argument: the Python program arrives on stdin. So
``/proc/PID/cmdline`` reads exactly the title, as after vLLM's ``setproctitle``, and
``pkill -f api_server`` misses them as it misses real orphans.
"""

from __future__ import annotations

import json
import mmap
import os
import random
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

SHM_DIR = Path("/dev/shm")
# CPython multiprocessing's names: '/psm_' + token_hex(4), '/mp-' + 8 of these characters.
SEM_CHARS = "abcdefghijklmnopqrstuvwxyz0123456789_"
SEM_BYTES = 32
# ShmRingBuffer size: (max_chunk_bytes + 1 + n_reader) * max_chunks.
MAX_CHUNK_BYTES = 10 * 1024 * 1024
MAX_CHUNKS = 10


def set_title(title: str) -> None:
    """Set the 15-character ``comm`` name, as setproctitle does besides the cmdline."""
    try:
        Path("/proc/self/comm").write_text(title[:15])
    except OSError:
        pass


def spawn(
    title: str,
    python: str,
    pythonpath: str,
    call: str,
    spec: dict[str, Any],
    pass_fds: tuple[int, ...] = (),
) -> subprocess.Popen[bytes]:
    """Start ``python`` with argv ``[title]`` running ``vllm.<call>(spec)``.

    Args:
        title: the process title (its whole command line).
        python: the interpreter of the venv.
        pythonpath: the site-packages folder holding this package; the child cannot find its
            venv from a made-up argv[0].
        call: ``module.function`` inside the package.
        spec: JSON-able arguments of the function.
        pass_fds: descriptors the child inherits.

    Returns:
        The started process (same process group and session as the caller).
    """
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (pythonpath, env.get("PYTHONPATH")) if p)
    module, function = call.rsplit(".", 1)
    program = (
        f"import json, vllm.{module} as m\n"
        f"m.{function}(json.loads({json.dumps(json.dumps(spec))}))\n"
    )
    child = subprocess.Popen(
        [title],
        executable=python,
        stdin=subprocess.PIPE,
        env=env,
        pass_fds=pass_fds,
        close_fds=True,
    )
    assert child.stdin is not None
    child.stdin.write(program.encode())
    child.stdin.close()
    return child


def is_alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    fields = state[state.rfind(")") + 2 :].split()
    return bool(fields) and fields[0] not in ("Z", "X")


def stop_children(children: list[subprocess.Popen[bytes]], timeout: float = 5.0) -> None:
    """SIGTERM the children, wait, then SIGKILL those still running."""
    for child in children:
        if child.poll() is None:
            _signal(child.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for child in children:
        try:
            child.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal(child.pid, signal.SIGKILL)
            child.wait()


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


class ShmFile:
    """A /dev/shm file mapped by this process, as multiprocessing's SharedMemory/SemLock.

    Mapped and kept open so that ``fuser`` and ``/proc/PID/maps`` show who holds it; removed
    by :meth:`unlink` on a clean exit only, so SIGKILL leaves it behind as in real life.
    """

    def __init__(self, name: str, size: int):
        self.path = SHM_DIR / name
        self.fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        os.ftruncate(self.fd, size)
        self.map = mmap.mmap(self.fd, size)

    @classmethod
    def ring_buffer(cls, readers: int) -> ShmFile:
        size = (MAX_CHUNK_BYTES + 1 + readers) * MAX_CHUNKS
        return cls._create(lambda: "psm_" + secrets.token_hex(4), size)

    @classmethod
    def semaphore(cls) -> ShmFile:
        pick = random.SystemRandom()
        return cls._create(
            lambda: "sem.mp-" + "".join(pick.choice(SEM_CHARS) for _ in range(8)), SEM_BYTES
        )

    @classmethod
    def _create(cls, make_name: Any, size: int) -> ShmFile:
        while True:
            try:
                return cls(make_name(), size)
            except FileExistsError:
                continue

    def unlink(self) -> None:
        try:
            self.map.close()
            os.close(self.fd)
        except (OSError, ValueError):
            pass
        try:
            self.path.unlink()
        except OSError:
            pass


def load_simgpu() -> Any:
    """The simulated GPU module installed next to this package (``vllm/_simgpu.py``)."""
    from . import _simgpu

    return _simgpu


def gpu_records(sim_dir: str) -> list[dict[str, Any]]:
    """The simulated GPUs visible to this process, honouring CUDA_VISIBLE_DEVICES."""
    gpus = load_simgpu().load_gpus(Path(sim_dir))
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return gpus
    chosen = []
    for item in visible.split(","):
        item = item.strip()
        if item.isdigit() and int(item) < len(gpus):
            chosen.append(gpus[int(item)])
        elif item:
            chosen.extend(g for g in gpus if g.get("uuid") == item)
    return chosen


def free_mib(sim_dir: str, gpu: dict[str, Any]) -> int:
    used = load_simgpu().used_mib(Path(sim_dir), int(gpu["index"]))
    return max(0, int(gpu["memory_total_mib"]) - int(gpu["memory_reserved_mib"]) - used)


def register(sim_dir: str, pid: int, name: str, gpu: int, mib: int) -> None:
    load_simgpu().register_process(Path(sim_dir), pid, name, gpu, mib)


def release(sim_dir: str, pid: int) -> None:
    load_simgpu().release_process(Path(sim_dir), pid)


def python_executable() -> str:
    return sys.executable or os.environ.get("OPSBOOK_SIM_PYTHON", "python3")
