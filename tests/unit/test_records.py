import json
import os

import pytest

from opsbook import records
from opsbook.exceptions import RunError


def stages() -> list[records.StageSummary]:
    return [
        records.StageSummary(
            "00_preflight", "00_preflight.ipynb", "ok", 0, 2.0, "8 GPUs", "a.html"
        ),
        records.StageSummary(
            "04_launch", "04_launch.ipynb", "problem found", 1, 9.5, "crashed <x>"
        ),
        records.StageSummary("05_diagnose", "05_diagnose.ipynb", "skipped", None, 0.0, "not run"),
    ]


def test_summary_and_index_link_every_stage(tmp_path) -> None:
    run = {"name": "rehearsal", "status": "problem found", "exit_code": 1, "message": "m"}
    records.write_summary(tmp_path, run, stages())
    doc = json.loads((tmp_path / "summary.json").read_text())
    assert [s["stage"] for s in doc["stages"]] == ["00_preflight", "04_launch", "05_diagnose"]
    page = (tmp_path / "index.html").read_text()
    assert 'href="00_preflight.ipynb"' in page and 'href="a.html"' in page
    assert "crashed &lt;x&gt;" in page and "<x>" not in page


def test_a_closed_run_folder_is_read_only(tmp_path) -> None:
    folder = tmp_path / "run"
    (folder / "sub").mkdir(parents=True)
    (folder / "run.json").write_text("{}")
    records.close(folder)
    for path in (folder, folder / "sub", folder / "run.json"):
        assert not os.stat(path).st_mode & 0o222
    folder.chmod(0o755)  # let pytest clean up


def test_runs_are_listed_newest_first_and_shown(tmp_path) -> None:
    for name, status in [
        ("20260101T000000Z-deploy-h", "ok"),
        ("20260102T000000Z-deploy-h", "tool failed"),
    ]:
        (tmp_path / name).mkdir()
        (tmp_path / name / "run.json").write_text(json.dumps({"status": status, "exit_code": 0}))
    (tmp_path / "not-a-run").mkdir()
    table = records.list_runs(tmp_path)
    assert [r["run"] for r in table.records()] == [
        "20260102T000000Z-deploy-h",
        "20260101T000000Z-deploy-h",
    ]
    assert records.show_run(tmp_path / "20260101T000000Z-deploy-h")["status"] == "ok"
    with pytest.raises(RunError, match="not a run folder"):
        records.show_run(tmp_path / "not-a-run")
