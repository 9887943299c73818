import contextlib
import dataclasses
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

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


def _thread_niceness(pid: int) -> dict[int, int]:
    """Each thread of a process and its nice value (Linux keeps one per thread)."""
    found = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            found[int(task.name)] = int((task / "stat").read_text().rsplit(")", 1)[1].split()[16])
    return found


def test_html_copies_are_made_by_a_private_helper_that_warms_up_at_low_priority(tmp_path) -> None:
    import nbformat

    notebook = tmp_path / "00_preflight.ipynb"
    nbformat.write(
        nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("a verdict")]), notebook
    )
    ours = os.getpriority(os.PRIO_PROCESS, 0)
    exports = records.HtmlExports()
    try:
        exports.start()
        helper = exports._proc
        assert helper is not None
        seen: dict[int, int] = {}
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # the warm-up thread lives 0.5 s or more
            now = _thread_niceness(helper.pid)
            for tid, nice in now.items():
                seen[tid] = max(seen.get(tid, nice), nice)
            others = [tid for tid in seen if tid != helper.pid]
            if others and (max(seen[t] for t in others) > ours or not set(others) & set(now)):
                break  # seen niced, or come and gone
        page = exports.export(notebook)
        assert helper.poll() is None  # it serves the next export too
        exporting = _thread_niceness(helper.pid)[helper.pid]
        assert exports.export(tmp_path / "gone.ipynb") is None
    finally:
        exports.close()
    assert page == notebook.with_suffix(".html")
    assert "a verdict" in page.read_text()
    assert page.stat().st_mode & 0o777 == 0o600
    # nbconvert's import yields to the stages; the export the run's end waits for does not.
    warm = [nice for tid, nice in seen.items() if tid != helper.pid]
    assert warm == [min(ours + records.EXPORTER_NICENESS, 19)]
    assert exporting == ours
    assert helper.returncode == 0  # it ended when its input did


def test_the_helper_warms_up_on_a_valid_notebook_with_what_a_stage_s_record_has() -> None:
    import nbformat

    warmed: list[Any] = []
    thread = threading.Thread(target=records._warm_exporter, args=(warmed,))
    thread.start()  # niced: its own thread, not the test's
    thread.join()
    assert len(warmed) == 1  # an exporter to reuse; a sample it failed on would leave none
    sample = records._warm_up_notebook()
    nbformat.validate(sample)
    kinds = {(c.cell_type, o.output_type) for c in sample.cells for o in c.get("outputs", [])}
    assert kinds == {("code", "stream"), ("code", "display_data")}
    assert {"markdown", "code"} == {c.cell_type for c in sample.cells}


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


# -- what a ticket takes: diffs, the notebooks' HTML, the journal ----------------------------

PLAN = (
    "--- a/config.json\n"
    "+++ b/config.json\n"
    "@@ -1,4 +1,3 @@\n"
    ' {\n-  "kv_cache_scheme": "fp8",\n'
    "-- a removed line that reads like a file header\n"
    '+  "kv_cache_scheme": null\n'
    " }\n"
    "\\ No newline at end of file\n"
)


def test_a_diff_is_shown_monospace_with_added_removed_and_hunk_lines_coloured() -> None:
    from opsbook.core.diffs import Diff, line_kinds

    kinds = [kind for kind, _ in line_kinds(PLAN)]
    assert kinds == [
        "file", "file", "hunk", "context", "removed", "removed", "added", "context", "other"
    ]  # fmt: skip
    diff = Diff(PLAN, "config patch of /models/m")
    page = diff._repr_html_()
    assert page.startswith('<pre class="opsbook-diff"') and "monospace" in page
    lines = page.split("</span>")
    assert "color:#0550ae" in lines[2] and "@@ -1,4 +1,3 @@" in lines[2]
    assert "color:#82071e" in lines[4] and "&quot;kv_cache_scheme&quot;: &quot;fp8" in lines[4]
    assert "color:#82071e" in lines[5]  # "-- a removed line" is no file header
    assert "color:#116329" in lines[6] and "null" in lines[6]
    # What the notebook's text/plain output (compared by nbval) and the record hold: the diff.
    assert repr(diff) == str(diff) == PLAN


def test_a_diff_in_the_terminal_is_coloured_only_when_asked() -> None:
    from opsbook.core.diffs import diff_terminal

    assert diff_terminal(PLAN) == PLAN.rstrip("\n")
    coloured = diff_terminal(PLAN, colour=True).splitlines()
    assert coloured[2] == "\033[36m@@ -1,4 +1,3 @@\033[0m"
    assert coloured[4].startswith("\033[31m-") and coloured[6].startswith("\033[32m+")
    assert coloured[3] == " {"  # context as it is


