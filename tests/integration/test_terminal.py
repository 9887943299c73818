"""What `opsbook run deploy` says on the terminal, run as a user runs it on a fresh rehearsal
host: one line per stage as it ends, a recap, no kernel warning or traceback when all is
well; the nightly dry run of a healthy server (every stage, -p recheck true: the host is
settled after the deploy) exits 0; a failure names its remedy; the record
reads for people and pipes cleanly into `head`."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import struct
import subprocess
import termios
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from opsbook.rehearsal.sandbox import Sandbox
from tests.integration.conftest import OPSBOOK

pytestmark = pytest.mark.integration

ADDRESS = "127.0.5.20"
STAGES = ("preflight", "download", "config-patch", "launch-script", "launch", "diagnose")


@dataclass
class Said:
    """What one command printed, each line with the second it appeared at."""

    code: int
    lines: list[tuple[float, str]]
    took: float

    @property
    def text(self) -> str:
        return "\n".join(line for _, line in self.lines)

    def stage_line(self, stage: str) -> tuple[float, str]:
        found = [(t, line) for t, line in self.lines if line.split()[:1] == [stage]]
        # The launch stage also prints its startup phases ("..."); its result is the last.
        finished = [(t, line) for t, line in found if line.split()[2:3] != ["..."]]
        assert finished, f"no line for {stage} in:\n{self.text}"
        return finished[-1]


def say(*args: str) -> Said:
    """Run ``opsbook ARGS`` as a user does, reading its output line by line as it comes."""
    started = time.monotonic()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [*OPSBOOK, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    assert proc.stdout is not None
    lines = [(time.monotonic() - started, line.rstrip("\n")) for line in proc.stdout]
    code = proc.wait(timeout=300)
    return Said(code, lines, time.monotonic() - started)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("runs")


@pytest.fixture(scope="module")
def deployed(box: Sandbox, runs: Path) -> Said:
    return say("run", "deploy", "-f", str(box.deployment_path), "--runs-dir", str(runs))


@pytest.fixture(scope="module")
def nightly(deployed: Said, box: Sandbox, runs: Path) -> Said:
    assert deployed.code == 0, deployed.text
    return say(
        "run", "deploy", "-f", str(box.deployment_path), "--runs-dir", str(runs), "-p", "apply",
        "false", "-p", "recheck", "true",
    )  # fmt: skip


def test_deploy_prints_one_line_per_stage_and_a_recap(deployed: Said) -> None:
    assert deployed.code == 0, deployed.text
    states = {stage: deployed.stage_line(stage)[1].split()[2] for stage in STAGES}
    assert states == {
        "preflight": "ok",
        "download": "ok",
        "config-patch": "changed",
        "launch-script": "changed",
        "launch": "changed",
        "diagnose": "ok",
    }, deployed.text
    assert "smoke test passed" in deployed.stage_line("launch")[1]
    recap = deployed.text.split("RECAP\n", 1)[1].splitlines()[0]
    assert "ok=3" in recap and "changed=3" in recap and "failed=0" in recap, recap


def test_each_stage_line_appears_as_the_stage_ends_not_at_the_end(deployed: Said) -> None:
    first, _ = deployed.stage_line("preflight")
    last, _ = deployed.stage_line("diagnose")
    # Five more stages (each a kernel start) come after preflight's line.
    assert last - first > 3.0, deployed.text
    assert first < deployed.took - 3.0, deployed.text


def test_no_warning_or_traceback_when_all_is_well(deployed: Said, nightly: Said) -> None:
    for said in (deployed, nightly):
        noisy = [line for _, line in said.lines if "WARNING" in line or "Traceback" in line]
        assert noisy == [], said.text
        assert "IPKernelApp" not in said.text


def test_the_nightly_dry_run_of_a_healthy_server_exits_0(nightly: Said) -> None:
    assert nightly.code == 0, nightly.text
    for stage in STAGES:
        assert nightly.stage_line(stage)[1].split()[2] == "ok", nightly.text
    assert "already running and ready" in nightly.stage_line("launch")[1]
    assert "would change" not in nightly.text


def newest_summary(runs: Path) -> dict[str, Any]:
    folder = max(runs.glob("*-deploy-*"), key=lambda f: f.name)
    doc: dict[str, Any] = json.loads((folder / "summary.json").read_text())
    return doc


def test_the_nightly_preflight_knows_the_server_it_deployed(nightly: Said, runs: Path) -> None:
    assert nightly.code == 0, nightly.text
    record = newest_summary(runs)
    [preflight] = [r for r in record["results"] if r["stage"] == "preflight"]
    found = [(f["severity"], f["message"]) for f in preflight["findings"]]
    ours = [m for s, m in found if m.startswith("opsbook's server (pid ")]
    assert len(ours) == 1 and "holds 8 GPU(s)" in ours[0], found
    assert not [m for s, m in found if s == "warning"], found  # none per GPU, none for the port


def test_records_show_reads_for_people_and_pipes_into_head(nightly: Said, runs: Path) -> None:
    folder = sorted(runs.glob("*-deploy-*"))[-1]
    shown = say("records", "show", str(folder))
    assert shown.code == 0
    assert shown.lines[0][1].startswith(f"run {folder.name}: ok (exit 0)")
    assert "RECAP" in shown.text and "already running and ready" in shown.text
    as_json = json.loads(say("records", "show", str(folder), "--json").text)
    assert as_json["exit_code"] == 0 and len(as_json["results"]) == len(STAGES)
    piped = subprocess.run(
        f"{' '.join(OPSBOOK)} records show {folder} --json | head -1",
        shell=True,
        capture_output=True,
        text=True,
        check=True,
    )
    assert piped.stdout == "{\n"
    assert piped.stderr == "", piped.stderr


def test_a_failed_stage_prints_its_remedy(nightly: Said, box: Sandbox, runs: Path) -> None:
    broken = box.deployment_path.with_name("broken.yml")
    doc = yaml.safe_load(box.deployment_path.read_text())
    doc["server"]["args"]["no-such-flag"] = True
    broken.write_text(yaml.safe_dump(doc))
    said = say("run", "deploy", "-f", str(broken), "--runs-dir", str(runs))
    assert said.code == 1, said.text
    assert said.stage_line("launch")[1].split()[2] == "failed", said.text
    remedy = [line for _, line in said.lines if line.strip().startswith("remedy:")]
    assert remedy and "--no-such-flag" in remedy[0], said.text
    assert "failed at launch" in said.text.split("RECAP\n", 1)[1]
    assert not [line for _, line in said.lines if "Traceback" in line], said.text


# --- a long phase, and a terminal (issue 29, item 6); after the tests above: the launch
# below restarts the server they deployed.

SLOW_START = 40.0  # seconds: the simulated weights load for 14 s of it, without a new phase


@pytest.fixture
def slow_start(box: Sandbox) -> Iterator[None]:
    settings = box.venv / "opsbook-vllm-sim.json"
    before = settings.read_text() if settings.exists() else "{}"
    settings.write_text(json.dumps({**json.loads(before), "startup_seconds": SLOW_START}))
    settings.chmod(0o644)
    try:
        yield
    finally:
        settings.write_text(before)


def test_a_slow_start_prints_a_line_at_least_every_10_s(
    box: Sandbox, runs: Path, slow_start: None
) -> None:
    # A deploy: the test above left a launch script with a flag vLLM refuses.
    said = say(
        "run", "-p", "restart", "always", "deploy", "-f", str(box.deployment_path),
        "--runs-dir", str(runs),
    )  # fmt: skip
    assert said.code == 0, said.text
    finished, _ = said.stage_line("launch")
    live = [(t, line) for t, line in said.lines if line.split()[2:3] == ["..."]]
    assert live, said.text
    times = [t for t, _ in live] + [finished]
    gaps = [round(b - a, 1) for a, b in zip(times, times[1:], strict=False)]
    assert max(gaps) <= 10.0, (gaps, said.text)
    assert finished - times[0] >= SLOW_START * 0.8, said.text
    stills = [line for _, line in live if ", still" in line]
    assert stills, said.text  # the quiet load phase said what the log said last
    # Each live line: stage, host, "...", elapsed seconds, then the phase.
    for _, line in live:
        stage, host, dots, seconds, unit, *_ = line.split()
        assert (stage, dots, unit) == ("launch", "...", "s") and seconds.isdigit(), line


def in_a_pty(columns: int, *args: str) -> tuple[int, str]:
    """Run ``opsbook ARGS`` on a pseudo-terminal ``columns`` wide, as in a user's terminal."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    keep = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "COLUMNS", "FORCE_COLOR")}
    proc = subprocess.Popen(
        [*OPSBOOK, *args], stdout=follower, stderr=follower, env={**keep, "TERM": "xterm"}
    )
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # the probe ended and closed its side
            break
        if not chunk:
            break
        chunks.append(chunk)
    code = proc.wait(timeout=120)
    os.close(leader)
    return code, b"".join(chunks).decode()


ANSI = re.compile(r"\x1b\[[0-9;]*m")


def test_on_a_terminal_lines_fit_and_are_coloured_and_piped_they_are_plain(box: Sandbox) -> None:
    code, shown = in_a_pty(60, "check", "-f", str(box.deployment_path))
    lines = ANSI.sub("", shown).replace("\r", "").splitlines()
    assert code == 0 and "\x1b[32m" in shown, shown
    assert lines and max(len(line) for line in lines) <= 60, lines
    piped = say("check", "-f", str(box.deployment_path))
    assert piped.code == 0 and "\x1b" not in piped.text
    first = piped.lines[0][1]
    host = first.split()[1]
    assert first.startswith(f"{'diagnose':<14} {host:<32} {'ok':<12} "), first  # as ever
