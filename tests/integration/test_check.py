"""``opsbook check``, the scheduled health check, over real SSH on a rehearsal host of its own
(127.0.4.x): the same verdict and exit code as the diagnose notebook, without a kernel and
without a run folder unless ``--record`` asks for one.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from opsbook.core.deployment import load_deployment
from opsbook.rehearsal.sandbox import Sandbox
from opsbook.remote.hosts import Host
from opsbook.runner import run
from opsbook.steps import server
from tests.integration.conftest import cmdline, rehearsal_host, stat_fields

pytestmark = pytest.mark.integration

ADDRESS = "127.0.4.30"


@pytest.fixture(scope="module")
def box() -> Iterator[Sandbox]:
    with rehearsal_host("check", address=ADDRESS, port=44130, server_port=44181) as box:
        yield box


def check(deployment: Path, *extra: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "opsbook", "check", "-f", str(deployment), *extra],
        capture_output=True,
        text=True,
        cwd=cwd,
    )


def test_check_says_what_the_notebook_says_with_its_exit_code(box: Sandbox, tmp_path) -> None:
    # Never started: the notebook and the check both find a problem (exit 1).
    before = check(box.deployment_path, cwd=tmp_path)
    assert before.returncode == 1, before.stdout + before.stderr
    assert "never started" in before.stdout
    assert not (tmp_path / "runs").exists()  # nothing filed without --record
    notebook = run.run_notebook("05_diagnose", box.deployment_path, runs_dir=tmp_path / "nb")
    assert notebook.exit_code == 1
    assert notebook.results[0].message in before.stdout

    deployed = run.run_deploy(box.deployment_path, tmp_path / "deploy")
    assert deployed.ok, deployed.message
    assert_one_kernel_served_every_stage(deployed)
    ready = check(box.deployment_path, cwd=tmp_path)
    assert ready.returncode == 0, ready.stdout + ready.stderr
    assert "ready: the process runs and /health answers 200" in ready.stdout

    recorded = check(box.deployment_path, "--record", "--runs-dir", "runs", cwd=tmp_path)
    assert recorded.returncode == 0, recorded.stdout + recorded.stderr
    folders = list((tmp_path / "runs").iterdir())
    assert len(folders) == 1 and (folders[0] / "05_diagnose.ipynb").is_file()


def test_check_of_a_host_nobody_answers_on_is_unreachable(box: Sandbox, tmp_path) -> None:
    doc = yaml.safe_load(box.deployment_path.read_text())
    doc["hosts"][0]["port"] = 44131  # nothing listens there
    doc["hosts"][0]["connect_timeout"] = 3
    moved = tmp_path / "moved.yml"
    moved.write_text(yaml.safe_dump(doc))
    done = check(moved, cwd=tmp_path)
    assert done.returncode == 4, done.stdout + done.stderr
    assert "unreachable" in done.stdout


def run_cli(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "opsbook", *argv], capture_output=True, text=True, cwd=cwd
    )


def server_states(textfile: Path) -> dict[str, str]:
    """Each host's state in an opsbook textfile, read with prometheus_client's parser."""
    found = {}
    for family in text_string_to_metric_families(textfile.read_text()):
        for sample in family.samples:
            if sample.name == "opsbook_server_state" and sample.value == 1.0:
                found[sample.labels["host"]] = sample.labels["state"]
    return found


def engine_core_of(box: Sandbox) -> int:
    """The server's VLLM::EngineCore process: in the group of the launch opsbook recorded."""
    dep = load_deployment(box.deployment_path)
    host = Host.from_deployment(dep)
    try:
        paths = server.resolve_paths(host, dep)
    finally:
        host.close()
    leader = json.loads((Path(paths.state_dir) / "launch.json").read_text())["pid"]
    for name in os.listdir("/proc"):
        if name.isdigit() and cmdline(int(name)).startswith("VLLM::EngineCore"):
            with contextlib.suppress(OSError, IndexError):
                if int(stat_fields(int(name))[2]) == leader:
                    return int(name)
    raise AssertionError("no VLLM::EngineCore in the launch's process group")


