"""Limits, tried on a real rehearsal host (a real sshd on 127.0.11.1, real Fabric, papermill and
the simulated vLLM): a full or unwritable lock folder, a 100 kB environment value, SIGTERM
during a stage, a stage timeout, a checkpoint the login user cannot read, Ctrl-C during
`sandbox up` (issue 32, items 4, 5 and 7).

Root is needed for the tmpfs that fills up and for the sandbox's own user.
"""

from __future__ import annotations

import json
import shlex
import shutil
import signal
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from opsbook.core.deployment import load_deployment
from opsbook.core.exceptions import HostLocked
from opsbook.rehearsal import box_state
from opsbook.rehearsal import sandbox as sandboxes
from opsbook.rehearsal.sandbox import Sandbox
from opsbook.runner import lock
from tests.integration.conftest import OPSBOOK, opsbook, rehearsal_host, sandbox_folder
from tests.integration.test_faults import fill, needs_root, opsbook_stderr, runs_of, tmpfs, wait_for

pytestmark = pytest.mark.integration

ADDRESS = "127.0.11.1"
CTRL_C_ADDRESS = "127.0.11.2"


@pytest.fixture(scope="module")
def box() -> Iterator[Sandbox]:
    with rehearsal_host("limits", address=ADDRESS) as made:
        yield made


def variant(box: Sandbox, where: Path, change: dict[str, object]) -> Path:
    """The box's deployment file with top-level sections changed (merged one level deep)."""
    doc = yaml.safe_load(box.deployment_path.read_text())
    for key, value in change.items():
        doc[key] = {**doc.get(key, {}), **value} if isinstance(value, dict) else value
    path = where / "deployment.yml"
    path.write_text(yaml.safe_dump(doc))
    return path


def as_login_user(box: Sandbox, command: str) -> None:
    subprocess.run(box.ssh_command(command), check=True, timeout=60)


# -- item 4: the deploy lock ------------------------------------------------------------------


def test_a_full_state_folder_stops_the_deploy_saying_disk_full_and_leaves_no_lock(
    box: Sandbox, tmp_path: Path
) -> None:
    with tmpfs(box.home / "full-state", "64k", box.user) as state:
        fill(state)
        dep = variant(box, tmp_path, {"paths": {"state": str(state)}})
        runs = tmp_path / "runs"
        done = opsbook("run", "deploy", "-f", str(dep), "--runs-dir", str(runs), timeout=300)
        assert done.returncode == 5, done.stdout + done.stderr
        assert f"disk full on host {box.host_spec().name}: {state / 'deploy.lock'}" in done.stderr
        assert "No space left on device" in done.stderr and "paths.state" in done.stderr
        assert "unknown holder" not in done.stderr and "Traceback" not in done.stderr
        assert not (state / "deploy.lock").exists()
        assert [p.name for p in state.iterdir() if p.name.endswith(".new")] == []
        assert runs_of(runs) == []
        # Once there is room again, the next deploy takes the lock: nothing was left behind.
        (state / "filler").unlink()
        locks = lock.acquire(load_deployment(dep), tmp_path / "run")
        try:
            assert locks.notes == [] and len(locks.held) == 1
            assert lock.Holder.parse((state / "deploy.lock").read_text()) == locks.holder
        finally:
            locks.release()
        assert not (state / "deploy.lock").exists()


def test_a_read_only_state_folder_is_named_as_such(box: Sandbox, tmp_path: Path) -> None:
    with tmpfs(box.home / "ro-state", "64k", box.user) as state:
        subprocess.run(["mount", "-o", "remount,ro", str(state)], check=True)
        dep = load_deployment(variant(box, tmp_path, {"paths": {"state": str(state)}}))
        with pytest.raises(HostLocked) as refused:
            lock.acquire(dep, tmp_path / "run")
        subprocess.run(["mount", "-o", "remount,rw", str(state)], check=True)
    assert f"read-only file system on host {box.host_spec().name}: {state}" in str(refused.value)


# printf formats: an empty lock, four NUL bytes, a holder cut short.
@pytest.mark.parametrize("text", ["", "\\0\\0\\0\\0", '{"user": "ops", "pid": 4'])
def test_an_empty_or_garbled_lock_left_on_the_host_is_taken_over_with_a_note(
    box: Sandbox, tmp_path: Path, text: str
) -> None:
    dep = load_deployment(box.deployment_path)
    path = lock.lock_path(dep, box.host_spec().name)
    quoted = shlex.quote(path)
    as_login_user(box, f"mkdir -p $(dirname {quoted}) && printf {shlex.quote(text)} > {quoted}")
    locks = lock.acquire(dep, tmp_path / "run")
    try:
        assert len(locks.held) == 1 and len(locks.notes) == 1, locks.notes
        assert "took over" in locks.notes[0] and box.host_spec().name in locks.notes[0]
    finally:
        locks.release()
    assert not Path(path).exists()


# -- item 5: a long value, SIGTERM ------------------------------------------------------------


def long_value_deployment(box: Sandbox, where: Path, size: int) -> Path:
    return variant(box, where, {"server": {"env": {"OPSBOOK_LONG_VALUE": "x" * size}}})


