"""The follower of a growing log: a crash loop's startups diagnosed once per shape; what a
failure means while the server process still runs (LogFollower.judge), and the error a server
that became ready had logged (LogFollower.error_before_ready).

The handled error is real: vLLM's traceback for a general plugin that fails to load
(tests/data/logs/survived/plugin-load-error.txt), spliced into a real vLLM 0.11.2 startup
(tests/data/logs/ready-4.log) where vLLM loads its general plugins, after its arguments.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from opsbook.knowledge import logscan
from opsbook.knowledge.logscan import FAILED, diagnose_log, follower

LOGS = Path(__file__).resolve().parents[1] / "data" / "logs"


def restarted(startup: str, run: int) -> str:
    """The startup as the run-th restart of a loop writes it: its own times and PIDs."""
    clock = f"{run // 60 % 24:02d}:{run % 60:02d}:{run * 7 % 60:02d}"
    text = re.sub(r"\d\d:\d\d:\d\d", clock, startup)
    return re.sub(r"pid=\d+", f"pid={4000 + run}", text)


def crash_loop(runs: int) -> tuple[str, str]:
    real = (LOGS / "vllm-startup-8x-rtxpro6000-glm51-nvfp4.log").read_text()
    one = real[: real.index("\n", 30_000) + 1] + (LOGS / "fp8kv-mla-1.log").read_text()
    return one, "".join(restarted(one, run) for run in range(runs))


def test_a_crash_loop_diagnoses_each_startup_shape_once(monkeypatch: pytest.MonkeyPatch) -> None:
    one, log = crash_loop(120)
    alone = diagnose_log(one)
    calls = []
    real = follower._diagnose_lines
    monkeypatch.setattr(
        follower, "_diagnose_lines", lambda *a, **k: calls.append(1) or real(*a, **k)
    )
    found = diagnose_log(log)
    # The first startup, the shape of the others (each also holds the lines the next restart
    # printed before its banner), and the last: not one diagnosis per startup.
    assert len(calls) == 3
    assert found.earlier_counts == {FAILED: 119}
    lines = one.count("\n")
    assert alone.line is not None
    assert [e.line for e in found.earlier] == [
        alone.line.number + run * lines for run in range(119)
    ]
    assert {e.failure for e in found.earlier} == {alone.failure}


def varied_crash_loop() -> str:
    """A crash loop of 40 startups, a few of them unlike the others: another error text, a
    line more, a PID with more digits, a worker under the API server's PID."""
    one, _ = crash_loop(0)
    runs = [restarted(one, run) for run in range(40)]
    runs[10] = restarted(one.replace("TritonMLA with FP8", "FlashMLA with FP8"), 10)
    runs[20] = restarted(
        one.replace("\n[rank0]:", "\nWARNING 05-15 05:33:37 [x.py:1] y\n[rank0]:", 1), 20
    )
    runs[25] = re.sub(r"pid=\d+", "pid=123456", runs[25])
    runs[30] = runs[30].replace("(Worker pid=4030)", "(Worker pid=4031)", 1)
    return "".join(runs)


def line_by_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """The splitter without its repeat path: every line through its tests, one by one."""
    monkeypatch.setattr(follower.Template, "repeats", lambda self, first, rest: False)


def test_startups_taken_whole_are_split_and_judged_as_line_by_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    log = varied_crash_loop()
    taken = []
    real = follower._StartupSplitter._take_repeat
    monkeypatch.setattr(
        follower._StartupSplitter,
        "_take_repeat",
        lambda self, *a: taken.append(1) or real(self, *a),
    )
    whole = diagnose_log(log).to_dict()
    # Taken line by line: the first two (the first holds no restart's lines before it), each
    # odd one out and the one after it, and the one before the longer PID (the first line of
    # the next startup is compared too): 11 of the 39 closed.
    assert len(taken) == 39 - 11
    with monkeypatch.context() as patched:
        line_by_line(patched)
        assert whole == diagnose_log(log).to_dict()
    assert whole["earlier_startups"]["count"] == 39


def test_a_repeat_cut_across_chunks_waits_for_its_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    from opsbook.knowledge.logscan import stream

    log = varied_crash_loop().encode()
    whole = diagnose_log(log.decode()).to_dict()
    monkeypatch.setattr(stream, "CHUNK_BYTES", 4096)
    assert logscan.diagnose_stream(io.BytesIO(log)).to_dict() == whole
    looks = logscan.LogFollower()
    for start in range(0, len(log), 70_001):
        looks.feed(log[start : start + 70_001])
    assert looks.diagnose().to_dict() == whole


PREFIX = "\x1b[1;36m(APIServer pid=155)\x1b[0;0m "


def plugin_error() -> str:
    """The plugin's traceback as the API server of ready-4.log would log it."""
    lines = (LOGS / "survived" / "plugin-load-error.txt").read_text().splitlines()[1:]
    return "".join(PREFIX + line + "\n" for line in lines)


def startup_with_plugin_error() -> tuple[str, str, str]:
    """ready-4.log cut in three: up to the arguments, the plugin error, the rest to ready."""
    text = (LOGS / "ready-4.log").read_text(errors="surrogateescape")
    args_end = text.index("\n", text.index("non-default args: ")) + 1
    return text[:args_end], plugin_error(), text[args_end:]


