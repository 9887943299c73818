"""``opsbook check``, the scheduled health check, over real SSH on a rehearsal host of its own
(127.0.4.x): the same verdict and exit code as the diagnose notebook, without a kernel and
without a run folder unless ``--record`` asks for one.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from opsbook.rehearsal.sandbox import Sandbox
from opsbook.runner import run
from tests.integration.conftest import rehearsal_host

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
