"""A deploy restarts only what changed (issue 29): `opsbook run deploy -p apply True` twice on
one rehearsal host leaves the server of the first alone the second time (its PID and log
untouched, launch ok), as the dry run between them said; a changed ``server.args`` value
restarts it, saying why. Before each apply that changes something, a dry run of the same
deploy says what it will do: on the fresh host, 02 would patch, 03 would write, 04 would
start; with the changed value, 03 would write the script and 04 would restart for the reason
the apply then gives. Once a deploy went through, the next one finds the host settled (issue
37): it says so and runs no stage, dry run or apply, unless told ``-p recheck true``."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from opsbook.rehearsal.sandbox import Sandbox
from tests.integration.conftest import rehearsal_host

pytestmark = pytest.mark.integration

ADDRESS = "127.0.9.29"


@dataclass
class Deployed:
    """One `opsbook run deploy`: its exit code, the launch stage's line, and the server's PID
    and log as they were when it ended."""

    code: int
    text: str
    launch: str
    pid: int | None
    log: bytes

    def state_of(self, stage: str) -> str:
        """The state the stage's (last) line gives."""
        lines = [line.split() for line in self.text.splitlines() if line.split()[:1] == [stage]]
        finished = [words for words in lines if words[2:3] != ["..."]]
        assert finished, self.text
        return "would change" if finished[-1][2] == "would" else finished[-1][2]


@pytest.fixture(scope="module")
def box() -> Iterator[Sandbox]:
    with rehearsal_host("restart", address=ADDRESS) as made:
        yield made


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("runs")


def deploy(box: Sandbox, runs: Path, deployment: Path, apply: str, *more: str) -> Deployed:
    argv = ["run", "deploy", "-f", str(deployment), "--runs-dir", str(runs), "-p", "apply", apply]
    argv += more
    done = subprocess.run(
        [sys.executable, "-m", "opsbook", *argv],
        capture_output=True,
        text=True,
        timeout=600,
    )
    text = done.stdout + done.stderr
    lines = [line for line in text.splitlines() if line.split()[:1] == ["launch"]]
    # The launch stage also prints its startup phases ("..."); its result is the last line.
    finished = [line for line in lines if line.split()[2:3] != ["..."]] or [""]
    paths = yaml.safe_load(deployment.read_text())["paths"]
    record = Path(paths["state"]) / "launch.json"
    pid = json.loads(record.read_text())["pid"] if record.exists() else None
    log = Path(paths["log"])
    return Deployed(
        done.returncode, text, finished[-1], pid, log.read_bytes() if log.exists() else b""
    )


def reason(launch: str) -> str:
    """Why a launch line's server is (or would be) restarted, in the words both runs use."""
    if "; restarted: " in launch:
        return launch.split("; restarted: ", 1)[1].strip()
    return launch.split("would restart the server: ", 1)[1].split("; apply=True")[0].strip()


def assert_only_requests_logged(before: bytes, after: bytes) -> None:
    """The log kept as it was: the same bytes, then only the access lines of the requests the
    checks made (uvicorn logs each, as vLLM's server does; 05 reads /health and /metrics): no
    stop, no start, no reload."""
    assert after.startswith(before)
    added = after[len(before) :].decode().splitlines()
    assert added, "the checks' /health requests are logged: the log is this launch's"
    checks = (' - "GET /health HTTP', ' - "GET /metrics HTTP')
    others = [line for line in added if not any(check in line for check in checks)]
    assert others == [], others


@pytest.fixture(scope="module")
def fresh_dry(box: Sandbox, runs: Path) -> Deployed:
    return deploy(box, runs, box.deployment_path, "false")


@pytest.fixture(scope="module")
def first(fresh_dry: Deployed, box: Sandbox, runs: Path) -> Deployed:
    return deploy(box, runs, box.deployment_path, "True")


# After the first deploy the host is settled: these two run every stage anyway (-p recheck
# true), to show what each stage finds.
@pytest.fixture(scope="module")
def dry(first: Deployed, box: Sandbox, runs: Path) -> Deployed:
    return deploy(box, runs, box.deployment_path, "false", "-p", "recheck", "true")


