"""A rehearsal fleet over real sshd: one run over four hosts with an unreachable one and a
broken checkpoint, and a rolling restart that stops at the batch that fails.

The fleets use 127.0.1.0/24, an address range of their own, so they need no lock.
"""

import hashlib
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from opsbook.core.results import State
from opsbook.rehearsal import fleet as fleets
from opsbook.rehearsal.fleet import Fleet
from opsbook.runner import run

pytestmark = pytest.mark.integration


def start_fleet(label: str, address: str) -> Iterator[Fleet]:
    folder = Path(tempfile.mkdtemp(prefix=f"opsbook-{label}-", dir="/tmp"))
    # The test's own folder: the sandbox keeps an existing folder's mode.
    folder.chmod(0o755)
    fleet = fleets.up(folder, hosts=4, address=address)
    try:
        yield fleet
    finally:
        fleets.down(folder)
        subprocess.run(["rm", "-rf", str(folder)], check=False)


@pytest.fixture(scope="module")
def broken_fleet() -> Iterator[Fleet]:
    """Four hosts: the second's sshd stopped, the third's checkpoint truncated."""
    for fleet in start_fleet("fleet", "127.0.1.21"):
        fleets.stop_sshd(fleet.hosts[1])
        fleets.truncate_checkpoint(fleet.hosts[2])
        yield fleet


@pytest.fixture(scope="module")
def deployed(
    broken_fleet: Fleet, tmp_path_factory: pytest.TempPathFactory
) -> subprocess.CompletedProcess[str]:
    runs = tmp_path_factory.mktemp("runs")
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "opsbook",
            "run",
            "deploy",
            "-f",
            str(broken_fleet.deployment_path),
            "-p",
            "apply",
            "True",
            "--runs-dir",
            str(runs),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )


def name(box) -> str:
    return f"{box.user}@{box.address}:{box.port}"


def summary_of(out: str) -> dict:
    folder = next(
        line.split(": ", 1)[1] for line in out.splitlines() if line.startswith("run folder: ")
    )
    return json.loads((Path(folder) / "summary.json").read_text()) | {"folder": folder}


def test_the_healthy_hosts_are_ready_and_the_others_say_why_not(broken_fleet, deployed) -> None:
    assert deployed.returncode == run.EXIT_UNREACHABLE, deployed.stdout + deployed.stderr
    summary = summary_of(deployed.stdout)
    state = {(r["host"], r["stage"]): r for r in summary["results"]}
    healthy = [name(broken_fleet.hosts[0]), name(broken_fleet.hosts[3])]
    for host in healthy:
        assert state[(host, "launch")]["state"] == "changed"
        assert state[(host, "launch")]["message"].startswith("smoke test passed")
        assert state[(host, "diagnose")]["state"] == "ok"
        assert state[(host, "diagnose")]["message"].startswith("ready")
    stopped, truncated = name(broken_fleet.hosts[1]), name(broken_fleet.hosts[2])
    assert state[(stopped, "preflight")]["state"] == "unreachable"
    assert "refused" in state[(stopped, "preflight")]["message"]
    assert all(
        state[(stopped, s)]["state"] == "skipped" for s in ("download", "launch", "diagnose")
    )
    assert state[(truncated, "preflight")]["state"] == "ok"
    assert state[(truncated, "download")]["state"] == "failed"
    assert state[(truncated, "download")]["failure_id"] == "safetensors-corrupt"
    assert "1 truncated" in state[(truncated, "download")]["message"]
    assert state[(truncated, "config-patch")]["message"] == "not run: failed at download"
    assert summary["recap"][stopped]["unreachable"] == 1
    assert summary["recap"][truncated]["failed"] >= 1
    assert summary["recap"][healthy[0]] == {
        "ok": 3,
        "changed": 3,
        "failed": 0,
        "unreachable": 0,
        "skipped": 0,
        "exit_code": 0,
    }


def test_a_line_per_stage_and_host_then_the_recap(broken_fleet, deployed) -> None:
    lines = deployed.stdout.splitlines()
    recap = lines.index("RECAP")
    host_lines = [
        line
        for line in lines[:recap]
        if line.split()[:1]
        and line.split()[0]
        in ("preflight", "download", "config-patch", "launch-script", "launch", "diagnose")
        and line.split()[2] != "..."  # the startup phases a launch reports on the way
    ]
    phases = [line for line in lines[:recap] if line.split()[2:3] == ["..."]]
    # Which intermediate phases a look catches depends on timing; one must be seen live.
    assert any("loading" in line for line in phases), phases
    # 4 preflight, 3 download, 2 x (patch, script, launch), 3 diagnose (not the unreachable one)
    assert len(host_lines) == 16, host_lines
    assert any("unreachable" in line and name(broken_fleet.hosts[1]) in line for line in host_lines)
    recap_lines = lines[recap + 1 : recap + 6]
    assert any(
        line.startswith(name(broken_fleet.hosts[0])) and "ok=3  changed=3  failed=0" in line
        for line in recap_lines
    )
    assert any("failed at download" in line for line in lines[recap:])
    assert "Traceback" not in deployed.stdout + deployed.stderr


