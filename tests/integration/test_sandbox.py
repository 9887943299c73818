"""The rehearsal host over real SSH: login shell, simulated GPUs, restarts and a clean down."""

import os
import pwd
import shlex
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import paramiko
import pytest

from opsbook.core.deployment import load_deployment
from opsbook.rehearsal import sandbox as sandboxes
from opsbook.rehearsal.sandbox import Sandbox

pytestmark = pytest.mark.integration


def ssh(box: Sandbox, command: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """Run a command with the ssh client as a user would: through the login shell."""
    return subprocess.run(
        box.ssh_command(command), capture_output=True, text=True, timeout=timeout, check=False
    )


def running(pid: int) -> bool:
    """True unless the process is gone or a zombie (PID 1 here may not reap orphans)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] != "Z"


def processes_of(uid: int) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                status = (entry / "status").read_text()
            except OSError:
                continue
            if f"\nUid:\t{uid}\t" in status and running(int(entry.name)):
                pids.append(int(entry.name))
    return pids


def test_login_shell_is_zsh_and_plain_bash_finds_the_simulated_gpus(sandbox) -> None:
    done = ssh(sandbox, 'echo "$0"; bash -c "nvidia-smi -L"')
    assert done.returncode == 0, done.stderr
    shell, *gpus = done.stdout.splitlines()
    assert shell == "zsh"
    assert len(gpus) == 8
    assert all(g.startswith(f"GPU {i}: NVIDIA RTX PRO 6000 Blackwell") for i, g in enumerate(gpus))
    assert pwd.getpwnam(sandbox.user).pw_shell == "/usr/bin/zsh"


@pytest.mark.parametrize("shell", ["bash -l", "zsh -l", "bash", "sh"])
def test_every_kind_of_shell_start_finds_nvidia_smi(sandbox, bash_sandbox, shell) -> None:
    for box in (sandbox, bash_sandbox):
        done = ssh(box, f"{shell} -c 'command -v nvidia-smi; echo $OPSBOOK_SIM_DIR'")
        assert done.stdout.splitlines() == [f"{box.dir}/bin/nvidia-smi", f"{box.dir}/sim"]


def test_deployment_file_reaches_the_host_with_strict_host_key_checking(sandbox) -> None:
    dep = load_deployment(sandbox.deployment_path)
    assert dep.host == sandbox.host_spec()
    client = paramiko.SSHClient()
    client.load_host_keys(str(sandbox.known_hosts))
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    client.connect(
        dep.host.address,
        port=dep.host.port,
        username=dep.host.user,
        key_filename=dep.host.key,
        look_for_keys=False,
        allow_agent=False,
        timeout=10,
    )
    try:
        _, stdout, _ = client.exec_command(
            f"{shlex.quote(dep.python)} -c 'import sys; print(sys.prefix)'"
        )
        assert stdout.read().decode().strip() == str(sandbox.venv)
        sftp = client.open_sftp()
        assert "opsbook" in sftp.listdir(str(sandbox.home))
        sftp.close()
    finally:
        client.close()
    assert sandbox.known_hosts.read_text().startswith(
        f"[127.0.0.1]:{sandbox.port} ssh-ed25519 AAAA"
    )


def test_the_login_user_can_edit_the_checkpoint(sandbox) -> None:
    if not (sandbox.model_path / "config.json").exists():
        pytest.skip("no checkpoint module in this tree")
    probe = sandbox.model_path / ".opsbook-write-test"
    done = ssh(sandbox, f"touch {probe} && rm {probe} && echo ok")
    assert done.stdout.strip() == "ok", done.stderr


def test_gpu_memory_of_a_host_process_shows_in_nvidia_smi(sandbox) -> None:
    holder = (
        "import os, sys, time; sys.path.insert(0, sys.argv[1]); import simgpu; "
        "simgpu.register_process(simgpu.sim_dir(), os.getpid(), 'VLLM::Worker_TP0', 5, 81234); "
        "time.sleep(120)"
    )
    start = f"/usr/bin/python3 -c {shlex.quote(holder)} {sandbox.sim_dir} >/dev/null 2>&1 & echo $!"
    pid = int(ssh(sandbox, f"bash -c {shlex.quote(start)}").stdout)
    try:
        apps, used = "", ""
        for _ in range(50):
            query = "nvidia-smi --query-compute-apps=pid,process_name,used_memory,gpu_bus_id"
            apps = ssh(sandbox, f"bash -c '{query} --format=csv,noheader'").stdout
            if apps:
                break
            time.sleep(0.1)
        used = ssh(sandbox, "nvidia-smi --query-gpu=memory.used --format=csv,noheader -i 5").stdout
        assert apps == f"{pid}, VLLM::Worker_TP0, 81234 MiB, 00000000:85:00.0\n"
        assert used == "81234 MiB\n"
    finally:
        ssh(sandbox, f"kill {pid}")
    time.sleep(0.3)
    after = ssh(sandbox, "nvidia-smi --query-gpu=memory.used --format=csv,noheader -i 5")
    assert after.stdout == "0 MiB\n"


def test_two_sandboxes_run_at_once_and_a_second_up_returns_the_running_one(
    sandbox, bash_sandbox
) -> None:
    assert (sandbox.address, sandbox.port) != (bash_sandbox.address, bash_sandbox.port)
    assert ssh(bash_sandbox, 'echo "$0"').stdout.strip() == "bash"
    again = sandboxes.up(sandbox.dir)
    assert (again.sshd_pid, again.port, again.user) == (
        sandbox.sshd_pid,
        sandbox.port,
        sandbox.user,
    )
    assert sandboxes.status(sandbox.dir).ok and sandboxes.status(bash_sandbox.dir).ok


def test_stale_state_is_restarted_and_down_leaves_nothing_of_ours() -> None:
    folder = Path(tempfile.mkdtemp(prefix="opsbook-lifecycle-", dir="/tmp"))
    # The test's own folder: the sandbox keeps an existing folder's mode.
    folder.chmod(0o755)
    try:
        box = sandboxes.up(folder, address="127.0.0.4", checkpoint=False)
        os.kill(box.sshd_pid, signal.SIGKILL)
        time.sleep(0.2)
        assert not sandboxes.status(folder).ok
        box = sandboxes.up(folder, address="127.0.0.4", checkpoint=False)
        assert sandboxes.status(folder).ok
        # Read after the restart: it removed the user and made it again, and the uid freed
        # between may meanwhile have gone to another sandbox's new user (the parallel run).
        uid = pwd.getpwnam(box.user).pw_uid
        # The login shell exits only once nohup has become sleep: nohup ignores SIGHUP before
        # it execs, so the hang-up of the shell's jobs then passes it by (a fixed pause lost
        # that race once, on a loaded machine).
        started = ssh(
            box,
            "nohup sleep 300 >/dev/null 2>&1 & pid=$!; for i in $(seq 200); do "
            '[ "$(cat /proc/$pid/comm 2>/dev/null)" = sleep ] && break; sleep 0.05; done; '
            "echo $pid",
        )
        sleeper = int(started.stdout.strip())
        assert sleeper in processes_of(uid)
        result = sandboxes.down(folder)
        assert result.ok, result
        assert not running(box.sshd_pid)
        assert not running(sleeper)
        assert processes_of(uid) == []
        with pytest.raises(KeyError):
            pwd.getpwnam(box.user)
        assert not sandboxes.status(folder).ok
    finally:
        sandboxes.down(folder)
        subprocess.run(["rm", "-rf", str(folder)], check=False)