@pytest.fixture(scope="module")
def second(dry: Deployed, box: Sandbox, runs: Path) -> Deployed:
    return deploy(box, runs, box.deployment_path, "True", "-p", "recheck", "true")


@pytest.fixture(scope="module")
def settled_dry(second: Deployed, box: Sandbox, runs: Path) -> Deployed:
    return deploy(box, runs, box.deployment_path, "false")


@pytest.fixture(scope="module")
def settled(settled_dry: Deployed, box: Sandbox, runs: Path) -> Deployed:
    return deploy(box, runs, box.deployment_path, "True")


@pytest.fixture(scope="module")
def changed_file(settled: Deployed, box: Sandbox) -> Path:
    doc = yaml.safe_load(box.deployment_path.read_text())
    doc["server"]["args"]["max-model-len"] = doc["server"]["args"].get("max-model-len", 0) // 2
    made = box.dir / "changed-args.yml"
    made.write_text(yaml.safe_dump(doc))
    return made


@pytest.fixture(scope="module")
def changed_dry(changed_file: Path, box: Sandbox, runs: Path) -> Deployed:
    return deploy(box, runs, changed_file, "false")


@pytest.fixture(scope="module")
def changed(changed_dry: Deployed, changed_file: Path, box: Sandbox, runs: Path) -> Deployed:
    return deploy(box, runs, changed_file, "True")


def test_the_dry_run_on_a_fresh_host_says_each_stage_s_change_as_the_apply_makes_it(
    fresh_dry: Deployed, first: Deployed
) -> None:
    assert fresh_dry.code == 1, fresh_dry.text  # a dry run with something to change
    assert fresh_dry.pid is None  # nothing was started
    for stage in ("config-patch", "launch-script", "launch"):
        assert fresh_dry.state_of(stage) == "would change", fresh_dry.text
        assert first.state_of(stage) == "changed", first.text
    assert "would (re)start the server (now never started)" in fresh_dry.launch


def test_the_first_deploy_starts_the_server(first: Deployed) -> None:
    assert first.code == 0, first.text
    assert first.launch.split()[2] == "changed", first.launch
    assert "smoke test passed" in first.launch


def test_the_dry_run_of_a_ready_unchanged_server_says_it_is_left_alone(
    first: Deployed, dry: Deployed
) -> None:
    assert dry.code == 0, dry.text
    assert dry.launch.split()[2] == "ok", dry.launch
    assert "already running and ready; script, env, configs and engine unchanged since" in (
        dry.launch
    )
    assert dry.pid == first.pid
    assert_only_requests_logged(first.log, dry.log)


