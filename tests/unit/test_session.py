"""An interactive session's record: a run folder with its header, journal, results and clicks,
filed read-only; and the buttons' record of clicks."""

from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from pathlib import Path

import pytest

from opsbook import widgets
from opsbook.core import channel
from opsbook.core.channel import JOURNAL_ENV
from opsbook.core.deployment import load_deployment
from opsbook.core.results import HostResult, Result, State
from opsbook.remote.journal import Journal
from opsbook.runner import session

KEY = "sk-" + "a1B2" * 8


@pytest.fixture
def started(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> session.Session:
    monkeypatch.delenv(JOURNAL_ENV, raising=False)
    monkeypatch.delenv(channel.OUTCOME_ENV, raising=False)
    path = tmp_path / "d.yml"
    path.write_text("hosts: [gpu-01]\nmodel: {path: /m}\nserver: {port: 8000}\n")
    params = {"apply": False, "note": f"--api-key {KEY}"}
    found = session.start("02_config_patch", load_deployment(path), str(path), params,
                          runs_dir=str(tmp_path / "runs"))  # fmt: skip
    yield found
    for name in (JOURNAL_ENV, channel.OUTCOME_ENV):
        os.environ.pop(name, None)


def test_a_session_starts_a_run_folder_the_kernel_records_into(started: session.Session) -> None:
    assert started.folder.name.split("-", 1)[1] == "session-02_config_patch-gpu-01"
    header = json.loads((started.folder / session.HEADER).read_text())
    assert header["notebook"] == "02_config_patch" and header["parameters"]["apply"] == "False"
    assert KEY not in json.dumps(header)
    assert os.environ[JOURNAL_ENV] == str(started.journal)
    Journal.from_env().record(host="gpu-01", kind="run", command="true", exit_code=0, duration=0.1)
    channel.record_host(HostResult("gpu-01", "config-patch", State.CHANGED, f"ok {KEY}"))
    assert len(started.journal.read_text().splitlines()) == 1
    assert KEY not in started.results_file.read_text()


def test_filing_writes_the_summary_and_makes_the_folder_read_only(
    started: session.Session,
) -> None:
    channel.record_host(HostResult("gpu-01", "config-patch", State.CHANGED, "patched"))
    click = widgets.Click("Apply", datetime.now(timezone.utc), 1.5, "ops", Result(True, KEY))
    started.note_click(click)
    filed = started.file()
    assert filed.ok and started.filed
    summary = json.loads((started.folder / "summary.json").read_text())
    assert summary["results"][0]["state"] == "changed" and "1 click(s)" in summary["message"]
    assert KEY not in (started.folder / session.CLICKS).read_text()
    assert (started.folder / "index.html").exists()
    assert not started.folder.stat().st_mode & 0o222
    assert JOURNAL_ENV not in os.environ and channel.OUTCOME_ENV not in os.environ
    assert started.file().message.startswith("already filed")


def test_a_click_is_recorded_with_time_user_and_result(monkeypatch) -> None:
    refreshed: list[int] = []
    gate = widgets.Gate("Stop", lambda: Result(True, "stopped"), after=lambda: refreshed.append(1))
    entry = gate.click()
    assert entry.result.message == "stopped" and refreshed == [1]
    assert gate.history == [entry]
    assert "clicked 'Stop': done in" in entry.line() and " UTC " in entry.line()
    assert "clicked <i>Stop</i>" in entry._repr_html_()


def test_a_failing_step_is_recorded_as_failed_not_raised() -> None:
    def broken() -> Result:
        raise RuntimeError("no route")

    entry = widgets.Gate("Start", broken).click()
    assert not entry.result.ok and "RuntimeError: no route" in entry.line()


def test_an_unavailable_button_says_why() -> None:
    page = widgets._Page([], "no host would change")
    assert repr(page) == "nothing to do: no host would change"
    assert "nothing to do: no host would change" in page._repr_html_()


def test_library_displays_mask_a_foreign_api_key() -> None:
    from opsbook.core.results import Table

    table = Table(["pid", "command line"], [[1, f"vllm serve m --api-key {KEY}"]])
    assert KEY not in str(table) and KEY not in table._repr_html_()
    assert "--api-key ***" in str(table)