def test_the_diffs_a_stage_shows_are_kept_in_its_results_with_secrets_masked(
    tmp_path, monkeypatch
) -> None:
    from opsbook.core import channel
    from opsbook.core.deployment import parse_deployment
    from opsbook.core.diffs import Diff
    from opsbook.core.results import Result
    from opsbook.remote.hosts import HostGroup
    from opsbook.remote.testing import FakeHost
    from opsbook.stages.base import Note, Report, Stage, run_stage

    secret = "Zq8secretvalue0123456789"
    dep = parse_deployment(
        {
            "model": {"path": "/models/m"},
            "server": {"port": 8000, "env": {"VLLM_API_KEY": secret}},
            "hosts": [{"address": "a", "user": "ops"}],
        }
    )

    def planned(host, dep, options) -> Report:
        shown = [Note("a plan"), Diff(f"+key={secret}\n", "the plan"), Diff("-x\n+y\n")]
        return Report(State.WOULD_CHANGE, Result(True, "would change"), shown)

    results = tmp_path / "02_x.results.jsonl"
    monkeypatch.setenv(channel.OUTCOME_ENV, str(results))
    stage = Stage("plan", "02_x", True, planned)
    run = run_stage(stage, dep, group=HostGroup([FakeHost("a")]), on_result=None)
    assert [r.state for r in run.results] == [State.WOULD_CHANGE]
    diffs = channel.read_diffs(results)
    where = [(d.host, d.stage, d.title) for d in diffs]
    assert where == [("ops@a", "plan", "the plan"), ("ops@a", "plan", "")]
    assert diffs[0].text == "+key=***\n" and secret not in results.read_text()
    # The results still read as before, diff lines aside, and a follower passes them on typed.
    assert [r.host for r in channel.read(results)] == ["ops@a"]
    kinds = {type(r).__name__ for r in channel.Follower(results).new()}
    assert kinds == {"HostResult", "StageDiff"}


def test_records_show_diff_prints_each_stage_s_diffs_and_says_when_there_are_none(
    tmp_path, monkeypatch, capsys
) -> None:
    from opsbook import cli
    from opsbook.core import channel

    folder = tmp_path / "20260101T000000Z-deploy-x"
    (folder / "batch-01").mkdir(parents=True)
    (folder / "summary.json").write_text(json.dumps({"status": "ok", "exit_code": 0}))
    for name, stage, title in (
        ("02_config_patch", "config-patch", "config patch of /models/m"),
        ("03_launch_script", "launch-script", "launch script /h/launch.sh"),
    ):
        results = folder / "batch-01" / f"{name}.results.jsonl"
        monkeypatch.setenv(channel.OUTCOME_ENV, str(results))
        channel.record_diff(channel.StageDiff("ops@a", stage, title, PLAN))
    shown = records.describe_diffs(folder)
    assert shown.startswith("config-patch on ops@a: config patch of /models/m\n--- a/config")
    assert "\n\nlaunch-script on ops@a: launch script /h/launch.sh\n--- a/config" in shown
    assert "\033[" not in shown and "\033[32m+" in records.describe_diffs(folder, colour=True)

    assert cli.main(["records", "show", str(folder), "--diff"]) == 0
    assert capsys.readouterr().out == shown + "\n"
    empty = tmp_path / "20260101T000001Z-00_preflight-a"
    empty.mkdir()
    (empty / "run.json").write_text(json.dumps({"status": "ok", "exit_code": 0}))
    assert "recorded no diff" in records.describe_diffs(empty)
    with pytest.raises(RunError):
        records.describe_diffs(tmp_path / "nothing")


def executed_notebook(path) -> None:
    """A stage notebook as papermill leaves it: the banner, the parameters (as written and as
    injected), the form's and the buttons' code with their outputs."""
    import nbformat

    v4 = nbformat.v4
    banner = v4.new_markdown_cell(
        "> **Example output from the rehearsal host** (`make notebooks`), not from your host."
    )
    params = v4.new_code_cell("deployment = 'default.yml'", metadata={"tags": ["parameters"]})
    injected = v4.new_code_cell(
        "deployment = 'prod.yml'\napply = True", metadata={"tags": ["injected-parameters"]}
    )
    form = v4.new_code_cell("form = widgets.DeploymentForm(deployment)")
    buttons = v4.new_code_cell("restart = widgets.Button(description='Restart')\ndisplay(restart)")
    buttons.outputs = [v4.new_output("display_data", {"text/html": "<b>launch on 1 host: ok</b>"})]
    hidden = v4.new_code_cell("print('x')", metadata={"tags": ["remove-cell"]})
    title = v4.new_markdown_cell("# 04 · Launch")
    nb = v4.new_notebook(cells=[title, banner, params, injected, form, buttons, hidden])
    nbformat.write(nb, path)