def test_a_dry_run_is_labelled_in_the_terminal_on_its_index_page_and_in_the_list(
    first: Deployed, dry: Deployed, runs: Path
) -> None:
    from opsbook.cli import DEPLOY_APPLIES, DEPLOY_DRY
    from opsbook.runner.records import DRY_RUN_NOTE

    assert DRY_RUN_NOTE in dry.text and DRY_RUN_NOTE not in first.text
    # Its first line says whether it changes the hosts (it does unless told not to).
    assert dry.text.startswith(DEPLOY_DRY) and first.text.startswith(DEPLOY_APPLIES)
    folder = next(
        line.split(": ", 1)[1] for line in dry.text.splitlines() if line.startswith("run folder: ")
    )
    assert DRY_RUN_NOTE in (Path(folder) / "index.html").read_text()
    listed = subprocess.run(
        [sys.executable, "-m", "opsbook", "records", "list", "--runs-dir", str(runs)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    row = next(line for line in listed.stdout.splitlines() if Path(folder).name in line)
    assert "headless, dry run" in row, listed.stdout


def test_the_second_deploy_leaves_the_server_alone_as_the_dry_run_said(
    first: Deployed, dry: Deployed, second: Deployed
) -> None:
    assert second.code == 0, second.text
    assert second.launch.split()[2] == "ok", second.launch
    said = dry.launch.split("already running and ready", 1)[1]
    assert second.launch.split("already running and ready", 1)[1] == said
    assert second.pid == first.pid
    assert_only_requests_logged(first.log, second.log)


def test_a_deploy_with_nothing_to_do_reads_the_hosts_facts_once(second: Deployed) -> None:
    # Preflight's reading serves 02_config_patch (issue 37), whose prediction still reads the
    # GPUs and the installed vLLM from it.
    folder = Path(
        next(line for line in second.text.splitlines() if line.startswith("run folder: ")).split(
            ": ", 1
        )[1]
    )
    journal = [json.loads(line) for line in (folder / "journal.jsonl").read_text().splitlines()]
    facts = [e for e in journal if e["command"].startswith("probe facts")]
    assert len(facts) == 1, [e["command"][:80] for e in journal]
    results = json.loads((folder / "summary.json").read_text())["results"]
    patch = next(r for r in results if r["stage"] == "config-patch")
    assert patch["state"] == "ok", patch
    assert re.search(r"vLLM \S+ uses \w+ on compute capability \d+\.\d+", patch["message"]), patch


def test_a_deploy_with_nothing_to_do_notes_the_launch_from_its_status_probe(
    second: Deployed,
) -> None:
    # The deployment's python answers for the record inside the launch's status probe, run
    # there once the server answers /health (issue 37): no command of its own.
    folder = Path(
        next(line for line in second.text.splitlines() if line.startswith("run folder: ")).split(
            ": ", 1
        )[1]
    )
    journal = [json.loads(line) for line in (folder / "journal.jsonl").read_text().splitlines()]
    commands = [e["command"] for e in journal]
    assert not any(c.startswith("the versions, launch script hash") for c in commands), commands
    host = next(iter(json.loads((folder / "facts.json").read_text())["hosts"].values()))
    assert host["engine"]["vllm"] and host["engine"]["engine_from"] == "the server's log", host
    assert "config.json" in host["model"]["configs"], host
    assert host["startup"]["kv_tokens"] and host["launch"]["script_digest"], host


def folder_of(done: Deployed) -> Path:
    line = next(line for line in done.text.splitlines() if line.startswith("run folder: "))
    return Path(line.split(": ", 1)[1])


@pytest.mark.parametrize("which", ["settled_dry", "settled"])
def test_a_settled_host_is_left_alone_with_one_status_and_no_stage(
    which: str, request: pytest.FixtureRequest, second: Deployed
) -> None:
    done: Deployed = request.getfixturevalue(which)
    assert done.code == 0, done.text
    lines = [line.split() for line in done.text.splitlines() if line.split()]
    stages = {"preflight", "download", "config-patch", "launch-script", "launch", "diagnose"}
    assert not [words for words in lines if words[0] in stages], done.text
    settled_line = next(line for line in done.text.splitlines() if line.startswith("settled "))
    nothing = "nothing would change" if which == "settled_dry" else "nothing to do"
    assert " ok " in settled_line and f"{nothing}: ready and unchanged since the deploy " in (
        settled_line
    ), settled_line
    assert done.pid == second.pid
    assert_only_requests_logged(second.log, done.log)
    folder = folder_of(done)
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["stages"] == ["settled"] and summary["notebooks"] == [], summary
    assert summary["parameters"]["recheck"] == "False", summary["parameters"]
    journal = [json.loads(line) for line in (folder / "journal.jsonl").read_text().splitlines()]
    probes = [e["command"] for e in journal if e["command"].startswith("probe ")]
    # The deploy lock's commands aside: one status of the server, and one read of /metrics
    # (a server with requests in flight and no token made is hung, /health 200 or not).
    assert len(probes) == 2, [p[:80] for p in probes]
    assert probes[0].startswith("probe launch ") and "'settled': {" in probes[0], probes[0]
    assert "'op': 'http'" in probes[1] and "'/metrics'" in probes[1], probes[1]


def test_a_changed_file_in_the_checkpoint_folder_unsettles_the_host(
    settled: Deployed, box: Sandbox, runs: Path
) -> None:
    config = Path(yaml.safe_load(box.deployment_path.read_text())["model"]["path"])
    touched = config / "generation_config.json"
    before = touched.stat()
    os.utime(touched, ns=(before.st_atime_ns, before.st_mtime_ns + 1_000_000_000))
    try:
        rerun = deploy(box, runs, box.deployment_path, "false")
    finally:
        os.utime(touched, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert rerun.code == 0, rerun.text
    assert "not settled: the checkpoint folder's files changed since the deploy " in rerun.text
    assert rerun.state_of("download") == "ok", rerun.text
    assert rerun.state_of("launch") == "ok", rerun.text


def test_a_changed_serve_argument_restarts_the_server_naming_why(
    second: Deployed, changed: Deployed
) -> None:
    assert changed.code == 0, changed.text
    assert changed.launch.split()[2] == "changed", changed.launch
    assert "smoke test passed" in changed.launch
    assert "restarted: launch script changed since" in changed.launch
    assert changed.pid != second.pid


def test_the_dry_run_of_a_changed_serve_argument_says_the_restart_and_its_reason(
    second: Deployed, changed_dry: Deployed, changed: Deployed
) -> None:
    assert changed_dry.code == 1, changed_dry.text
    assert changed_dry.state_of("config-patch") == "ok", changed_dry.text
    assert changed_dry.state_of("launch-script") == "would change", changed_dry.text
    # The launch looked at a server whose script is still the old one, and knew 03's change.
    assert changed_dry.state_of("launch") == "would change", changed_dry.text
    assert "(as 03_launch_script would write the launch script first)" in changed_dry.launch
    assert reason(changed_dry.launch) == reason(changed.launch), (
        changed_dry.launch,
        changed.launch,
    )
    assert reason(changed.launch).startswith("launch script changed since")
    assert changed_dry.pid == second.pid
    assert_only_requests_logged(second.log, changed_dry.log)


@pytest.fixture(scope="module")
def too_wide_file(changed: Deployed, changed_file: Path, box: Sandbox) -> Path:
    doc = yaml.safe_load(changed_file.read_text())
    doc["server"]["args"]["tensor-parallel-size"] = 64
    made = box.dir / "too-wide.yml"
    made.write_text(yaml.safe_dump(doc))
    return made


@pytest.fixture(scope="module")
def too_wide(too_wide_file: Path, box: Sandbox, runs: Path) -> Deployed:
    return deploy(box, runs, too_wide_file, "True")


def test_a_start_that_cannot_succeed_stops_the_deploy_at_preflight(
    changed: Deployed, too_wide: Deployed
) -> None:
    """Issue 32, item 1: more GPUs asked for than the host shows is known before anything is
    changed: preflight says so, and the healthy server keeps serving."""
    assert too_wide.code == 1, too_wide.text
    assert too_wide.state_of("preflight") == "failed", too_wide.text
    assert "needs 64 GPU(s) (tensor-parallel-size 64) and would see 8" in too_wide.text
    assert too_wide.pid == changed.pid
    assert_only_requests_logged(changed.log, too_wide.log)


def test_a_launch_that_cannot_succeed_leaves_the_healthy_server_alone(
    changed: Deployed, too_wide: Deployed, too_wide_file: Path, runs: Path
) -> None:
    """The launch stage on its own (here told to restart) checks the same before the stop."""
    argv = ["run", "04_launch", "-f", str(too_wide_file), "--runs-dir", str(runs)]
    argv += ["-p", "apply", "true", "-p", "restart", "always"]
    done = subprocess.run(
        [sys.executable, "-m", "opsbook", *argv], capture_output=True, text=True, timeout=600
    )
    text = done.stdout + done.stderr
    assert done.returncode == 1, text
    assert "nothing was stopped: the new server could not start: the server needs 64 GPU(s)" in text
    record = json.loads(
        (
            Path(yaml.safe_load(too_wide_file.read_text())["paths"]["state"]) / "launch.json"
        ).read_text()
    )
    assert record["pid"] == changed.pid
