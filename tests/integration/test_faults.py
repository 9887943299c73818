"""Faults, tried on real rehearsal hosts (a real sshd on 127.0.3.x, real Fabric, papermill and
the simulated vLLM): each test makes one fault happen and checks what is left on the host and
in the run record, and what the operator is told.

Root is needed for the parts that create users and mount a small tmpfs (a full disk).
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from opsbook.core.deployment import load_deployment
from opsbook.core.exceptions import ConnectTimeout, HostUnreachable, ProbeError, TransferError
from opsbook.rehearsal import sandbox as sandboxes
from opsbook.rehearsal.sandbox import Sandbox
from opsbook.remote.hosts import Host
from opsbook.steps import restart_rule, server, triage
from opsbook.steps.config_answers import ConfigState
from opsbook.steps.patch import apply_patch, fp8_kv_cache_edits, plan_patch, read_configs
from tests.integration.conftest import OPSBOOK, opsbook

pytestmark = pytest.mark.integration

ADDRESS = "127.0.3.1"
SHM_ADDRESS = "127.0.3.2"
CHECKPOINT_FILES = ("config.json", "hf_quant_config.json", "tokenizer_config.json")


def needs_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("creates users and mounts a tmpfs: run as root")


def new_folder(label: str) -> Path:
    """A path that does not exist yet, in an enterable folder: `sandbox up` creates it."""
    parent = Path(tempfile.mkdtemp(prefix=f"opsbook-faults-{label}-", dir="/tmp"))
    parent.chmod(0o755)  # the test's own folder
    return parent / "box"


def start_cli(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*OPSBOOK, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for(predicate: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def opsbook_stderr(err: str) -> str:
    """The runner's own stderr: without the log records of the notebook's kernel (a separate
    process whose "[IPKernelApp] ..." lines share the terminal; when a run is interrupted it
    may log the reply it could not send while being shut down)."""
    kept, in_kernel_record = [], False
    for line in err.splitlines():
        if line.startswith("[IPKernelApp]"):
            in_kernel_record = True
        elif not line.startswith((" ", "Traceback", "zmq.")):
            in_kernel_record = False
        if not in_kernel_record:
            kept.append(line)
    return "\n".join(kept)


def deploy_args(box: Sandbox, runs: Path) -> list[str]:
    # Every stage, even when an earlier test left the host settled: these faults strike
    # during the stages.
    return [
        "run", "deploy", "-f", str(box.deployment_path), "--runs-dir", str(runs),
        "-p", "recheck", "true",
    ]  # fmt: skip


def lock_file(box: Sandbox) -> Path:
    return box.home / "opsbook" / "state" / "deploy.lock"


def runs_of(runs: Path) -> list[Path]:
    return sorted(p for p in runs.iterdir() if p.is_dir()) if runs.exists() else []


def summary(folder: Path) -> dict[str, object]:
    doc: dict[str, object] = json.loads((folder / "summary.json").read_text())
    return doc


@pytest.fixture(scope="module")
def box() -> Iterator[Sandbox]:
    folder = new_folder("box")
    rehearsal = sandboxes.up(folder, address=ADDRESS)
    try:
        yield rehearsal
    finally:
        sandboxes.down(folder)
        shutil.rmtree(folder.parent, ignore_errors=True)


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    return tmp_path / "runs"


@contextlib.contextmanager
def zshenv_line(box: Sandbox, line: str) -> Iterator[None]:
    """The login user's ~/.zshenv with ``line`` appended, restored afterwards."""
    path = box.home / ".zshenv"
    before = path.read_text()
    path.write_text(before + line + "\n")
    try:
        yield
    finally:
        path.write_text(before)


@contextlib.contextmanager
def tmpfs(where: Path, size: str, owner: str) -> Iterator[Path]:
    """A small tmpfs at ``where`` owned by ``owner``: a disk that fills up for real."""
    needs_root()
    account = pwd.getpwnam(owner)
    where.mkdir(exist_ok=True)
    options = f"size={size},uid={account.pw_uid},gid={account.pw_gid},mode=0755"
    subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)], check=True)
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=True)
        where.rmdir()


