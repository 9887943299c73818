"""What a run prints as it goes: plain and unchanged off a terminal, fitted to the width and
coloured on one (a real pty), and a live line at least every 10 s of a long quiet phase."""

from __future__ import annotations

import fcntl
import io
import os
import pty
import re
import struct
import subprocess
import sys
import termios
from types import SimpleNamespace

from opsbook.core import channel
from opsbook.core.channel import StageProgress
from opsbook.core.results import Finding, HostResult, State, recap
from opsbook.stages import launch_server
from opsbook.steps import server
from opsbook.terminal import Terminal

ANSI = re.compile(r"\x1b\[[0-9;]*m")
LONG = "the server exited (code 1) while loading the weights: " + "a long message " * 12
FAILED = HostResult(
    "ops@gpu-01:22",
    "launch",
    State.FAILED,
    LONG,
    duration=12.25,
    findings=(Finding("error", "log", "x", "lower --gpu-memory-utilization " * 6),),
)
RESULTS = [HostResult("ops@gpu-01:22", "preflight", State.OK, "8 GPUs", duration=0.5), FAILED]
PROGRESS = StageProgress("ops@gpu-01:22", "launch", 42.0, "loading load, still: " + "x" * 200)


def printed(terminal: Terminal) -> None:
    for result in RESULTS:
        terminal.result(result)
    terminal.progress(PROGRESS)
    terminal.recap(recap(RESULTS), "problem found", "launch failed", ok=False)


def test_off_a_terminal_the_lines_are_what_the_command_always_printed() -> None:
    out = io.StringIO()
    printed(Terminal(out))
    expected = [
        RESULTS[0].line(),
        FAILED.line(),
        f"{'':<15}remedy: {FAILED.remedy}",
        PROGRESS.line(),
        "RECAP",
        *(line.line(len("ops@gpu-01:22")) for line in recap(RESULTS)),
        "problem found: launch failed",
    ]
    assert out.getvalue() == "\n".join(expected) + "\n"


def test_on_a_terminal_lines_fit_its_width_and_states_are_coloured() -> None:
    out = io.StringIO()
    printed(Terminal(out, tty=True, width=72))
    text = out.getvalue()
    plain = ANSI.sub("", text).splitlines()
    assert max(len(line) for line in plain) <= 72, plain
    assert "\x1b[" in text and "\x1b[1;31mfailed" in text, text  # bold red
    assert "\x1b[32mok" in text  # green
    # Nothing is lost but the live line's end: the message and remedy wrap under the line.
    words = " ".join(line.strip() for line in plain)
    assert "a long message " * 12 in words + " " and FAILED.remedy.strip() in words
    assert any(line.startswith("launch         ops@gpu-01:22") for line in plain), plain
    [live] = [line for line in plain if "    42 s" in line]
    assert live.endswith("…") and len(live) == 72


PTY_PROBE = """
from opsbook import cli
from opsbook.core.results import HostResult, State
cli._print_result(HostResult("ops@gpu-01:22", "launch", State.FAILED, "word " * 40))
"""


def run_in_a_pty(columns: int, env: dict[str, str]) -> str:
    """The probe's output through a pseudo-terminal ``columns`` wide, as a user sees it."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    proc = subprocess.Popen(
        [sys.executable, "-c", PTY_PROBE], stdout=follower, stderr=follower, env=env
    )
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # the follower side closed: the probe is done
            break
        if not chunk:
            break
        chunks.append(chunk)
    proc.wait(timeout=60)
    os.close(leader)
    return b"".join(chunks).decode()


def test_the_command_sees_a_terminal_by_itself_and_takes_its_width() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "COLUMNS", "FORCE_COLOR")}
    shown = run_in_a_pty(50, {**env, "TERM": "xterm-256color"})
    lines = ANSI.sub("", shown).replace("\r", "").splitlines()
    assert "\x1b[" in shown and max(len(line) for line in lines) <= 50, lines
    assert " ".join(lines).count("word") == 40
    piped = subprocess.run(
        [sys.executable, "-c", PTY_PROBE], capture_output=True, text=True, env=env, check=True
    )
    assert "\x1b" not in piped.stdout and len(piped.stdout.splitlines()) == 1


def test_a_quiet_phase_still_gets_a_line_at_least_every_10_s(tmp_path, monkeypatch) -> None:
    outcome = tmp_path / "outcome.jsonl"
    monkeypatch.setenv(channel.OUTCOME_ENV, str(outcome))
    note = launch_server._phases(SimpleNamespace(name="ops@gpu-01:22"))
    tail = "INFO 12-06 05:00:00 [loader.py:12] Loading safetensors shards: 3/119\n\n"
    looks = [(0.0, None, "starting")]
    looks += [(float(s), "load", "loading") for s in range(1, 40)]
    looks += [(40.0, "graphs", "loading")]
    for seconds, phase, state in looks:
        note(server.Progress(seconds, phase, state, 100, tail))
    lines = [p for p in channel.Follower(outcome).new() if isinstance(p, StageProgress)]
    times = [p.seconds for p in lines]
    assert all(b - a <= 9 for a, b in zip(times, times[1:], strict=False)), times
    texts = [p.text for p in lines]
    # A new phase's line is as it was; the lines within one carry the log's last words.
    assert texts[:2] == ["starting", "loading load"] and texts[-1] == "loading graphs"
    stills = texts[2:-1]
    assert stills and set(stills) == {"loading load, still: Loading safetensors shards: 3/119"}


def test_the_last_words_of_a_log_skip_blank_and_bare_lines() -> None:
    assert launch_server.last_said("a\nINFO 12-06 05:00:00 [x.py:1] weights 40%\r\n----\n") == (
        "weights 40%"
    )
    assert launch_server.last_said("") == ""
    assert len(launch_server.last_said("y" * 500)) == launch_server.SAID_CHARS


def facts_diff() -> object:
    from opsbook.core.facts_diff import diff_facts
    from opsbook.core.facts_schema import EngineFacts, HostRunFacts, RunFacts

    def run(name: str, vllm: str, kv: str) -> RunFacts:
        engine = EngineFacts(vllm=vllm, kv_cache_dtype=kv)
        return RunFacts(run=name, deployment="d", hosts={"h": HostRunFacts(engine=engine)})

    return diff_facts(run("r1", "0.15.1", "auto"), run("r2", "0.33.0", "fp8_e4m3"))


def test_a_facts_diff_is_a_stat_head_then_each_fact_old_and_new() -> None:
    out = io.StringIO()
    Terminal(out).facts_diff(facts_diff())  # type: ignore[arg-type]
    lines = out.getvalue().splitlines()
    assert lines[0] == "2 fact(s) differ from r1 to r2: 2 changed, 0 added, 0 removed"
    assert lines[1] == " engine |   2 ~~"
    [vllm] = [line for line in lines if "engine.vllm" in line]
    assert vllm.split() == ["h", "engine.vllm", "0.15.1", "0.33.0"]


def test_on_a_terminal_a_facts_diff_and_a_table_are_rich_tables() -> None:
    from opsbook.core.results import Table

    out = io.StringIO()
    terminal = Terminal(out, tty=True, width=100)
    terminal.facts_diff(facts_diff())  # type: ignore[arg-type]
    terminal.table(Table(["run", "status"], [["r1", "ok"]]), title="runs")
    text = out.getvalue()
    plain = ANSI.sub("", text)
    assert "┃ host" in plain and "│ engine.vllm" in plain and "runs" in plain, plain
    assert "\x1b[31m0.15.1" in text and "\x1b[32m0.33.0" in text  # old red, new green
