"""The runbook notebooks executed headless by papermill against the rehearsal host."""

import json
from pathlib import Path

import nbformat
import pytest
import yaml

from opsbook.core.exceptions import RunError
from opsbook.runner import run

pytestmark = [pytest.mark.integration, pytest.mark.notebook]


def outputs_text(notebook: Path) -> str:
    nb = json.loads(notebook.read_text())
    texts = []
    for cell in nb["cells"]:
        for out in cell.get("outputs", []):
            texts.append("".join(out.get("text", "")))
            texts.append("".join(out.get("data", {}).get("text/plain", "")))
    return "\n".join(texts)


def test_preflight_shows_eight_blackwell_gpus(sandbox, tmp_path) -> None:
    record = run.run_notebook("00_preflight", sandbox.deployment_path, runs_dir=tmp_path)
    assert record.exit_code == run.EXIT_OK, record.message
    text = outputs_text(record.executed_notebook)
    assert "8 GPU(s); interconnect: PCIe-only" in text
    assert text.count("NVIDIA RTX PRO 6000 Blackwell Workstation Edition  12.0") == 8
    saved = json.loads((record.folder / "run.json").read_text())
    assert saved["exit_code"] == 0 and saved["results"][0]["stage"] == "preflight"
    assert saved["results"][0]["state"] == "ok"
    journal = (record.folder / "journal.jsonl").read_text().splitlines()
    assert len(journal) == 1 and "probe facts" in journal[0]


def test_download_check_passes_on_the_synthetic_checkpoint(sandbox, tmp_path) -> None:
    record = run.run_notebook("01_download_check", sandbox.deployment_path, runs_dir=tmp_path)
    assert record.exit_code == run.EXIT_OK, record.message
    assert "all 119 shards complete" in outputs_text(record.executed_notebook)


def test_an_unreachable_host_has_its_own_exit_code_and_still_a_record(sandbox, tmp_path) -> None:
    doc = yaml.safe_load(Path(sandbox.deployment_path).read_text())
    doc["hosts"][0]["port"] = 1
    bad = tmp_path / "closed.yml"
    bad.write_text(yaml.safe_dump(doc))
    record = run.run_notebook("00_preflight", bad, runs_dir=tmp_path / "runs")
    assert record.exit_code == run.EXIT_UNREACHABLE
    assert "refused" in record.message and record.results[0].state.value == "unreachable"
    assert record.executed_notebook.exists()


def test_unknown_parameters_are_refused_before_anything_runs(sandbox, tmp_path) -> None:
    with pytest.raises(RunError, match="no parameter"):
        run.run_notebook("00_preflight", sandbox.deployment_path, {"dry": 1}, runs_dir=tmp_path)
    assert not (tmp_path).exists() or not any(tmp_path.iterdir())


def test_a_second_run_gets_a_new_folder(sandbox, tmp_path) -> None:
    first = run.run_notebook("01_download_check", sandbox.deployment_path, runs_dir=tmp_path)
    second = run.run_notebook("01_download_check", sandbox.deployment_path, runs_dir=tmp_path)
    assert first.folder != second.folder
    assert first.executed_notebook.exists() and second.executed_notebook.exists()


def test_a_stage_past_its_deadline_is_stopped_and_still_filed(sandbox, tmp_path) -> None:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    params = nbformat.v4.new_code_cell("deployment = ''")
    params.metadata["tags"] = ["parameters"]
    nb.cells = [
        params,
        nbformat.v4.new_code_cell("print('started')"),
        nbformat.v4.new_code_cell("import time\ntime.sleep(120)"),
    ]
    path = tmp_path / "slow.ipynb"
    nbformat.write(nb, path)
    record = run.run_notebook(
        path, sandbox.deployment_path, runs_dir=tmp_path / "runs", stage_timeout=6
    )
    assert record.exit_code == run.EXIT_TOOL_FAILED
    assert "longer than 6 s" in record.message
    assert record.duration < 30
    assert "started" in outputs_text(record.executed_notebook)
