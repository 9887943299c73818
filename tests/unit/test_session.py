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
from opsbook.widgets import gates

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
    page = gates._Page([], "no host would change")
    assert repr(page) == "nothing to do: no host would change"
    assert "nothing to do: no host would change" in page._repr_html_()


def test_library_displays_mask_a_foreign_api_key() -> None:
    from opsbook.core.results import Table

    table = Table(["pid", "command line"], [[1, f"vllm serve m --api-key {KEY}"]])
    assert KEY not in str(table) and KEY not in table._repr_html_()
    assert "--api-key ***" in str(table)


# -- a session is a record from its first cell ------------------------------------------------


@pytest.fixture
def shell(started: session.Session):
    """A real IPython shell whose cells the session records (as the form has it do)."""
    from IPython.core.interactiveshell import InteractiveShell

    found = InteractiveShell.instance()
    started.record_cells(found)
    yield found
    started.stop_recording_cells()
    InteractiveShell.clear_instance()


def test_every_cell_is_written_as_it_runs_with_its_outputs_redacted(
    started: session.Session, shell
) -> None:
    from opsbook.runner import cells

    shell.run_cell(f"print('key {KEY}')", store_history=True)
    shell.run_cell("from IPython.display import display, HTML\n"
                   "h = display(HTML('<b>before</b>'), display_id=True)\n1 + 1",
                   store_history=True)  # fmt: skip
    shell.run_cell("raise ValueError('no route')", store_history=True)
    # A button's record, drawn again after a click.
    shell.run_cell("h.update(HTML('<b>after</b>'))", store_history=True)
    written = cells.read_cells(started.folder)
    assert [c["execution_count"] for c in written] == [1, 2, 3, 4]
    first, second, third, _ = written
    assert first["outputs"] == [{"output_type": "stream", "name": "stdout", "text": "key ***\n"}]
    assert KEY not in (started.folder / cells.CELLS).read_text()
    assert second["outputs"][0]["data"]["text/html"] == "<b>after</b>"
    assert second["outputs"][1]["data"]["text/plain"] == "2"
    assert not third["ok"] and third["outputs"][0]["ename"] == "ValueError"
    import nbformat

    nb = nbformat.read(started.folder / cells.NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    assert [c.source for c in nb.cells][0] == "print('key ***')"
    assert nb.cells[1].outputs[0]["data"]["text/html"] == "<b>after</b>"


def test_a_dead_kernel_leaves_the_cells_run_so_far(started: session.Session, shell) -> None:
    shell.run_cell("x = 41", store_history=True)
    shell.run_cell("x + 1", store_history=True)
    # No filing, no shutdown: what is on disk is the record.
    header = session.session_doc(started.folder)
    assert header is not None and header["filed"] is False
    text = (started.folder / "session.ipynb").read_text()
    assert '"x + 1"' in text and '"42"' in text


def test_filing_stops_recording_and_puts_the_shell_back(started: session.Session, shell) -> None:
    from opsbook.runner import cells

    shell.run_cell("1", store_history=True)
    recorder = started.recorder
    assert recorder is not None
    started.file()
    assert recorder.post_run_cell not in shell.events.callbacks["post_run_cell"]
    assert "publish" not in vars(shell.display_pub) and "_showtraceback" not in vars(shell)
    assert "write_format_data" not in vars(shell.displayhook)
    # Nothing written into the sealed folder, nothing raised.
    shell.run_cell("2", store_history=True)
    assert len(cells.read_cells(started.folder)) == 1


def test_a_switched_deployment_and_its_hosts_join_the_record(
    started: session.Session, tmp_path: Path
) -> None:
    other = tmp_path / "fleet.yml"
    other.write_text("hosts: [gpu-02, gpu-03]\nmodel: {path: /m}\nserver: {port: 8000}\n")
    started.touch(load_deployment(other), str(other))
    header = json.loads((started.folder / session.HEADER).read_text())
    assert header["deployments"] == [str(tmp_path / "d.yml"), str(other)]
    assert header["hosts"] == ["gpu-01", "gpu-02", "gpu-03"]
    assert header["deployment"] == str(tmp_path / "d.yml")  # the first, as the folder's name


def test_a_click_records_its_hosts(started: session.Session) -> None:
    now = datetime.now(timezone.utc)
    started.note_click(widgets.Click("Restart", now, 2.0, "ops", Result(True, "ok"), ("gpu-01",)))
    assert json.loads((started.folder / session.CLICKS).read_text())["hosts"] == ["gpu-01"]


def test_the_status_is_the_state_at_the_end_not_the_first_look(started: session.Session) -> None:
    now = datetime.now(timezone.utc)
    channel.record_host(HostResult("gpu-01", "launch", State.FAILED, "not running"))
    started.note_click(widgets.Click("Start", now, 9.0, "ops", Result(True, "started")))
    channel.record_host(HostResult("gpu-01", "launch", State.OK, "ready"))
    assert session.outcome(started.folder, started.notebook, "ops")[0] == 0
    started.file()
    summary = json.loads((started.folder / "summary.json").read_text())
    assert summary["status"] == "ok" and summary["exit_code"] == 0


def test_a_failed_last_click_or_a_broken_host_at_the_end_is_a_problem(
    started: session.Session,
) -> None:
    now = datetime.now(timezone.utc)
    channel.record_host(HostResult("gpu-01", "launch", State.OK, "ready"))
    started.note_click(widgets.Click("Restart", now, 9.0, "ops", Result(False, "timed out")))
    code, message = session.outcome(started.folder, started.notebook, "ops")
    assert code == 1 and "last click 'Restart' FAILED" in message
    started.note_click(widgets.Click("Restart", now, 9.0, "ops", Result(True, "ok")))
    channel.record_host(HostResult("gpu-01", "launch", State.FAILED, "crashed"))
    assert session.outcome(started.folder, started.notebook, "ops")[0] == 1


def test_a_redraw_outside_any_cell_reaches_the_notebook_once_the_click_is_done(
    started: session.Session, shell
) -> None:
    from IPython.display import HTML

    shell.run_cell(
        "from IPython.display import display, HTML\n"
        "record = display(HTML('not clicked yet'), display_id=True)",
        store_history=True,
    )
    # A button's callback runs in no cell: it redraws the record under the button.
    shell.user_ns["record"].update(HTML("clicked <i>Start</i>"))
    started.save_notebook()
    import nbformat

    nb = nbformat.read(started.folder / "session.ipynb", as_version=4)
    assert nb.cells[0].outputs[0]["data"]["text/html"] == "clicked <i>Start</i>"


def test_cells_run_before_the_session_are_written_first_marked_backfilled(
    started: session.Session,
) -> None:
    import nbformat
    from IPython.core.interactiveshell import InteractiveShell

    from opsbook.runner import cells

    shell = InteractiveShell.instance()
    try:
        # Before the form is drawn: a value, a print (IPython keeps no print), a result with
        # a secret in it, a cell that raised.
        for source in ("x = 41", "print('hello')", "x + 1", f"'{KEY}'", "1 / 0"):
            shell.run_cell(source, store_history=True)
        started.record_cells(shell)
        shell.run_cell("x * 2", store_history=True)
        written = cells.read_cells(started.folder)
        assert [c["execution_count"] for c in written] == [1, 2, 3, 4, 5, 6]
        assert [bool(c.get("backfilled")) for c in written] == [True] * 5 + [False]
        assert [c["source"] for c in written[:3]] == ["x = 41", "print('hello')", "x + 1"]
        assert written[1]["outputs"] == []  # what it printed, IPython did not keep
        assert written[2]["outputs"][0]["data"]["text/plain"] == "42"
        assert written[2]["outputs"][0]["execution_count"] == 3
        assert KEY not in (started.folder / cells.CELLS).read_text()
        assert written[3]["source"] == "'***'" and written[4]["ok"] is None
        assert written[5]["outputs"][0]["data"]["text/plain"] == "82" and written[5]["ok"]
        nb = nbformat.read(started.folder / cells.NOTEBOOK, as_version=4)
        nbformat.validate(nb)
        note, *code = nb.cells
        assert note.cell_type == "markdown" and cells.BACKFILLED_NOTE in note.source
        assert [c.metadata.get("opsbook", {}).get("backfilled") for c in code] == [
            True, True, True, True, True, None,
        ]  # fmt: skip
        # A later session of the same kernel begins after what this one recorded.
        started.file()
        shell.run_cell("y = 1", store_history=True)
        runs = str(started.folder.parent)
        dep = load_deployment(started.deployment)
        again = session.start("02_config_patch", dep, started.deployment, {}, runs_dir=runs)
        again.record_cells(shell)
        shell.run_cell("y + 1", store_history=True)
        again.stop_recording_cells()
        recorded = cells.read_cells(again.folder)
        assert [(c["source"], bool(c.get("backfilled"))) for c in recorded] == [
            ("y = 1", True), ("y + 1", False),
        ]  # fmt: skip
    finally:
        started.stop_recording_cells()
        InteractiveShell.clear_instance()


def test_in_a_real_kernel_the_record_begins_at_its_first_cell(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real ipykernel, as JupyterLab runs one: the parameters and three more cells, then the
    form's cell (which starts the session), then one more; the record holds all six, in order."""
    from jupyter_core.utils import run_sync

    from opsbook.runner import cells
    from opsbook.runner.kernel import quiet_kernel_manager

    path = tmp_path / "d.yml"
    path.write_text("hosts: [gpu-01]\nmodel: {path: /m}\nserver: {port: 8000}\n")
    runs = tmp_path / "runs"
    monkeypatch.setenv(channel.RUNS_DIR_ENV, str(runs))
    monkeypatch.delenv(channel.HEADLESS_ENV, raising=False)
    for name in (JOURNAL_ENV, channel.OUTCOME_ENV):
        monkeypatch.delenv(name, raising=False)
    manager = quiet_kernel_manager(tmp_path / "kernel.log")(kernel_name="python3")
    run_sync(manager.start_kernel)()
    client = manager.client()
    client.start_channels()
    try:
        run_sync(client.wait_for_ready)(timeout=60)
        form = (
            "from opsbook import widgets\n"
            f"form = widgets.DeploymentForm({str(path)!r}, notebook='02_config_patch', "
            "namespace=globals())\nform"
        )
        parameters = (
            "hosts = []\nforks = 10\napply = False\nrestore = False\nvllm_version = ''\n"
            "gpu_memory_utilization = 0.9"
        )
        sources = [parameters, "x = 41", f"print('before the form {KEY}')", "x + 1", form, "x * 2"]
        for source in sources:
            reply = run_sync(client.execute_interactive)(source, timeout=60)
            assert reply["content"]["status"] == "ok", reply["content"]
    finally:
        client.stop_channels()
        run_sync(manager.shutdown_kernel)(now=True)
    (folder,) = runs.glob("*-session-02_config_patch-gpu-01")
    written = cells.read_cells(folder)
    assert [c["execution_count"] for c in written] == [1, 2, 3, 4, 5, 6]
    assert [bool(c.get("backfilled")) for c in written] == [True] * 4 + [False] * 2
    assert [c["source"] for c in written] == [
        parameters, "x = 41", "print('before the form ***')", "x + 1", form, "x * 2",
    ]  # fmt: skip
    assert written[3]["outputs"][0]["data"]["text/plain"] == "42"
    assert written[4]["outputs"]  # the session's header, the form, the filing button
    assert written[5]["outputs"][0]["data"]["text/plain"] == "82"
    assert KEY not in (folder / cells.CELLS).read_text()
    saved = (folder / cells.NOTEBOOK).read_text()
    assert cells.BACKFILLED_NOTE in saved and saved.index('"x = 41"') < saved.index('"x * 2"')


def test_every_file_of_a_session_is_the_operators_alone(started: session.Session, shell) -> None:
    # As the README says of every run folder: 0600 while written, whatever the umask.
    from opsbook.runner import cells

    was = os.umask(0o022)
    try:
        shell.run_cell("1 + 1", store_history=True)
        Journal.from_env().record(
            host="gpu-01", kind="run", command="true", exit_code=0, duration=0.1
        )
        channel.record_host(HostResult("gpu-01", "config-patch", State.OK, "fine"))
        click = widgets.Click("Apply", datetime.now(timezone.utc), 1.5, "ops", Result(True, "x"))
        started.note_click(click)
        started.write_header()
    finally:
        os.umask(was)
    names = {p.name: p.stat().st_mode & 0o777 for p in started.folder.iterdir() if p.is_file()}
    for name in (session.HEADER, session.CLICKS, cells.CELLS, cells.NOTEBOOK):
        assert name in names, names
    assert started.journal.name in names and started.results_file.name in names
    assert {name: mode for name, mode in names.items() if mode != 0o600} == {}
