"""The records over many runs: the list filtered, search, and diff of two run folders."""

import json
from datetime import datetime, timezone
from pathlib import Path

import pytest

from opsbook.core.exceptions import RunError
from opsbook.core.facts_schema import EngineFacts, HostRunFacts, RunFacts
from opsbook.runner import history


def filed(runs: Path, name: str, host: str, status: str = "ok", **facts: object) -> None:
    folder = runs / name
    folder.mkdir(parents=True)
    summary = {"name": name, "deployment": "/etc/kimi.yml", "status": status, "exit_code": 0,
               "message": "m", "duration": 1, "hosts": [host], "results": []}  # fmt: skip
    (folder / "summary.json").write_text(json.dumps(summary))
    doc = RunFacts(run=name, deployment="/etc/kimi.yml", status=status,
                   hosts={host: HostRunFacts(**facts)})  # fmt: skip
    (folder / "facts.json").write_text(doc.to_json())


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    runs = tmp_path / "runs"
    filed(runs, "20260101T000000Z-deploy-gpu-01", "ops@gpu-01:22",
          engine=EngineFacts(vllm="0.15.1"), failures=["fp8kv-mla"])  # fmt: skip
    filed(runs, "20260201T000000Z-deploy-gpu-02", "ops@gpu-02:22", status="problem found",
          engine=EngineFacts(vllm="0.33.0"))  # fmt: skip
    filed(runs, "20260301T000000Z-deploy-gpu-01", "ops@gpu-01:22",
          engine=EngineFacts(vllm="0.33.0"))  # fmt: skip
    (runs / ".good-marks.jsonl").write_text("")  # not a run
    return runs


def listed(runs: Path, **only: object) -> list[str]:
    return [str(r["run"]) for r in history.list_runs(runs, history.RunFilter(**only)).records()]


def test_the_list_filters_by_host_state_deployment_and_dates(runs: Path) -> None:
    assert listed(runs) == [
        "20260301T000000Z-deploy-gpu-01",
        "20260201T000000Z-deploy-gpu-02",
        "20260101T000000Z-deploy-gpu-01",
    ]
    assert listed(runs, hosts=("gpu-02",)) == ["20260201T000000Z-deploy-gpu-02"]
    assert len(listed(runs, hosts=("gpu-02", "gpu-01"))) == 3
    assert listed(runs, hosts=("ops@gpu-0[1]:*",)) == [
        "20260301T000000Z-deploy-gpu-01",
        "20260101T000000Z-deploy-gpu-01",
    ]
    assert listed(runs, state="problem found") == ["20260201T000000Z-deploy-gpu-02"]
    assert len(listed(runs, deployment="kimi.yml")) == 3
    assert listed(runs, deployment="other.yml") == []
    since = history.parse_when("2026-01-15")
    until = history.parse_when("2026-02-15T00:00")
    assert listed(runs, since=since, until=until) == ["20260201T000000Z-deploy-gpu-02"]
    # A folder whose name says no time is judged by its record's start.
    filed(runs, "session-of-ops", "ops@gpu-03:22")
    summary = runs / "session-of-ops" / "summary.json"
    summary.write_text(
        summary.read_text().replace('"name"', '"started": "2026-02-01T10:00:00", "name"')
    )
    assert "session-of-ops" in listed(runs, since=since, until=until)
    assert "session-of-ops" not in listed(runs, since=until)


def test_a_date_that_is_none_is_refused_with_the_form_expected() -> None:
    with pytest.raises(RunError, match="'last week' is not a date") as e:
        history.parse_when("last week")
    assert "2026-12-06" in e.value.remedy
    assert history.parse_when("2026-01-15").tzinfo == timezone.utc


def test_a_run_folder_name_gives_its_start() -> None:
    assert history.started_of("20260101T050607Z-deploy") == datetime(
        2026, 1, 1, 5, 6, 7, tzinfo=timezone.utc
    )
    assert history.started_of("session-x") is None


def test_search_finds_runs_where_a_fact_had_a_value_and_a_failure_struck(runs: Path) -> None:
    found = history.search(runs, [history.parse_fact("vllm=0.33.0")])
    assert [r["run"] for r in found.records()] == [
        "20260301T000000Z-deploy-gpu-01",
        "20260201T000000Z-deploy-gpu-02",
    ]
    both = history.search(runs, [("engine.vllm", "0.15.*")], ["fp8kv-mla"])
    assert [r["run"] for r in both.records()] == ["20260101T000000Z-deploy-gpu-01"]
    assert history.search(runs, [("vllm", "0.33.0")], ["fp8kv-mla"]).rows == []
    with pytest.raises(RunError, match="is not NAME=VALUE"):
        history.parse_fact("vllm")


def test_diff_of_two_run_folders_and_of_a_folder_without_facts(runs: Path) -> None:
    diff = history.diff_runs(
        runs, "20260101T000000Z-deploy-gpu-01", "20260301T000000Z-deploy-gpu-01"
    )
    assert [(c.key, c.old, c.new) for c in diff.changes] == [
        ("engine.vllm", "0.15.1", "0.33.0"),
        ("failures", "fp8kv-mla", None),
    ]
    (runs / "old-run").mkdir()
    with pytest.raises(RunError, match="has no facts.json"):
        history.diff_runs(runs, "old-run", "20260301T000000Z-deploy-gpu-01")