def follower_of(*pieces: str) -> logscan.LogFollower:
    follower = logscan.LogFollower()
    for piece in pieces:
        follower.feed(piece.encode("utf-8", "surrogateescape"))
    return follower


def test_a_handled_traceback_is_undecided_until_its_process_logs_on() -> None:
    before, error, after = startup_with_plugin_error()
    follower = follower_of(before, error)
    seen = follower.diagnose(running=True)
    assert seen.state == "failed" and seen.line is not None
    assert "No module named 'paddlex_genai_plugin'" in seen.line.text
    assert follower.judge(seen) == logscan.UNDECIDED
    # The API server's next record ("Resolved architecture: ..."): it went on past the error.
    follower.feed(after[: after.index("\n") + 1].encode())
    assert follower.judge(follower.diagnose(running=True)) == logscan.WENT_ON


def test_records_of_other_processes_or_of_a_shutdown_are_no_going_on() -> None:
    before, error, _ = startup_with_plugin_error()
    engine = "(EngineCore_DP0 pid=300) INFO 10-20 11:18:06 [core.py:93] Initializing a V1 LLM\n"
    shutdown = PREFIX + "INFO:     Waiting for application shutdown.\n"
    follower = follower_of(before, error, engine, shutdown)
    assert follower.judge(follower.diagnose(running=True)) == logscan.UNDECIDED


def test_vllm_s_notice_that_a_process_died_is_fatal_at_once() -> None:
    follower = follower_of((LOGS / "engine-dead-1.log").read_text())
    diagnosis = follower.diagnose(running=True)
    assert diagnosis.state == "failed"
    assert follower.judge(diagnosis) == logscan.FATAL


def test_a_failure_vllm_only_waits_on_is_fatal_at_once_though_its_process_logs_on() -> None:
    """Ray's placement group that cannot be placed: vLLM warns, then logs that it waits (up to
    30 minutes): the launch must not wait with it."""
    before, _, _ = startup_with_plugin_error()
    warned = PREFIX + (
        "WARNING 10-20 11:18:06 [ray_utils.py:337] The number of required GPUs exceeds the "
        "total number of available GPUs in the placement group.\n"
    )
    waits = PREFIX + (
        "INFO 10-20 11:18:16 [ray_utils.py:182] Waiting for creating a placement group of specs"
        " for 10 seconds. specs=[{'GPU': 1.0, 'node:127.0.0.2': 0.001}]. Check `ray status`"
        " and `ray list nodes` to see if you have enough resources.\n"
    )
    follower = follower_of(before, warned, waits)
    diagnosis = follower.diagnose(running=True)
    assert diagnosis.failure == "ray-resources", diagnosis.title
    assert follower.judge(diagnosis) == logscan.FATAL


def test_a_ready_server_s_earlier_error_is_found_also_when_the_startup_went_past_it() -> None:
    follower = follower_of(*startup_with_plugin_error())
    ready = follower.diagnose(running=True)
    assert ready.state == "ready"
    survived = follower.error_before_ready(ready)
    assert survived is not None and survived.line is not None
    assert "No module named 'paddlex_genai_plugin'" in survived.line.raw
    assert ready.line is not None and survived.line.number < ready.line.number


def test_a_clean_startup_has_no_error_before_ready() -> None:
    follower = follower_of((LOGS / "ready-4.log").read_text(errors="surrogateescape"))
    ready = follower.diagnose(running=True)
    assert ready.state == "ready" and follower.error_before_ready(ready) is None
    assert follower.error_before_ready(follower_of("").diagnose(running=True)) is None


def test_what_the_follower_keeps_of_the_log_s_end_stays_bounded_and_numbered() -> None:
    before, error, _ = startup_with_plugin_error()
    other = "(EngineCore_DP0 pid=300) INFO 10-20 11:18:06 [loader.py:1] loading\n"
    pieces = [before, error, other * 20_000]
    follower = follower_of(*pieces)
    kept = bytes(follower._recent)
    assert len(kept) <= logscan.follower.RECENT_BYTES
    fed = "".join(pieces).encode("utf-8", "surrogateescape")
    assert follower._recent_first == fed.count(b"\n") - kept.count(b"\n") + 1
    # The error has left what is kept; the other process's lines are no going on, its own are.
    assert follower.judge(follower.diagnose(running=True)) == logscan.UNDECIDED
    follower.feed((PREFIX + "INFO 10-20 11:18:07 [model.py:631] Resolved architecture\n").encode())
    assert follower.judge(follower.diagnose(running=True)) == logscan.WENT_ON


def test_every_startup_marker_holds_one_of_the_words_the_splitter_screens_for() -> None:
    # The splitter tests MARKER_WORDS before the markers' regex: a marker alternative without
    # one of them would never be seen.
    markers = follower._SIGNALS.startup_markers
    assert markers
    for marker in markers:
        for alternative in marker.pattern.split("|"):
            literal = alternative.replace("\\", "")
            assert any(word in literal for word in follower.MARKER_WORDS), alternative
