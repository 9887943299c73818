"""The runbook on the GPU box itself (issue 36, item 5): ``address: local`` deploys the
rehearsal machine without SSH, with the same probes, journal and record; and a deploy started
with ``--detach`` survives the hangup of the terminal it was started from, and files a complete
record that ``records show --follow`` follows to its end.

Run as root, the rehearsal host's login user is an account of its own, and opsbook cannot run
as it here (the venv's interpreter lives under /root, mode 0700): the local host runs as the
current user against the sandbox's folder, seeing it as its login user does: the simulated
GPU tools first on PATH and ``OPSBOOK_SIM_DIR`` set (``box_files.path_snippet``), its vLLM env,
checkpoint and paths. Run as another user, the sandbox's login user is that user.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from opsbook.rehearsal.sandbox import Sandbox
from opsbook.runner.detach import CONSOLE_LOG, DETACHED_FILE, detached_run_alive, start_ticks
from tests.integration.conftest import OPSBOOK, models_status

pytestmark = pytest.mark.integration

ADDRESS = "127.0.36.1"  # 127.0.36.0/24: no other test uses it
STAGES = ("preflight", "download", "config-patch", "launch-script", "launch", "diagnose")


@dataclass
class Local:
    """A deployment of the rehearsal machine as ``address: local``, and the environment of
    an operator logged in on it."""

    box: Sandbox
    deployment: Path
    env: dict[str, str]
    runs: Path
    state: Path

    def opsbook(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*OPSBOOK, *args], capture_output=True, text=True, timeout=timeout, env=self.env
        )


@pytest.fixture(scope="module")
def local(box: Sandbox, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Local]:
    here = tmp_path_factory.mktemp("local")
    doc = yaml.safe_load(box.deployment_path.read_text())
    doc.update(name="rehearsal-local", hosts=["local"])
    deployment = here / "local.yml"
    deployment.write_text(yaml.safe_dump(doc))
    (here / "home").mkdir()
    env = {
        **os.environ,
        "HOME": str(here / "home"),
        "PATH": f"{box.dir / 'bin'}:{os.environ['PATH']}",
        "OPSBOOK_SIM_DIR": str(box.sim_dir),
        "PYTHONUNBUFFERED": "1",
    }
    state = Path(doc["paths"]["state"])
    try:
        yield Local(box, deployment, env, here / "runs", state)
    finally:
        stop_server(state)


def stop_server(state: Path) -> None:
    """Stop the server the local runs started: it runs as this user, and ``sandbox down``
    stops only its login user's processes. By the process group its launch record names, if
    that process is still the one started."""
    try:
        launched = json.loads((state / "launch.json").read_text())
    except (OSError, ValueError):
        return
    if start_ticks(launched["pid"]) != launched["start"]:
        return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(launched["pgid"], sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and start_ticks(launched["pid"]) is not None:
            time.sleep(0.1)


def stage_states(output: str) -> dict[str, str]:
    lines = [line.split() for line in output.splitlines()]
    return {w[0]: w[2] for w in lines if len(w) > 2 and w[0] in STAGES and w[2] != "..."}


def summary(folder: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((folder / "summary.json").read_text())
    return doc


def test_a_local_deploy_runs_every_stage_here_without_ssh(local: Local) -> None:
    sshd_log = local.box.dir / "sshd.log"
    logged_before = sshd_log.read_text() if sshd_log.exists() else ""
    runs = str(local.runs)
    done = local.opsbook("run", "deploy", "-f", str(local.deployment), "--runs-dir", runs)
    assert done.returncode == 0, done.stdout + done.stderr
    assert stage_states(done.stdout) == {
        "preflight": "ok",
        "download": "ok",
        "config-patch": "changed",
        "launch-script": "changed",
        "launch": "changed",
        "diagnose": "ok",
    }, done.stdout
    assert "8 × NVIDIA RTX PRO 6000" in done.stdout  # the simulated GPUs, seen from here
    assert models_status(local.box.server_port, None) == 200
    [folder] = local.runs.glob("*-deploy-local")
    entries = [json.loads(line) for line in (folder / "journal.jsonl").read_text().splitlines()]
    assert {e["host"] for e in entries} == {"local"}
    assert any(e["command"].startswith("probe facts (python3 -)") for e in entries)
    assert not [e for e in entries if e["kind"] == "connect"]
    assert {r["host"] for r in summary(folder)["results"]} == {"local"}
    # Nothing logged into the rehearsal host's sshd: the run never used SSH.
    logged = sshd_log.read_text() if sshd_log.exists() else ""
    assert "Accepted" not in logged[len(logged_before) :]


def test_a_detached_deploy_survives_the_hangup_of_its_terminal_and_files_its_record(
    local: Local,
) -> None:
    # The terminal's session: a shell that starts the run and stays, in a process group of its
    # own (this test's), which the hangup is sent to as a closing terminal sends it.
    command = [
        *OPSBOOK,
        "run",
        "deploy",
        "-f",
        str(local.deployment),
        "--runs-dir",
        str(local.runs),
        "-p",
        "restart",
        "always",
        "--detach",
    ]
    terminal = subprocess.Popen(
        ["bash", "-c", '"$@"; echo "exit $?"; exec sleep 600', "terminal", *command],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=local.env,
        start_new_session=True,
        # A terminal's shell takes SIGHUP's default; this test's runner may ignore it (nohup),
        # and an ignored signal is inherited and cannot be trapped back by a script.
        preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL),
    )
    assert terminal.stdout is not None
    said = []
    for line in terminal.stdout:
        said.append(line)
        if line.startswith("exit "):
            break
    text = "".join(said)
    assert "exit 0" in text, text
    folder = Path(next(s for s in said if s.startswith("run folder: ")).split(": ", 1)[1].strip())
    pid = int(next(s for s in said if s.startswith("detached: PID ")).split()[2].rstrip(","))
    assert f"opsbook records show {folder} --follow" in text
    assert os.getsid(pid) == pid != os.getsid(terminal.pid)  # it leads a session of its own

    os.killpg(terminal.pid, signal.SIGHUP)
    assert terminal.wait(timeout=30) == -signal.SIGHUP  # the terminal's session is gone
    time.sleep(1)
    assert detached_run_alive(folder)  # the hangup was not the run's signal

    followed = local.opsbook("records", "show", str(folder), "--follow", timeout=300)
    assert followed.returncode == 0, followed.stdout + followed.stderr
    assert stage_states(followed.stdout) == {
        "preflight": "ok",
        "download": "ok",
        "config-patch": "ok",
        "launch-script": "ok",
        "launch": "changed",
        "diagnose": "ok",
    }, followed.stdout
    assert f"run {folder.name}: ok (exit 0)" in followed.stdout

    record = summary(folder)
    assert record["status"] == "ok" and record["exit_code"] == 0
    assert {(r["host"], r["stage"]) for r in record["results"]} == {
        ("local", stage) for stage in STAGES
    }
    assert stat.S_IMODE(folder.stat().st_mode) == 0o500  # sealed
    console = folder / CONSOLE_LOG
    assert stat.S_IMODE(console.stat().st_mode) == 0o400
    written = console.read_text()
    assert "RECAP" in written and f"run folder: {folder}" in written
    assert json.loads((folder / DETACHED_FILE).read_text())["pid"] == pid
    assert models_status(local.box.server_port, None) == 200