def test_the_html_copy_keeps_parameters_and_outputs_without_button_code_or_banner(
    tmp_path,
) -> None:
    notebook = tmp_path / "04_launch.ipynb"
    executed_notebook(notebook)
    before = notebook.read_bytes()
    page = records.export_html(notebook)
    assert page is not None
    text = page.read_text()
    assert "04 · Launch" in text and "launch on 1 host: ok" in text
    assert "default.yml" in text and "prod.yml" in text  # the parameters' code
    for gone in ("DeploymentForm", "Restart", "Example output", "print("):
        assert gone not in text, gone
    assert notebook.read_bytes() == before  # the executed notebook is the record: untouched


def test_records_show_lists_the_journal_whole_and_in_time_order(tmp_path) -> None:
    from opsbook.remote.journal import JournalEntry

    folder = tmp_path / "20260101T000000Z-04_launch-a"
    folder.mkdir()
    (folder / "run.json").write_text(json.dumps({"status": "ok", "exit_code": 0}))
    long_command = "bash -lc " + " ".join(f"--flag-{n}=value-{n}" for n in range(40))

    def entry(host: str, kind: str, command: str, code: int, took: float, at: str):
        return JournalEntry(host, kind, command, code, took, "", "", f"2026-01-01T00:00:{at}+00:00")

    entries = [  # as written: each when its command ended, from two hosts' threads
        entry("b", "run", long_command, 0, 2.5, "01.000"),
        entry("a", "run", "line one\nline two", 1, 0.2, "00.500"),
        entry("a", "upload", "sftp put /h/x (3 bytes, mode 644)", 0, 0.1, "03.000"),
    ]
    (folder / "journal.jsonl").write_text(
        "".join(json.dumps(dataclasses.asdict(e)) + "\n" for e in entries)
    )
    lines = records.describe_run(folder).splitlines()
    start = lines.index("JOURNAL (3 operation(s), in time order, UTC)")
    journal = lines[start + 1 : start + 7]
    assert journal[0].startswith("00:00:00.500  a  read   exit 1  0.20 s  line one")
    assert journal[1:3] == ["    line one", "    line two"]
    assert journal[3].startswith("00:00:01.000  b  read   exit 0  2.50 s")
    assert journal[4] == "    " + long_command  # whole, not cut
    assert journal[5].startswith("00:00:03.000  a  write  exit 0  0.10 s  sftp put /h/x")


def test_sessions_filed_or_not_and_headless_runs_are_listed_with_kind_user_and_deployments(
    tmp_path, monkeypatch
) -> None:
    from datetime import datetime, timezone

    from opsbook import widgets
    from opsbook.core import channel
    from opsbook.core.deployment import load_deployment
    from opsbook.core.results import HostResult, Result, State
    from opsbook.runner import session

    for name in (channel.JOURNAL_ENV, channel.OUTCOME_ENV):
        monkeypatch.delenv(name, raising=False)
    runs = tmp_path / "runs"
    dry, applied = runs / "20260101T000000Z-02_config_patch-h", runs / "20260101T000001Z-deploy-h"
    for folder, doc in [
        (dry, {"notebook": "02_config_patch.ipynb", "status": "problem found", "exit_code": 1,
               "parameters": {"deployment": "/d/prod.yml"}}),
        (applied, {"notebook": "deploy", "status": "ok", "exit_code": 0, "duration": 61.0,
                   "parameters": {"deployment": "/d/prod.yml", "apply": "True"}}),
    ]:  # fmt: skip
        folder.mkdir(parents=True)
        (folder / "run.json").write_text(json.dumps(doc))
    path = tmp_path / "lab.yml"
    path.write_text("hosts: [gpu-01]\nmodel: {path: /m}\nserver: {port: 8000}\n")
    open_one = session.start("04_launch", load_deployment(path), str(path), {}, str(runs))
    channel.record_host(HostResult("gpu-01", "launch", State.FAILED, "not running"))
    now = datetime.now(timezone.utc)
    click = widgets.Click("Start", now, 3.0, "ops", Result(True, "started"), ("gpu-01",))
    open_one.note_click(click)
    channel.record_host(HostResult("gpu-01", "launch", State.OK, "ready"))
    rows = {r["run"]: r for r in records.list_runs(runs).records()}
    assert rows[dry.name]["kind"] == "headless, dry run"  # 02's apply left at False
    assert rows[applied.name]["kind"] == "headless" and rows[applied.name]["took"] == "61 s"
    assert rows[applied.name]["deployment"] == "prod.yml"
    mine = rows[open_one.folder.name]
    assert mine["kind"] == "interactive, not filed" and mine["status"] == "ok"
    assert mine["user"] == open_one.user and mine["deployment"] == "lab.yml"
    shown = records.describe_run(open_one.folder)
    assert "interactive, not filed" in shown.splitlines()[0]
    assert "host(s): gpu-01" in shown and "last click 'Start' done" in shown
    assert records.show_run(open_one.folder)["filed"] is False
    open_one.file()
    filed = records.list_runs(runs).records()[0]
    assert filed["run"] == open_one.folder.name and filed["kind"] == "interactive"
    assert filed["status"] == "ok" and filed["user"] == open_one.user