def test_a_dry_run_of_03_with_a_100_kb_env_value_answers_promptly(
    box: Sandbox, tmp_path: Path
) -> None:
    # The script on the host first (an upload of the short one), then a dry run whose diff
    # holds the 100 kB line: it took minutes (10 kB: 16 s), all in redaction.
    runs = tmp_path / "runs"
    put = opsbook(
        "run", "03_launch_script", "-f", str(box.deployment_path), "--runs-dir", str(runs),
        "-p", "apply", "true", timeout=300,
    )  # fmt: skip
    assert put.returncode in (0, 1), put.stdout + put.stderr
    dep = long_value_deployment(box, tmp_path, 100_000)
    began = time.monotonic()
    dry = opsbook("run", "03_launch_script", "-f", str(dep), "--runs-dir", str(runs), timeout=600)
    took = time.monotonic() - began
    assert dry.returncode == 1, dry.stdout + dry.stderr  # would change
    assert "would change" in dry.stdout
    assert json.loads((runs_of(runs)[-1] / "run.json").read_text())["exit_code"] == 1
    # A kernel's start and the stage take seconds; the quadratic redaction took minutes.
    assert took < 120, took


def test_sigterm_during_a_stage_with_a_long_value_seals_the_folder_promptly(
    box: Sandbox, tmp_path: Path
) -> None:
    dep = long_value_deployment(box, tmp_path, 100_000)
    runs = tmp_path / "runs"
    marker = box.home / ".opsbook-limits-in-a-command"
    marker.unlink(missing_ok=True)
    zshenv = box.home / ".zshenv"
    before = zshenv.read_text()
    # Every remote command is made slow, and says so: SIGTERM lands inside the stage.
    zshenv.write_text(before + f": > {shlex.quote(str(marker))}; sleep 3\n")
    run = subprocess.Popen(
        [*OPSBOOK, "run", "03_launch_script", "-f", str(dep), "--runs-dir", str(runs)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # The notebook is being executed, and one of its remote commands is under way.
        wait_for(
            lambda: any((f / "03_launch_script.ipynb").exists() for f in runs_of(runs)),
            120,
            "the stage to start",
        )
        marker.unlink(missing_ok=True)
        wait_for(marker.exists, 60, "a remote command of the stage")
        run.send_signal(signal.SIGTERM)
        began = time.monotonic()
        out, err = run.communicate(timeout=120)
        took = time.monotonic() - began
    finally:
        zshenv.write_text(before)
        marker.unlink(missing_ok=True)
        if run.poll() is None:
            run.kill()
    assert "Traceback" not in opsbook_stderr(err)
    folders = runs_of(runs)
    assert len(folders) == 1, (folders, out, err)
    # Interrupted in the stage (143), or, landed while the record was being written, after
    # it (ignored: the run ends as it ran): either way the folder has its run.json.
    assert (folders[0] / "run.json").exists(), (out, err)
    doc = json.loads((folders[0] / "run.json").read_text())
    assert run.returncode == doc["exit_code"] in (143, 1), (out, err)
    if run.returncode == 143:
        assert doc["status"] == "interrupted"
    assert "before the run began" not in err
    assert took < 60, took


# -- item 7: a stage timeout, an unreadable checkpoint, Ctrl-C during sandbox up ---------------


def test_a_stage_timeout_is_a_clear_message_not_a_traceback(box: Sandbox, tmp_path: Path) -> None:
    zshenv = box.home / ".zshenv"
    before = zshenv.read_text()
    zshenv.write_text(before + "sleep 30\n")
    try:
        done = opsbook(
            "run", "00_preflight", "-f", str(box.deployment_path),
            "--runs-dir", str(tmp_path / "runs"), "--stage-timeout", "5", timeout=300,
        )  # fmt: skip
    finally:
        zshenv.write_text(before)
    # 3, or 4 when the stop cut a connection the host result then names (4 over 3).
    assert done.returncode in (3, 4), done.stdout + done.stderr
    assert "the stage ran longer than 5 s and was stopped" in done.stdout
    assert "Traceback" not in opsbook_stderr(done.stderr)


def test_an_unreadable_checkpoint_says_permission_denied_not_no_shards(
    box: Sandbox, tmp_path: Path
) -> None:
    model = Path(load_deployment(box.deployment_path).model_path)
    mode = stat.S_IMODE(model.stat().st_mode)
    model.chmod(0)
    try:
        done = opsbook(
            "run", "01_download_check", "-f", str(box.deployment_path),
            "--runs-dir", str(tmp_path / "runs"), timeout=300,
        )  # fmt: skip
    finally:
        model.chmod(mode)
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"cannot read the checkpoint: {model}: permission denied" in done.stdout
    assert "no checkpoint shards found" not in done.stdout


def test_ctrl_c_during_sandbox_up_stops_what_started_without_a_traceback() -> None:
    needs_root()
    folder = sandbox_folder("limits-ctrl-c") / "box"
    paths = box_state.BoxPaths(folder)
    run = subprocess.Popen(
        [*OPSBOOK, "sandbox", "up", "--dir", str(folder), "--address", CTRL_C_ADDRESS],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # Its user made and its state written: the start is under way.
        wait_for(
            lambda: (s := box_state.read_state(paths)) is not None and s.status == "starting",
            120,
            "the sandbox to start",
        )
        state = box_state.read_state(paths)
        assert state is not None
        run.send_signal(signal.SIGINT)
        out, err = run.communicate(timeout=120)
    finally:
        if run.poll() is None:
            run.kill()
        sandboxes.down(folder)
    try:
        assert "Traceback" not in err, err
        if run.returncode == 0:
            pytest.skip("sandbox up finished before Ctrl-C landed")
        assert run.returncode == 3, out + err
        assert "sandbox up was interrupted (Ctrl-C) while starting" in err
        after = box_state.read_state(paths)
        assert after is not None and after.status == "down" and after.sshd_pid is None
        users = subprocess.run(["getent", "passwd", state.user], capture_output=True)
        assert users.returncode != 0, f"user {state.user} was left"
    finally:
        shutil.rmtree(folder.parent, ignore_errors=True)
