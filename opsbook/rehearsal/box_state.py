"""What a rehearsal host's folder holds and what its ``state.json`` records, and how both are
read and written (whole files through a rename; ``up`` and ``down`` under one lock)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from opsbook.core.exceptions import SandboxError

MODEL_NAME = "Kimi-K2.5-NVFP4"
STATE_FILE = "state.json"


class BoxPaths:
    """The files of one sandbox folder."""

    def __init__(self, folder: Path):
        self.dir = folder
        self.config = folder / "sshd_config"
        self.host_key = folder / "ssh_host_ed25519_key"
        self.client_key = folder / "id_ed25519"
        self.authorized_keys = folder / "authorized_keys"
        self.known_hosts = folder / "known_hosts"
        self.pid_file = folder / "sshd.pid"
        self.log = folder / "sshd.log"
        self.state = folder / STATE_FILE
        self.lock = folder / ".lock"
        self.deployment = folder / "deployment.yml"
        self.bin = folder / "bin"
        self.sim = folder / "sim"
        self.home = folder / "home"
        self.venv = folder / "venv"
        self.models = folder / "models"
        self.model = self.models / MODEL_NAME
        # Where the deployment keeps its launch script, log and state on the host.
        self.workdir = self.home / "opsbook"


@dataclass
class BoxState:
    """What ``state.json`` records of a rehearsal host: what was started and created, the only
    thing ``down`` acts on. A field keeps its default until a start writes it."""

    status: str = ""  # "starting", "up" or "down"; "" before the first start
    dir: str = ""
    address: str = ""
    port: int = 0
    shell: str = ""
    user: str = ""
    created_user: bool = False
    sshd_pid: int | None = None
    server_port: int = 0
    gpus: int = 0
    gpu_profile: str = ""
    vllm_version: str = ""
    vllm: str = "sim"  # a state written before the real-vLLM tier names none: the simulator

    @property
    def running(self) -> bool:
        """Whether a start began or ended and no stop followed."""
        return self.status in ("up", "starting")

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> BoxState:
        """The state a ``state.json`` document records (names it does not know are ignored)."""
        known = {f.name for f in fields(cls)}
        state = cls(**{name: value for name, value in record.items() if name in known})
        state.port, state.server_port, state.gpus = (
            int(state.port or 0), int(state.server_port or 0), int(state.gpus or 0)
        )  # fmt: skip
        state.sshd_pid = int(state.sshd_pid) if state.sshd_pid else None
        return state

    def record(self) -> dict[str, Any]:
        """The state as ``state.json`` holds it."""
        return asdict(self)


def read_state(paths: BoxPaths) -> BoxState | None:
    """The folder's recorded state; None when no start was ever recorded there."""
    try:
        record = json.loads(paths.state.read_text())
        if not isinstance(record, dict):
            raise ValueError("not a JSON object")
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise SandboxError(
            f"cannot read {paths.state}: {e}",
            remedy="stop a leftover sshd by its PID (see sshd.pid), then delete state.json",
        ) from None
    return BoxState.from_record(record)


def write_state(paths: BoxPaths, state: BoxState) -> None:
    write_text(paths.state, json.dumps(state.record(), indent=2) + "\n", 0o644)


def write_text(path: Path, text: str, mode: int) -> None:
    """Write through a temp file and a rename, so no reader sees half a file."""
    temp = path.with_name(f".{path.name}.tmp")
    try:
        temp.write_text(text)
        temp.chmod(mode)
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def locked(paths: BoxPaths) -> Iterator[None]:
    """Serialize up and down on one folder across processes."""
    with open(paths.lock, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
