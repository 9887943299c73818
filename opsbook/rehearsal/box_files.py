"""What a rehearsal host's folder is filled with: keys, the simulated GPU tools, the user's
home, the python env, the checkpoint, sshd's configuration and the deployment file; and
starting its sshd."""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import time
from pathlib import Path
from typing import Any

import yaml

from opsbook.core.exceptions import SandboxError
from opsbook.rehearsal.box_state import BoxPaths, BoxState, write_text
from opsbook.rehearsal.box_user import SHELL_PACKAGES, SHELLS, chown_tree
from opsbook.rehearsal.checkpoint import make_checkpoint
from opsbook.rehearsal.host_procs import is_alive, is_our_sshd, read_pid, terminate
from opsbook.rehearsal.ports import answers_ssh
from opsbook.rehearsal.sim import simgpu
from opsbook.rehearsal.sim.vllm_install import install_vllm

SSHD = Path("/usr/sbin/sshd")
SSH_KEYGEN = Path("/usr/bin/ssh-keygen")
SYSTEM_PYTHON = Path("/usr/bin/python3")
READY_TIMEOUT = 10.0
SIM_SOURCES = Path(__file__).resolve().parent / "sim"


def require_tools(shell: str) -> None:
    needs = [(SSHD, "openssh-server"), (SSH_KEYGEN, "openssh-client"), (SYSTEM_PYTHON, "python3")]
    needs.append((SHELLS[shell], SHELL_PACKAGES[shell]))
    for tool, package in needs:
        if not os.access(tool, os.X_OK):
            raise SandboxError(
                f"{tool} is missing: the rehearsal host needs it",
                remedy=f"apt-get install {package}",
            )


def write_keys(paths: BoxPaths) -> None:
    for key in (paths.host_key, paths.client_key):
        if not key.exists():
            run(
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
    public = public_key(paths.client_key)
    write_text(paths.authorized_keys, public + "\n", 0o644)


def public_key(private: Path) -> str:
    kind, blob = Path(f"{private}.pub").read_text().split()[:2]
    return f"{kind} {blob}"


def write_known_hosts(paths: BoxPaths, address: str, port: int) -> None:
    entry = f"[{address}]:{port} {public_key(paths.host_key)}\n"
    write_text(paths.known_hosts, entry, 0o644)


def write_simulator(paths: BoxPaths, owner: pwd.struct_passwd, gpus: int, gpu_profile: str) -> None:
    paths.bin.mkdir(mode=0o755, exist_ok=True)
    paths.sim.mkdir(mode=0o755, exist_ok=True)
    write_text(paths.bin / "nvidia-smi", (SIM_SOURCES / "nvidia_smi.py").read_text(), 0o755)
    write_text(paths.sim / "simgpu.py", (SIM_SOURCES / "simgpu.py").read_text(), 0o644)
    simgpu.write_config(paths.sim, gpu_profile, gpus)
    os.chmod(paths.sim / simgpu.CONFIG_FILE, 0o644)
    # The simulated server registers its GPU memory as the login user.
    chown_tree(paths.sim / simgpu.PROCS_DIR, owner)


def write_home(paths: BoxPaths, owner: pwd.struct_passwd) -> None:
    """The user's home (when it is the sandbox's) and the deployment's working folder."""
    paths.home.mkdir(mode=0o755, exist_ok=True)
    paths.workdir.mkdir(mode=0o755, exist_ok=True)
    if Path(owner.pw_dir) == paths.home:
        snippet = path_snippet(paths)
        for dotfile in (".zshenv", ".profile", ".bashrc"):
            write_text(paths.home / dotfile, snippet, 0o644)
        write_text(paths.home / ".hushlogin", "", 0o644)
    chown_tree(paths.home, owner)


def path_snippet(paths: BoxPaths) -> str:
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


def ensure_venv(paths: BoxPaths, owner: pwd.struct_passwd, vllm_version: str) -> None:
    created = not (paths.venv / "bin" / "python").exists()
    if created:
        run(
            [str(SYSTEM_PYTHON), "-m", "venv", str(paths.venv)],
            "create the python env",
            remedy="apt-get install python3-venv",
            timeout=300,
        )
    marker = paths.venv / simgpu.VENV_MARKER
    write_text(marker, json.dumps({"sim_dir": str(paths.sim)}) + "\n", 0o644)
    install_vllm(paths.venv, version=vllm_version)
    chown_tree(paths.venv, owner)


def ensure_checkpoint(paths: BoxPaths, owner: pwd.struct_passwd) -> None:
    if not (paths.model / "config.json").exists():
        make_checkpoint(paths.model)
    paths.models.chmod(0o755)
    # The config-patch stage edits the checkpoint as the login user.
    chown_tree(paths.models, owner)


def write_sshd_config(paths: BoxPaths, address: str, port: int, owner: pwd.struct_passwd) -> None:
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
    write_text(paths.config, "\n".join(lines) + "\n", 0o644)


def start_sshd(paths: BoxPaths, address: str, port: int) -> int:
    """Start sshd (it daemonizes) and wait until it answers with an SSH banner.

    Returns:
        The PID of the listening sshd.
    """
    if os.geteuid() == 0:
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
    paths.pid_file.unlink(missing_ok=True)
    test = [str(SSHD), "-t", "-f", str(paths.config)]
    run(test, "check the sshd configuration", remedy=f"see {paths.config}")
    run(
        [str(SSHD), "-f", str(paths.config), "-E", str(paths.log)],
        "start sshd",
        remedy=f"see {paths.log}",
    )
    deadline = time.monotonic() + READY_TIMEOUT
    while time.monotonic() < deadline:
        pid = read_pid(paths.pid_file)
        if pid and is_our_sshd(pid, paths) and answers_ssh(address, port, timeout=1.0):
            return pid
        if pid and not is_alive(pid):
            break
        time.sleep(0.05)
    pid = read_pid(paths.pid_file)
    if pid and is_our_sshd(pid, paths):
        terminate(pid)
    raise SandboxError(
        f"sshd did not answer on {address}:{port} within {READY_TIMEOUT:.0f}s; "
        f"its log ends with: {tail(paths.log)}",
        remedy="if the port is taken, pick another --port; otherwise read " + str(paths.log),
    )


def write_deployment(
    paths: BoxPaths, state: BoxState, real_vllm: dict[str, Any] | None = None
) -> None:
    doc = {
        "name": "rehearsal",
        "hosts": [
            {
                "address": state.address,
                "port": state.port,
                "user": state.user,
                "key": str(paths.client_key),
                "known_hosts": str(paths.known_hosts),
            }
        ],
        "model": {"path": str(paths.model)},
        "python": str(paths.venv / "bin" / "python"),
        "server": {
            "port": state.server_port,
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
    write_text(paths.deployment, header + yaml.safe_dump(doc, sort_keys=False), 0o644)


def run(argv: list[str], doing: str, *, remedy: str = "", timeout: float = 60) -> None:
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


def tail(log: Path, lines: int = 5) -> str:
    try:
        return " | ".join(log.read_text(errors="replace").splitlines()[-lines:]) or "(empty)"
    except OSError:
        return "(no log)"