def test_the_record_shows_all_of_it(broken_fleet, deployed) -> None:
    summary = summary_of(deployed.stdout)
    folder = Path(summary["folder"])
    page = (folder / "index.html").read_text()
    for box in broken_fleet.hosts:
        assert f"<th style='text-align:left'>{name(box)}</th>" in page
    assert page.count("<td class='state'") == 4 * 6
    assert page.count(">unreachable</a>") == 1
    names = {p.name for p in folder.iterdir()}
    assert {f"{s}.ipynb" for s in run.DEPLOY_STAGES} | {"05_diagnose.ipynb"} <= names
    assert {"summary.json", "run.json", "journal.jsonl", "index.html"} <= names
    versions = summary["script_versions"]
    for box in (broken_fleet.hosts[0], broken_fleet.hosts[3]):
        on_disk = hashlib.sha256((box.home / "opsbook" / "launch.sh").read_bytes()).hexdigest()
        assert versions[name(box)] == on_disk
    assert versions[name(broken_fleet.hosts[1])] == versions[name(broken_fleet.hosts[2])] == ""


@pytest.fixture(scope="module")
def serving_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """Four hosts all serving the same launch script."""
    for fleet in start_fleet("rolling", "127.0.1.31"):
        first = run.run_deploy(fleet.deployment_path, tmp_path_factory.mktemp("runs"))
        assert first.exit_code == run.EXIT_OK, first.message
        yield fleet, json.loads((first.folder / "summary.json").read_text())["script_versions"]


def test_a_rolling_restart_stops_at_the_batch_that_fails(serving_fleet, tmp_path) -> None:
    serving_fleet, before = serving_fleet
    hosts = [name(box) for box in serving_fleet.hosts]
    assert all(before[h] for h in hosts)
    doc = yaml.safe_load(serving_fleet.deployment_path.read_text())
    doc["server"]["env"]["OPSBOOK_RELEASE"] = "2"  # a new launch script for every host
    upgrade = tmp_path / "upgrade.yml"
    upgrade.write_text(yaml.safe_dump(doc))
    fleets.crash_on_start(serving_fleet.hosts[2])
    seen = []
    record = run.run_deploy(upgrade, tmp_path / "runs", serial=1, on_result=seen.append)
    assert record.exit_code == run.EXIT_PROBLEM, record.message
    state = {(r.host, r.stage): r for r in record.results}
    for host in hosts[:2]:
        assert state[(host, "launch")].state is State.CHANGED
        assert state[(host, "diagnose")].message.startswith("ready")
    assert state[(hosts[2], "launch")].state is State.FAILED
    assert state[(hosts[2], "launch")].failure_id == "oom"
    assert state[(hosts[3], "preflight")].state is State.SKIPPED
    assert "batch 3 of 4 failed" in state[(hosts[3], "launch")].message
    assert state[(hosts[3], "diagnose")].state is State.OK
    assert state[(hosts[3], "diagnose")].message.startswith("ready")
    # Batches one after the other: host 2's first line comes after host 1's launch.
    order = [(r.host, r.stage) for r in seen]
    assert order.index((hosts[0], "launch")) < order.index((hosts[1], "preflight"))
    summary = json.loads((record.folder / "summary.json").read_text())
    after = summary["script_versions"]
    # Hosts 1-2 run the new script, host 3 runs nothing, host 4 still the old one.
    for box in serving_fleet.hosts[:2]:
        new = hashlib.sha256((box.home / "opsbook" / "launch.sh").read_bytes()).hexdigest()
        assert after[name(box)] == new != before[name(box)]
    assert after[hosts[2]] == ""
    assert after[hosts[3]] == before[hosts[3]]
    assert (
        "OPSBOOK_RELEASE" not in (serving_fleet.hosts[3].home / "opsbook" / "launch.sh").read_text()
    )
    assert (record.folder / "batch-03" / "04_launch.ipynb").exists()
    assert not (record.folder / "batch-04").exists()


def test_a_slow_host_delays_no_other_over_real_ssh(broken_fleet, deployed) -> None:
    from opsbook import stages
    from opsbook.core.deployment import load_deployment

    slow, fast = broken_fleet.hosts[3], broken_fleet.hosts[0]
    fleets.make_slow(slow, 3)
    dep = load_deployment(broken_fleet.deployment_path)
    finished: dict[str, float] = {}
    started = time.monotonic()
    fleet = stages.run_stage(
        stages.get("diagnose"),
        dep,
        hosts=[name(slow), name(fast)],
        on_result=lambda r: finished.setdefault(r.host, time.monotonic() - started),
    )
    assert [r.state for r in fleet.results] == [State.OK, State.OK]
    assert finished[name(slow)] >= 3
    assert finished[name(fast)] < finished[name(slow)] - 2


def test_the_run_stops_once_too_many_hosts_failed(broken_fleet, deployed, tmp_path) -> None:
    record = run.run_deploy(broken_fleet.deployment_path, tmp_path, max_fail_percentage=10)
    state = {(r.host, r.stage): r for r in record.results}
    assert record.exit_code == run.EXIT_UNREACHABLE
    assert "more than 10% of the hosts failed" in record.message
    healthy = name(broken_fleet.hosts[0])
    assert state[(healthy, "preflight")].state is State.OK
    assert state[(healthy, "download")].state is State.SKIPPED
    assert "more than 10%" in state[(healthy, "download")].message
    assert state[(healthy, "diagnose")].state is State.OK  # still serving, untouched