def test_a_dry_run_is_labelled_on_its_index_page_and_in_its_summary() -> None:
    from dataclasses import replace

    applied = summary()
    dry = replace(applied, dry_run=True)
    assert records.DRY_RUN_NOTE in records.index_page(dry)
    assert records.DRY_RUN_NOTE not in records.index_page(applied)
    assert records.summary_doc(dry)["dry_run"] is True


def test_summary_holds_the_metrics_summaries_the_stages_recorded(tmp_path, monkeypatch) -> None:
    from opsbook.core import channel

    monkeypatch.setenv(channel.OUTCOME_ENV, str(tmp_path / "05_diagnose.results.jsonl"))
    channel.record_metrics(channel.StageMetrics("a", "launch", "ready", {"running": 0.0}))
    channel.record_metrics(channel.StageMetrics("a", "diagnose", "end", {"running": 2.0}))
    records.write_summary(tmp_path, summary())
    doc = json.loads((tmp_path / "summary.json").read_text())
    assert doc["metrics"] == [
        {"host": "a", "stage": "launch", "moment": "ready", "summary": {"running": 0.0}},
        {"host": "a", "stage": "diagnose", "moment": "end", "summary": {"running": 2.0}},
    ]


def test_a_run_without_metrics_summaries_has_no_metrics_key(tmp_path) -> None:
    records.write_summary(tmp_path, summary())
    assert "metrics" not in json.loads((tmp_path / "summary.json").read_text())


def test_the_qualification_verdict_is_in_the_summary_and_on_the_index_page(tmp_path) -> None:
    from opsbook.steps import qualify_receipt as receipts
    from tests.unit.test_qualify_gate import receipt

    failed = receipt(
        80.0, host="a", passed=False, compared_with="runs/one",
        findings=[
            {"severity": "error", "code": "qualify-decode-regression", "message": "slow"},
            {"severity": "info", "code": "qualify-other-fingerprint", "message": "other"},
        ],
    )  # fmt: skip
    receipts.write_receipt(tmp_path / "batch-01", failed)
    run = dataclasses.replace(
        summary(),
        stages=["preflight", "qualify"],
        results=[
            HostResult("a", "qualify", State.FAILED, "qualification failed: cell 128 x 1"),
            HostResult("b", "qualify", State.SKIPPED, "busy: 1 request(s) running"),
            HostResult("b", "preflight", State.OK, "8 GPUs"),
        ],
    )
    records.write_summary(tmp_path, run)
    doc = json.loads((tmp_path / "summary.json").read_text())
    assert doc["qualification"] == {
        "a": {
            "verdict": "failed",
            "message": "qualification failed: cell 128 x 1",
            "profile": "quick",
            "compared_with": "runs/one",
            "problems": ["qualify-decode-regression"],
            "best_output_tok_s": 80.0,
            "receipt": "batch-01/qualify/receipt.json",
        },
        "b": {"verdict": "skipped", "message": "busy: 1 request(s) running"},
    }
    page = (tmp_path / "index.html").read_text()
    section = page.split("<h2>Qualification</h2>")[1].split("<h2>")[0]
    row_a = section.split("<th style='text-align:left'>a</th>")[1].split("</tr>")[0]
    assert "href='batch-01/qualify/receipt.json'>failed</a>" in row_a
    assert "<td>80.0</td>" in row_a and "qualify-decode-regression" in row_a
    assert "runs/one" in row_a
    row_b = section.split("<th style='text-align:left'>b</th>")[1].split("</tr>")[0]
    assert ">skipped<" in row_b and "busy: 1 request(s) running" in row_b


def test_a_run_without_qualification_has_no_verdict_nor_its_section(tmp_path) -> None:
    records.write_summary(tmp_path, summary())
    assert "qualification" not in json.loads((tmp_path / "summary.json").read_text())
    assert "Qualification" not in (tmp_path / "index.html").read_text()
