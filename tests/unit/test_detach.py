"""``run --detach`` and ``records show --follow``: a detached run that ends before its folder
says why with its exit code; a followed run gives its results as they are written and ends
when the record is filed, with the run's exit code; a run that died unfiled is named."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from opsbook import cli
from opsbook.core import channel
from opsbook.core.exceptions import RunError
from opsbook.core.results import HostResult, State
from opsbook.runner import detach, records


def result(stage: str, state: State = State.OK) -> HostResult:
    return HostResult("local", stage, state, f"{stage} said")


def running_deploy(runs: Path, name: str = "20261206T100000Z-deploy-local") -> Path:
    folder = runs / name
    folder.mkdir(parents=True, mode=0o700)
    return folder


def file_deploy(folder: Path, exit_code: int) -> None:
    doc = {"notebook": "deploy", "status": "ok", "exit_code": exit_code, "message": "done"}
    (folder / "run.json").write_text(json.dumps(doc))
    (folder / "summary.json").write_text(json.dumps({**doc, "results": []}))
    records.close(folder)


def append(path: Path, *lines: str) -> None:
    with path.open("a") as f:
        f.write("".join(line + "\n" for line in lines))


def test_a_followed_run_gives_its_results_as_written_until_it_is_filed(tmp_path: Path) -> None:
    folder = running_deploy(tmp_path)
    append(folder / "00_preflight.results.jsonl", channel.encode(result("preflight")))

    def the_run_goes_on() -> None:
        time.sleep(0.3)
        progress = channel.StageProgress("local", "launch", 1.0, "loading")
        append(
            folder / "04_launch.results.jsonl",
            channel.encode_progress(progress),
            channel.encode(result("launch", State.CHANGED)),
        )
        time.sleep(0.3)
        # A deploy writes run.json before summary.json, and seals the folder last: not
        # filed before that.
        (folder / "run.json").write_text(json.dumps({"notebook": "deploy", "exit_code": 1}))
        time.sleep(0.3)
        file_deploy(folder, exit_code=1)

    writer = threading.Thread(target=the_run_goes_on)
    writer.start()
    seen = list(records.follow_run(folder, poll=0.05))
    writer.join()
    assert [(type(r).__name__, r.stage) for r in seen] == [
        ("HostResult", "preflight"),
        ("StageProgress", "launch"),
        ("HostResult", "launch"),
    ]
    assert cli.main(["records", "show", str(folder), "--follow"]) == 1


def test_an_amended_result_comes_again_only_when_its_line_changes(tmp_path: Path) -> None:
    folder = running_deploy(tmp_path)
    first = result("diagnose")
    changed = HostResult("local", "diagnose", State.FAILED, "differs from its peers")
    append(
        folder / "05_diagnose.results.jsonl",
        channel.encode(first),
        json.dumps({"kind": channel.AMEND, **json.loads(channel.encode(first))}),
        json.dumps({"kind": channel.AMEND, **json.loads(channel.encode(changed))}),
    )
    file_deploy(folder, exit_code=1)
    seen = list(records.follow_run(folder))
    assert [(r.state, r.message) for r in seen if isinstance(r, HostResult)] == [
        (State.OK, "diagnose said"),
        (State.FAILED, "differs from its peers"),
    ]


def test_a_detached_run_that_died_unfiled_is_named_with_its_console(tmp_path: Path) -> None:
    folder = running_deploy(tmp_path)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # reaped: its PID names no process now
    (folder / detach.DETACHED_FILE).write_text(json.dumps({"pid": gone.pid, "started": 1}))
    with pytest.raises(RunError, match="ended without filing its record") as raised:
        list(records.follow_run(folder, poll=0.05))
    assert detach.CONSOLE_LOG in (raised.value.remedy or "")


def test_a_live_detached_run_is_told_from_a_reused_pid(tmp_path: Path) -> None:
    me = {"pid": os.getpid(), "started": detach.start_ticks(os.getpid())}
    (tmp_path / detach.DETACHED_FILE).write_text(json.dumps(me))
    assert detach.detached_run_alive(tmp_path) is True
    reused = {**me, "started": (me["started"] or 0) + 1}
    (tmp_path / detach.DETACHED_FILE).write_text(json.dumps(reused))
    assert detach.detached_run_alive(tmp_path) is False
    assert detach.detached_run_alive(tmp_path / "none") is None


def test_following_no_folder_is_a_usage_error(tmp_path: Path, capsys) -> None:
    assert cli.main(["records", "show", str(tmp_path / "gone"), "--follow"]) == 2
    assert "is not a run folder" in capsys.readouterr().err


def test_last_when_following_is_a_detached_run_not_yet_filed(tmp_path: Path) -> None:
    older = running_deploy(tmp_path, "20261205T100000Z-deploy-local")
    file_deploy(older, exit_code=0)
    going = running_deploy(tmp_path, "20261206T100000Z-deploy-local")
    (going / detach.DETACHED_FILE).write_text("{}")
    assert records.newest_folder(tmp_path) == going
    assert records.newest_run(tmp_path) == older


def test_a_detached_run_that_ends_before_its_folder_says_why_with_its_exit_code(
    tmp_path: Path, capsys
) -> None:
    missing = tmp_path / "none.yml"
    code = cli.main(["run", "deploy", "-f", str(missing), "--runs-dir", str(tmp_path), "--detach"])
    assert code == 2
    assert f"deployment file {missing} does not exist" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_the_reporter_moves_the_output_into_the_folder_and_names_it(tmp_path: Path) -> None:
    # In a child of its own: the reporter points standard output and error at the folder.
    script = (
        "import os, sys; from pathlib import Path; from opsbook.runner import detach\n"
        "report = detach.folder_reporter(int(sys.argv[1]))\n"
        "print('before'); report(Path(sys.argv[2])); print('after')\n"
    )
    read_end, write_end = os.pipe()
    child = subprocess.Popen(
        [sys.executable, "-c", script, str(write_end), str(tmp_path)],
        pass_fds=(write_end,),
        stdout=subprocess.PIPE,
        text=True,
    )
    os.close(write_end)
    with os.fdopen(read_end) as report:
        named = report.read()
    out, _ = child.communicate(timeout=30)
    assert named == f"{tmp_path}\n" and out == "before\n"
    console = tmp_path / detach.CONSOLE_LOG
    assert console.read_text() == "after\n"
    assert oct(console.stat().st_mode & 0o777) == "0o600"
    assert json.loads((tmp_path / detach.DETACHED_FILE).read_text())["pid"] == child.pid