def fill(folder: Path) -> None:
    """Write into ``folder`` until its filesystem is full."""
    fd = os.open(folder / "filler", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError:
        pass  # ENOSPC: full
    finally:
        os.close(fd)


def sshd_tree(box: Sandbox) -> list[int]:
    """The sandbox's listening sshd and every process under it."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                text = (entry / "stat").read_text()
                parents[int(entry.name)] = int(text[text.rfind(")") + 2 :].split()[1])
    tree, frontier = [box.sshd_pid], {box.sshd_pid}
    while frontier:
        children = [pid for pid, ppid in parents.items() if ppid in frontier]
        tree += children
        frontier = set(children)
    return tree


# -- nothing damaged that opsbook did not create ----------------------------------------------


def test_sandbox_up_refuses_a_folder_holding_the_operators_files(tmp_path: Path) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    mine.chmod(0o700)
    (mine / "notes.txt").write_text("keep me")
    before = mine.stat()
    done = opsbook("sandbox", "up", "--dir", str(mine), "--address", "127.0.3.3", timeout=300)
    assert done.returncode == 2, done.stderr
    assert "already holds files that opsbook did not make" in done.stderr
    assert "remedy:" in done.stderr
    after = mine.stat()
    assert (after.st_mode, after.st_uid, after.st_gid) == (
        before.st_mode,
        before.st_uid,
        before.st_gid,
    )
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]
    assert (mine / "notes.txt").read_text() == "keep me"


def test_sandbox_up_on_a_shared_sticky_folder_keeps_it_1777(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    (shared / "someone-elses.sock").write_text("")
    done = opsbook("sandbox", "up", "--dir", str(shared), "--address", "127.0.3.3", timeout=300)
    assert done.returncode == 2, done.stderr
    assert stat.S_IMODE(shared.stat().st_mode) == 0o1777
    assert [p.name for p in shared.iterdir()] == ["someone-elses.sock"]


def test_down_removes_the_users_shm_files_and_leaves_nothing_to_its_uid() -> None:
    needs_root()
    folder = new_folder("shm")
    others = Path("/dev/shm") / f"opsbook-faults-not-ours-{os.getpid()}"
    others.write_bytes(b"x" * 4096)
    try:
        rehearsal = sandboxes.up(folder, address=SHM_ADDRESS, checkpoint=False)
        uid = pwd.getpwnam(rehearsal.user).pw_uid
        # As a SIGKILLed server would: shared memory left behind by the login user.
        make = "head -c 1048576 /dev/zero > /dev/shm/psm_opsbook_faults; : > /dev/shm/sem.mp-x"
        subprocess.run(rehearsal.ssh_command(make), check=True, timeout=60)
        left = [p for p in Path("/dev/shm").iterdir() if p.lstat().st_uid == uid]
        assert len(left) == 2
        result = sandboxes.down(folder)
        assert result.ok, str(result)
        assert sorted(result.shm_removed) == sorted(str(p) for p in left)
        assert not any(p.exists() for p in left)
        assert others.read_bytes() == b"x" * 4096
        owned = [p for p in folder.rglob("*") if p.lstat().st_uid == uid and not p.is_symlink()]
        assert owned == [], f"files left to the removed uid {uid}: {owned[:5]}"
    finally:
        others.unlink(missing_ok=True)
        sandboxes.down(folder)
        shutil.rmtree(folder.parent, ignore_errors=True)


def test_config_patch_on_a_full_disk_changes_nothing_and_leaves_no_temp_file(
    box: Sandbox,
) -> None:
    with tmpfs(box.model_path.parent / "Full-Disk-Model", "256k", box.user) as model:
        for name in CHECKPOINT_FILES:
            shutil.copy(box.model_path / name, model / name)
            os.chown(model / name, pwd.getpwnam(box.user).pw_uid, -1)
        fill(model)
        before = {p.name: p.read_bytes() for p in model.iterdir() if p.name != "filler"}
        with Host(box.host_spec()) as host:
            files = read_configs(host, str(model))
            plan = plan_patch(files, fp8_kv_cache_edits(files))
            assert plan.changed_files
            result = apply_patch(host, str(model), plan, apply=True)
        assert not result.ok
        assert "No space left on device" in str(result), str(result)
        after = {p.name: p.read_bytes() for p in model.iterdir() if p.name != "filler"}
        assert after == before  # no temp file, no half backup, the configs untouched


# -- faults during a deploy -------------------------------------------------------------------


def test_a_second_deploy_on_a_held_host_says_who_holds_it(box: Sandbox, runs: Path) -> None:
    first = start_cli(*deploy_args(box, runs))
    try:
        wait_for(lambda: lock_file(box).exists(), 60, "the first deploy to take the lock")
        holder = json.loads(lock_file(box).read_text())
        second = opsbook(*deploy_args(box, runs / "second"), timeout=300)
        assert second.returncode == 5, second.stderr
        for part in (
            "another deploy holds the host",
            box.host_spec().name,
            f"PID {first.pid}",
            holder["run"],
            f"since {holder['since']}",
            str(lock_file(box)),
        ):
            assert part in second.stderr, (part, second.stderr)
        assert "Traceback" not in second.stderr
        assert not (runs / "second").exists() or runs_of(runs / "second") == []
        # A single stage that changes the host waits its turn too.
        relaunch = opsbook(
            "run", "04_launch", "-f", str(box.deployment_path), "--runs-dir", str(runs), timeout=300
        )
        assert relaunch.returncode == 5, relaunch.stdout + relaunch.stderr
        assert f"PID {first.pid}" in relaunch.stderr
        out, err = first.communicate(timeout=300)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 0, out + err
    assert not lock_file(box).exists()
    assert summary(runs_of(runs)[0])["status"] == "ok"


def test_a_stale_lock_of_a_gone_process_is_taken_over_with_a_note(box: Sandbox, runs: Path) -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()
    stale = {
        "user": "root",
        "machine": os.uname().nodename,
        "pid": gone.pid,
        "pid_start": "1",
        "run": "/tmp/a-run-that-was-killed",
        "since": "2026-12-03T00:00:00+00:00",
    }
    # Written as the login user, as a deploy killed by SIGKILL would have left it.
    line = shlex.quote(json.dumps(stale, sort_keys=True))
    path = shlex.quote(str(lock_file(box)))
    make = f"mkdir -p $(dirname {path}) && printf '%s\\n' {line} > {path}"
    subprocess.run(box.ssh_command(make), check=True, timeout=60)
    done = opsbook(*deploy_args(box, runs), timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "took over a stale deploy lock" in done.stdout
    assert f"PID {gone.pid}" in done.stdout
    record = summary(runs_of(runs)[0])
    assert "took over a stale deploy lock" in str(record["message"])
    assert not lock_file(box).exists()


def test_sigterm_seals_the_record_as_interrupted_and_frees_the_host(
    box: Sandbox, runs: Path
) -> None:
    run = start_cli(*deploy_args(box, runs))
    try:
        wait_for(
            lambda: any((f / "01_download_check.results.jsonl").exists() for f in runs_of(runs)),
            120,
            "the deploy to reach its second stage",
        )
        run.send_signal(signal.SIGTERM)
        out, err = run.communicate(timeout=120)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 143, out + err
    assert "Traceback" not in opsbook_stderr(err)
    folder = runs_of(runs)[0]
    record = summary(folder)
    assert record["status"] == "interrupted"
    assert record["exit_code"] == 143
    assert "interrupted by SIGTERM" in str(record["message"])
    assert json.loads((folder / "run.json").read_text())["status"] == "interrupted"
    assert not stat.S_IMODE(folder.stat().st_mode) & stat.S_IWUSR  # sealed read-only
    assert "interrupted" in opsbook("records", "list", "--runs-dir", str(runs), timeout=300).stdout
    assert not lock_file(box).exists()


def test_ctrl_c_on_a_single_notebook_run_files_run_json(box: Sandbox, runs: Path) -> None:
    # Every remote command is made slow, and says so, so that Ctrl-C lands inside the stage
    # (a preflight takes half a second on a fast machine).
    marker = box.home / ".opsbook-test-in-a-command"
    marker.unlink(missing_ok=True)
    with zshenv_line(box, f": > {shlex.quote(str(marker))}; sleep 5"):
        run = start_cli(
            "run", "00_preflight", "-f", str(box.deployment_path), "--runs-dir", str(runs)
        )
        try:
            wait_for(lambda: bool(runs_of(runs)) and marker.exists(), 60, "a remote command")
            run.send_signal(signal.SIGINT)
            out, err = run.communicate(timeout=120)
        finally:
            if run.poll() is None:
                run.kill()
            marker.unlink(missing_ok=True)
    assert run.returncode == 130, out + err
    assert "Traceback" not in opsbook_stderr(err)
    doc = json.loads((runs_of(runs)[0] / "run.json").read_text())
    assert doc["status"] == "interrupted"
    assert doc["exit_code"] == 130


def test_a_runs_folder_deleted_mid_run_is_reported_not_a_traceback(
    box: Sandbox, runs: Path
) -> None:
    run = start_cli(*deploy_args(box, runs))
    try:
        wait_for(
            lambda: any((f / "00_preflight.results.jsonl").exists() for f in runs_of(runs)),
            120,
            "the first stage",
        )
        wait_for(lambda: not _remove(runs), 60, "the runs folder to be deleted")
        out, err = run.communicate(timeout=300)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 3, out + err
    assert "Traceback" not in opsbook_stderr(err)
    assert "was deleted during the run" in out
    record = summary(runs_of(runs)[0])
    assert "was deleted during the run" in str(record["message"])
    assert not lock_file(box).exists()


def _remove(folder: Path) -> bool:
    """rm -rf that may race with the run writing into it; True while it still exists."""
    shutil.rmtree(folder, ignore_errors=True)
    return folder.exists()


# -- login shells -----------------------------------------------------------------------------


def test_a_banner_printed_by_the_login_shell_breaks_no_probe(box: Sandbox, runs: Path) -> None:
    with zshenv_line(box, "echo 'Welcome to gpu-01: authorised use only'"):
        banner = subprocess.run(box.ssh_command("true"), capture_output=True, text=True)
        assert "Welcome to gpu-01" in banner.stdout
        with Host(box.host_spec()) as host:
            answer = ConfigState.parse(host.probe("configs", {"dir": str(box.model_path)}))
        assert answer.exists is True
        done = opsbook(
            "run",
            "00_preflight",
            "-f",
            str(box.deployment_path),
            "--runs-dir",
            str(runs),
            timeout=300,
        )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize(
    "broken",
    ["exit 1 in ~/.zshenv", "a nologin shell"],
)
def test_a_login_shell_that_exits_is_named_not_python3(box: Sandbox, broken: str) -> None:
    needs_root()
    with contextlib.ExitStack() as undo:
        if broken.startswith("exit"):
            undo.enter_context(zshenv_line(box, "exit 1"))
        else:
            subprocess.run(["usermod", "-s", "/usr/sbin/nologin", box.user], check=True)
            shell = str(sandboxes.SHELLS[box.shell])
            undo.callback(subprocess.run, ["usermod", "-s", shell, box.user], check=True)
        with Host(box.host_spec()) as host, pytest.raises(ProbeError) as failed:
            host.probe("configs", {"dir": str(box.model_path)})
    message = str(failed.value)
    assert f"the login shell of {box.user} exits with code 1" in message
    assert "python3" not in failed.value.message
    assert "chsh" in (failed.value.remedy or "")
    if not broken.startswith("exit"):
        assert "not available" in message


# -- a hung host ------------------------------------------------------------------------------


def test_a_stopped_sshd_is_a_timeout_naming_the_host_within_connect_timeout(
    box: Sandbox,
) -> None:
    spec = replace(box.host_spec(), connect_timeout=4.0, command_timeout=60.0)
    host = Host(spec)
    assert host.run("true").ok
    stopped = sshd_tree(box)
    try:
        for pid in stopped:
            os.kill(pid, signal.SIGSTOP)
        began = time.monotonic()
        with pytest.raises(HostUnreachable) as hung:
            host.run("true")
        first = time.monotonic() - began
        began = time.monotonic()
        with pytest.raises(ConnectTimeout) as again:
            host.run("true")
        second = time.monotonic() - began
    finally:
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)
        host.close()
    assert hung.value.host == spec.name and "did not answer within 4 s" in hung.value.message
    assert again.value.host == spec.name and "hung or stopped" in again.value.message
    # Within the connect timeout (plus scheduling), never the command's 60 s + backstop.
    assert first < 4.0 + 3 and second < 4.0 + 3, (first, second)
    assert Host(box.host_spec()).run("true").ok  # the host answers again once continued


def test_a_full_remote_disk_during_upload_says_no_space_left(box: Sandbox) -> None:
    with tmpfs(box.home / "full", "64k", box.user) as full:
        with Host(box.host_spec()) as host, pytest.raises(TransferError) as failed:
            host.upload(str(full / "launch.sh"), b"#" * 200_000, mode=0o755)
        assert f"could not write {full / 'launch.sh'}: no space left" in failed.value.message
        assert list(full.iterdir()) == []


# -- diagnose ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def served(box: Sandbox) -> Sandbox:
    """The box with its server launched and ready."""
    with tempfile.TemporaryDirectory() as runs:
        done = opsbook(*deploy_args(box, Path(runs)), timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return box


def state_of(box: Sandbox) -> tuple[triage.ServerState, float]:
    dep = load_deployment(box.deployment_path)
    with Host.from_deployment(dep) as host:
        began = time.monotonic()
        found = triage.server_state(host, server.resolve_paths(host, dep), dep.server_port)
    return found, time.monotonic() - began


def launch_record(box: Sandbox) -> Path:
    return box.home / "opsbook" / "state" / "launch.json"


def test_a_corrupt_launch_json_is_named_and_the_healthy_server_still_seen(
    served: Sandbox,
) -> None:
    record = launch_record(served)
    good = record.read_bytes()
    try:
        record.write_text('{"pid": 12')
        found, _ = state_of(served)
    finally:
        record.write_bytes(good)
    assert found.state == "ready", found.message
    assert "unreadable" in found.message and str(record) in found.message
    assert any(f.subject == "launch.json" for f in found.to_result().findings)


def test_a_ready_server_that_was_stopped_is_hung_within_the_bound(served: Sandbox) -> None:
    group = int(json.loads(launch_record(served).read_text())["pgid"])
    assert state_of(served)[0].state == "ready"
    os.killpg(group, signal.SIGSTOP)
    try:
        found, took = state_of(served)
    finally:
        os.killpg(group, signal.SIGCONT)
    assert found.state == "hung", found.message
    assert "has not answered" in found.message
    bound = triage.UNRESPONSIVE_SECONDS + server.HEALTH_TIMEOUT + 5
    assert took < bound, took
    wait_for(lambda: state_of(served)[0].state == "ready", 30, "the server to answer again")


def fill_listen_queue(port: int) -> list[socket.socket]:
    """Connections to a stopped server until its listen queue is full (a connect times out)."""
    held: list[socket.socket] = []
    for _ in range(4096):
        conn = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        conn.settimeout(0.5)
        try:
            conn.connect(("127.0.0.1", port))
        except OSError:
            conn.close()
            return held
        held.append(conn)
    raise AssertionError(f"port {port} kept accepting {len(held)} connections")


def test_a_ready_server_whose_listen_queue_is_full_is_hung_not_loading(served: Sandbox) -> None:
    """The survey's third `opsbook check` of a SIGSTOPped server: the port refuses (its queue
    is full), and the log says ready; that is never "loading"."""
    group = int(json.loads(launch_record(served).read_text())["pgid"])
    port = load_deployment(served.deployment_path).server_port
    os.killpg(group, signal.SIGSTOP)
    held: list[socket.socket] = []
    try:
        held = fill_listen_queue(port)
        found, _ = state_of(served)
    finally:
        os.killpg(group, signal.SIGCONT)
        for conn in held:
            conn.close()
    assert found.state == "hung", found.message
    assert "no longer accepts connections" in found.message
    assert not found.ok
    wait_for(lambda: state_of(served)[0].state == "ready", 30, "the server to answer again")


def test_a_server_is_judged_on_the_port_it_was_launched_on(served: Sandbox) -> None:
    """`server.port` changed to a port something else holds: the running server is still
    judged where it listens, and the message says so."""
    dep = load_deployment(served.deployment_path)
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        elsewhere = other.getsockname()[1]
        with Host.from_deployment(dep) as host:
            found = triage.server_state(host, server.resolve_paths(host, dep), elsewhere)
    assert found.state == "ready", found.message
    assert f"judged on port {dep.server_port}" in found.message


def test_a_deploy_that_did_not_launch_is_not_ok_about_the_previous_server(served: Sandbox) -> None:
    """Issue 31, item 5: a deploy rewrote the launch script and stopped before 04: the server
    still running is the earlier launch, and 05 names it, not "ok ready"."""
    dep = load_deployment(served.deployment_path)
    with Host.from_deployment(dep) as host:
        paths = server.resolve_paths(host, dep)
        inputs = triage.deploy_inputs(restart_rule.run_inputs(dep, paths))
        before = triage.server_state(host, paths, dep.server_port, inputs=inputs, last_deploy=True)
        script = Path(paths.script)
        kept = script.read_bytes()
        try:
            script.write_bytes(kept + b"# rewritten by a deploy that failed at 03\n")
            found = triage.server_state(
                host, paths, dep.server_port, inputs=inputs, last_deploy=True
            )
        finally:
            script.write_bytes(kept)
    assert before.state == "ready" and before.ok, before.message
    assert found.state == "ready" and not found.ok
    assert found.superseded == ["script"]
    assert "the running server is from" in found.message
    assert "the last deploy did not launch" in found.message
