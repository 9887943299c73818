import json
import os

import pytest

from opsbook.core.exceptions import RunError
from opsbook.core.results import HostResult, State
from opsbook.runner import records


def summary() -> records.RunSummary:
    results = [
        HostResult("a", "preflight", State.OK, "8 GPUs", duration=2.0),
        HostResult("b", "preflight", State.UNREACHABLE, "connection refused"),
        HostResult("a", "launch", State.FAILED, "crashed <x>", failure_id="oom"),
        HostResult("a", "diagnose", State.OK, "ready", script_sha256="ab" * 32),
        HostResult("b", "launch", State.SKIPPED, "not run: unreachable at preflight"),
    ]
    notebooks = [
        records.NotebookEntry(
            "preflight", "00_preflight.ipynb", "00_preflight.html", ("a", "b"), 4, "m", 2.0
        ),
        records.NotebookEntry("launch", "04_launch.ipynb", None, ("a",), 1, "m", 9.5),
    ]
    return records.RunSummary(
        name="rehearsal",
        deployment="d.yml",
        started="now",
        status="host unreachable",
        exit_code=4,
        message="m",
        duration=12.0,
        parameters={},
        hosts=["a", "b"],
        stages=["preflight", "launch", "diagnose"],
        results=results,
        notebooks=notebooks,
    )


def test_summary_holds_every_host_result_the_recap_and_the_script_versions(tmp_path) -> None:
    records.write_summary(tmp_path, summary())
    doc = json.loads((tmp_path / "summary.json").read_text())
    assert [(r["host"], r["stage"], r["state"]) for r in doc["results"]][:3] == [
        ("a", "preflight", "ok"),
        ("b", "preflight", "unreachable"),
        ("a", "launch", "failed"),
    ]
    assert doc["recap"]["a"] == {
        "ok": 2,
        "changed": 0,
        "failed": 1,
        "unreachable": 0,
        "skipped": 0,
        "exit_code": 1,
    }
    assert doc["recap"]["b"]["unreachable"] == 1 and doc["recap"]["b"]["exit_code"] == 4
    assert doc["script_versions"] == {"a": "ab" * 32, "b": ""}


def test_the_index_is_a_host_by_stage_grid_linking_the_notebooks(tmp_path) -> None:
    records.write_summary(tmp_path, summary())
    page = (tmp_path / "index.html").read_text()
    row_a = page.split("<th style='text-align:left'>a</th>")[1].split("</tr>")[0]
    assert row_a.count("<td class='state'") == 3
    assert (
        "href='00_preflight.html#host-a'>ok</a>" in row_a
        and "href='04_launch.ipynb'>failed</a>" in row_a
    )
    assert "crashed &lt;x&gt;" in page and "<x>" not in page
    row_b = page.split("<th style='text-align:left'>b</th>")[1].split("</tr>")[0]
    assert ">unreachable</a>" in row_b and ">skipped<" in row_b and "<td></td>" in row_b


def test_a_closed_run_folder_is_read_only(tmp_path) -> None:
    folder = tmp_path / "run"
    (folder / "sub").mkdir(parents=True)
    (folder / "run.json").write_text("{}")
    records.close(folder)
    for path in (folder, folder / "sub", folder / "run.json"):
        assert not os.stat(path).st_mode & 0o222
        assert not os.stat(path).st_mode & 0o077, "a sealed record is the operator's alone"
    assert [os.stat(p).st_mode & 0o777 for p in (folder, folder / "run.json")] == [0o500, 0o400]
    folder.chmod(0o755)  # let pytest clean up
    (folder / "sub").chmod(0o755)


def test_a_run_folder_is_private_while_it_is_written(tmp_path) -> None:
    from opsbook.runner import execution

    folder = execution.new_run_folder(tmp_path / "runs", "deploy", "gpu-01")
    with records.private_files():
        (folder / "journal.jsonl").write_text("{}")
    assert os.stat(folder).st_mode & 0o777 == 0o700
    assert os.stat(folder / "journal.jsonl").st_mode & 0o777 == 0o600


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


def test_overlapping_private_holds_from_two_threads_give_the_umask_back() -> None:
    # A deploy writes its run folder from the stage thread and the HTML-export thread at once;
    # holds that overlap (A in, B in, A out, B out) must not leave the private umask behind.
    import threading

    before = os.umask(0o022)
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()

    def a() -> None:
        with records.private_files():
            a_in.set()
            b_in.wait(5)
        a_out.set()

    def b() -> None:
        a_in.wait(5)
        with records.private_files():
            b_in.set()
            a_out.wait(5)

    threads = [threading.Thread(target=a), threading.Thread(target=b)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        now = os.umask(0o022)
        assert now == 0o022, oct(now)
    finally:
        os.umask(before)


def test_an_html_copy_of_a_notebook_deleted_with_its_run_folder_is_none(tmp_path) -> None:
    notebook = tmp_path / "gone" / "00_preflight.ipynb"
    assert records.export_html(notebook) is None
    assert not notebook.parent.exists()  # nothing made in its place


def test_html_copies_are_made_by_a_private_low_priority_helper(tmp_path) -> None:
    import nbformat

    notebook = tmp_path / "00_preflight.ipynb"
    nbformat.write(
        nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("a verdict")]), notebook
    )
    exports = records.HtmlExports()
    try:
        page = exports.export(notebook)
        helper = exports._proc
        assert helper is not None and helper.poll() is None  # started by the first export
        niceness = os.getpriority(os.PRIO_PROCESS, helper.pid) - os.getpriority(os.PRIO_PROCESS, 0)
        assert exports.export(tmp_path / "gone.ipynb") is None
    finally:
        exports.close()
    assert page == notebook.with_suffix(".html")
    assert "a verdict" in page.read_text()
    assert page.stat().st_mode & 0o777 == 0o600
    assert niceness == min(records.EXPORTER_NICENESS, 19 - os.getpriority(os.PRIO_PROCESS, 0))
    assert helper.returncode == 0  # it ended when its input did


def test_a_path_the_helper_cannot_take_is_exported_in_process(tmp_path) -> None:
    import nbformat

    folder = tmp_path / "a\nb"
    folder.mkdir()
    notebook = folder / "x.ipynb"
    nbformat.write(nbformat.v4.new_notebook(), notebook)
    exports = records.HtmlExports()
    try:
        assert exports.export(notebook) == notebook.with_suffix(".html")
    finally:
        exports.close()
    assert notebook.with_suffix(".html").exists()