def complete(port: int) -> None:
    # The simulated server binds loopback's 127.0.0.1 when the deployment sets no --host.
    body = json.dumps({"prompt": "a long answer", "max_tokens": 64}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body)
    request.add_header("Content-Type", "application/json")
    with contextlib.suppress(OSError), urllib.request.urlopen(request, timeout=120) as answer:
        answer.read()


def test_a_textfile_run_names_every_host_s_state_and_a_stalled_engine_is_hung(
    box: Sandbox, tmp_path
) -> None:
    if check(box.deployment_path, cwd=tmp_path).returncode != 0:
        assert run.run_deploy(box.deployment_path, tmp_path / "deploy").ok
    textfiles = tmp_path / "textfile"
    textfiles.mkdir()
    name = load_deployment(box.deployment_path).name
    ready = run_cli("run", "05_diagnose", "-f", str(box.deployment_path), "--textfile",
                    str(textfiles), "--runs-dir", "runs", cwd=tmp_path)  # fmt: skip
    assert ready.returncode == 0, ready.stdout + ready.stderr
    written = textfiles / f"opsbook_{name}.prom"
    assert f"textfile: {written}" in ready.stdout
    assert list(server_states(written).values()) == ["ready"]
    assert sorted(os.listdir(textfiles)) == [written.name]
    record = json.loads(next((tmp_path / "runs").glob("*/run.json")).read_text())
    [end] = [m for m in record["metrics"] if m["moment"] == "end"]
    assert end["summary"]["server_state"] == "ready" and end["summary"]["running"] == 0.0

    # The engine core stopped under load: /health still 200, the counters still: hung.
    core = engine_core_of(box)
    port = load_deployment(box.deployment_path).server_port
    os.kill(core, signal.SIGSTOP)
    try:
        time.sleep(1.0)  # past the simulated API server's patience with a silent engine core
        load = [threading.Thread(target=complete, args=(port,), daemon=True) for _ in range(2)]
        for thread in load:
            thread.start()
        began = time.monotonic()
        hung = check(box.deployment_path, cwd=tmp_path)
        seconds = time.monotonic() - began
        scheduled = run_cli("run", "05_diagnose", "-f", str(box.deployment_path), "--textfile",
                            str(textfiles), "--runs-dir", "runs", cwd=tmp_path)  # fmt: skip
    finally:
        os.kill(core, signal.SIGCONT)
    assert hung.returncode == 1, hung.stdout + hung.stderr
    assert "hung: /health answers 200, but 2 request(s) running" in hung.stdout
    assert seconds < 30
    assert scheduled.returncode == 1, scheduled.stdout + scheduled.stderr
    assert list(server_states(written).values()) == ["hung"]
    for thread in load:
        thread.join(30)
    assert check(box.deployment_path, cwd=tmp_path).returncode == 0


def test_a_textfile_for_another_stage_or_a_missing_folder_exits_2(box: Sandbox, tmp_path) -> None:
    other = run_cli("run", "00_preflight", "-f", str(box.deployment_path), "--textfile",
                    str(tmp_path), cwd=tmp_path)  # fmt: skip
    assert other.returncode == 2 and "--textfile is for 05_diagnose" in other.stderr
    missing = run_cli("run", "05_diagnose", "-f", str(box.deployment_path), "--textfile",
                      str(tmp_path / "nope"), cwd=tmp_path)  # fmt: skip
    assert missing.returncode == 2 and "not a folder" in missing.stderr
    assert not (tmp_path / "runs").exists()


def assert_one_kernel_served_every_stage(deployed: run.RunRecord) -> None:
    """Every stage is filed (notebook, HTML, its own results) and the stages shared a kernel:
    each notebook's cells count on from the previous one's."""
    summary = json.loads((deployed.folder / "summary.json").read_text())
    first_counts = []
    for entry in summary["notebooks"]:
        assert entry["html"] and (deployed.folder / entry["html"]).is_file()
        notebook = json.loads((deployed.folder / entry["notebook"]).read_text())
        counts = [c["execution_count"] for c in notebook["cells"] if c.get("execution_count")]
        first_counts.append(counts[0])
    assert first_counts == sorted(first_counts) and first_counts[0] < first_counts[-1]
    assert {r.stage for r in deployed.results} >= {"preflight", "launch", "diagnose"}
