"""Hosts side by side on a rehearsal fleet: one host on another GPU, vLLM release and KV-cache
dtype among hosts serving the same model is named in 00_preflight and 05_diagnose (run
headless by `opsbook run`, papermill), and the table is in the executed notebooks.

The hosts use 127.0.11.0/24, an address range of their own.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from opsbook.rehearsal import fleet as fleets
from opsbook.rehearsal import sandbox as sandboxes
from opsbook.rehearsal.sandbox import Sandbox
from tests.integration.conftest import opsbook, sandbox_folder

pytestmark = pytest.mark.integration

ADDRESS, ODD_ADDRESS = "127.0.11.1", "127.0.11.2"


@pytest.fixture(scope="module")
def mixed_fleet() -> Iterator[tuple[Path, list[Sandbox]]]:
    """Two hosts: 8 RTX PRO 6000 on vLLM 0.15.1, and 8 B200 on vLLM 0.33.0 told to use an
    FP8 KV cache (``server.args`` in its vars)."""
    folder = sandbox_folder("sidebyside")
    boxes: list[Sandbox] = []
    try:
        boxes.append(sandboxes.up(folder / "host-01", address=ADDRESS))
        boxes.append(
            sandboxes.up(
                folder / "host-02", address=ODD_ADDRESS, gpu_profile="b200", vllm_version="0.33.0"
            )
        )
        path = fleets.write_deployment(boxes, folder / "deployment.yml", name="side-by-side")
        doc = yaml.safe_load(path.read_text())
        doc["hosts"][1]["vars"]["server"]["args"] = {"kv-cache-dtype": "fp8"}
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        yield path, boxes
    finally:
        for box in boxes:
            sandboxes.down(box.dir)
        shutil.rmtree(folder, ignore_errors=True)


def name(box: Sandbox) -> str:
    return f"{box.user}@{box.address}:{box.port}"


def run_folder(done: subprocess.CompletedProcess[str]) -> Path:
    line = next(x for x in done.stdout.splitlines() if x.startswith("run folder: "))
    return Path(line.split(": ", 1)[1])


def findings(summary: dict, stage: str, host: str) -> list[dict]:
    [result] = [r for r in summary["results"] if r["stage"] == stage and r["host"] == host]
    return result["findings"]


@pytest.fixture(scope="module")
def deployed(mixed_fleet, tmp_path_factory) -> subprocess.CompletedProcess[str]:
    path, _ = mixed_fleet
    runs = tmp_path_factory.mktemp("runs")
    return opsbook(
        "run", "deploy", "-f", str(path), "-p", "apply", "True", "--runs-dir", str(runs)
    )  # fmt: skip


def test_preflight_and_diagnose_name_the_host_on_another_vllm_and_kv_dtype(
    mixed_fleet, deployed
) -> None:
    _, (usual, odd) = mixed_fleet
    assert deployed.returncode == 0, deployed.stdout + deployed.stderr
    summary = json.loads((run_folder(deployed) / "summary.json").read_text())
    for stage in ("preflight", "diagnose"):
        said = {
            f["message"]
            for f in findings(summary, stage, name(usual))
            if f["severity"] == "warning"
        }
        assert f"hosts differ: vLLM: {name(usual)} 0.15.1, {name(odd)} 0.33.0" in said, said
    # 05 reads what each engine runs with from its server's log: the 0.15.1 host's config was
    # patched to a BF16 KV cache by 02, the B200 keeps FP8 (vLLM's fp8 is fp8_e4m3).
    said = {f["message"] for f in findings(summary, "diagnose", name(odd))}
    assert f"hosts differ: KV cache dtype: {name(usual)} auto, {name(odd)} fp8_e4m3" in said
    [row] = [
        f for f in findings(summary, "diagnose", name(odd)) if f["subject"] == "hosts side by side"
    ]
    assert "engine facts from the server's log" in row["message"]
    assert "attention backend FLASHINFER_MLA" in row["message"]
    # Each host's line as it finishes, then again once compared, saying what differs with
    # its own value.
    lines = [x for x in deployed.stdout.splitlines() if x.startswith("diagnose") and name(odd) in x]
    assert len(lines) == 2 and "hosts differ: " not in lines[0], lines
    assert "vLLM 0.33.0 (others 0.15.1), KV cache dtype fp8_e4m3 (others auto)" in lines[1]
    assert summary["recap"][name(odd)]["ok"] == 4  # said twice, counted once


def test_the_executed_notebooks_hold_the_table_with_the_differences_highlighted(deployed) -> None:
    folder = run_folder(deployed)
    for notebook in ("00_preflight.ipynb", "05_diagnose.ipynb"):
        cells = json.loads((folder / notebook).read_text())["cells"]
        [cell] = [c for c in cells if "".join(c["source"]) == "fleet.side_by_side()"]
        page = "".join(cell["outputs"][0]["data"]["text/html"])
        assert "Hosts side by side" in page and "<b>0.33.0</b>" in page, page[:500]
        assert "background:#ffebe9" in page


def test_a_diagnose_of_its_own_names_the_difference(mixed_fleet, deployed, tmp_path) -> None:
    path, (usual, odd) = mixed_fleet
    done = opsbook("run", "05_diagnose", "-f", str(path), "--runs-dir", str(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads((run_folder(done) / "run.json").read_text())
    said = {f["message"] for f in findings(summary, "diagnose", name(odd))}
    assert f"hosts differ: vLLM: {name(usual)} 0.15.1, {name(odd)} 0.33.0" in said
