"""Server state classification: every state from the facts a status probe gathers, with the
diagnoses of real vLLM logs (tests/data/logs)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from opsbook.knowledge import logscan
from opsbook.steps import triage
from opsbook.steps.launch_answers import ProcessInfo
from opsbook.steps.triage import STATES, ServerState, classify

DATA = Path(__file__).resolve().parents[1] / "data" / "logs"
READY_LOG = (DATA / "ready-3.log").read_text()
FP8_LOG = (DATA / "fp8kv-mla-1.log").read_text()
# The same startup cut off while loading: no error, no readiness.
LOADING_LOG = "\n".join(READY_LOG.splitlines()[:25]) + "\n"


def diagnosis(text: str, running: bool) -> logscan.LogDiagnosis:
    return logscan.diagnose_log(text, running=running)


def hung_diagnosis() -> logscan.LogDiagnosis:
    """A log whose last lines show a known stall (e.g. NCCL waiting forever)."""
    return logscan.LogDiagnosis(
        state=logscan.HUNG,
        phase="weights",
        failure="nccl",
        title="NCCL stalls",
        severity="error",
        line=None,
        remedy="set NCCL_P2P_DISABLE=1",
        source="test",
    )


def state(**facts: Any) -> tuple[str, str]:
    given: dict[str, Any] = {
        "record": True,
        "running": True,
        "log_exists": True,
        "log_age": 2.0,
        "port_open": False,
        "healthy": False,
        "diagnosis": None,
    }
    given.update(facts)
    return classify(**given)


# -- never started ------------------------------------------------------------------------------


def test_nothing_at_all_is_never_started() -> None:
    assert state(record=False, running=False, log_exists=False) == (
        "never started",
        "no launch recorded, no log, no process",
    )


def test_a_launch_without_a_log_is_never_started() -> None:
    verdict, why = state(running=False, log_exists=False)
    assert verdict == "never started" and "left no log" in why


def test_an_empty_log_is_never_started() -> None:
    verdict, why = state(running=False, diagnosis=None)
    assert verdict == "never started" and why.endswith("shows no vLLM startup")


def test_a_log_without_any_vllm_line_is_never_started() -> None:
    said = diagnosis("zsh: command not found: python3\n", running=False)
    assert said.phase is None
    assert state(running=False, diagnosis=said)[0] == "never started"


# -- crashed ----------------------------------------------------------------------------------


def test_a_dead_process_with_a_known_failure_crashed() -> None:
    verdict, why = state(running=False, diagnosis=diagnosis(FP8_LOG, running=False))
    assert verdict == "crashed" and why.startswith("FP8 KV cache requested")


def test_a_live_process_whose_log_shows_a_failure_crashed() -> None:
    verdict, why = state(diagnosis=diagnosis(FP8_LOG, running=True))
    assert verdict == "crashed" and why.endswith("(the process is still alive)")


def test_a_crash_that_left_orphans_says_so() -> None:
    verdict, why = state(running=False, diagnosis=diagnosis(FP8_LOG, running=False), orphans=9)
    assert verdict == "crashed"
    assert "9 of its processes still run (orphans holding GPU memory)" in why


# -- loading, ready, hung --------------------------------------------------------------------


def test_a_live_process_in_the_middle_of_its_startup_is_loading() -> None:
    said = diagnosis(LOADING_LOG, running=True)
    verdict, why = state(diagnosis=said, log_age=4.0)
    assert verdict == "loading" and why == f"phase {said.phase}, last log line 4 s ago"


def test_loading_before_the_first_log_line() -> None:
    assert state(log_age=None) == ("loading", "phase starting")


def test_a_live_process_that_answers_health_is_ready() -> None:
    verdict, _ = state(diagnosis=diagnosis(READY_LOG, running=True), port_open=True, healthy=True)
    assert verdict == "ready"


def test_a_live_process_silent_for_long_with_its_port_closed_is_hung() -> None:
    said = diagnosis(LOADING_LOG, running=True)
    verdict, why = state(diagnosis=said, log_age=400.0)
    assert verdict == "hung" and why.startswith("alive, log silent for 400 s")


def test_the_silence_limit_is_a_parameter() -> None:
    assert state(log_age=10.0, silent_after=5.0)[0] == "hung"
    assert state(log_age=10.0, silent_after=50.0)[0] == "loading"


def test_a_silent_server_whose_port_is_open_is_still_loading() -> None:
    assert state(log_age=400.0, port_open=True)[0] == "loading"


def test_a_known_stall_in_the_log_is_hung() -> None:
    verdict, why = state(diagnosis=hung_diagnosis())
    assert verdict == "hung" and why.startswith("NCCL stalls")


# -- exited -------------------------------------------------------------------------------------


def test_a_dead_process_whose_log_shows_no_error_exited() -> None:
    said = diagnosis(LOADING_LOG, running=False)
    verdict, why = state(running=False, diagnosis=said)
    assert verdict == "exited" and why.endswith(f"(last phase {said.phase})")


def test_a_server_killed_after_it_was_ready_exited_and_its_orphans_are_named() -> None:
    verdict, why = state(running=False, diagnosis=diagnosis(READY_LOG, running=False), orphans=2)
    assert verdict == "exited"
    assert "last phase ready" in why and "04_launch stops them" in why


def test_a_dead_process_after_a_stall_exited() -> None:
    verdict, why = state(running=False, diagnosis=hung_diagnosis())
    assert verdict == "exited" and "after a stall: NCCL stalls" in why


def test_every_verdict_is_a_known_state() -> None:
    seen = {
        state(record=False, running=False, log_exists=False)[0],
        state(running=False, diagnosis=diagnosis(FP8_LOG, running=False))[0],
        state()[0],
        state(healthy=True)[0],
        state(log_age=1e6)[0],
        state(running=False, diagnosis=diagnosis(LOADING_LOG, running=False))[0],
    }
    assert seen == set(STATES)


# -- the verdict as a result ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("verdict", "ok"),
    [
        ("ready", True),
        ("loading", True),
        ("crashed", False),
        ("hung", False),
        ("exited", False),
        ("never started", False),
    ],
)
def test_only_ready_and_loading_are_ok(verdict: str, ok: bool) -> None:
    assert ServerState(verdict, "why", None).ok is ok


def test_the_result_lists_the_log_findings_and_the_processes_not_started_by_opsbook() -> None:
    other = ProcessInfo(pid=99, ppid=1, pgid=99, cmdline="VLLM::EngineCore")
    mine = ProcessInfo(pid=10, ppid=1, pgid=10, cmdline="vllm serve /models/kimi")
    found = ServerState("crashed", "FP8", diagnosis(FP8_LOG, running=False), [mine], [other])
    result = found.to_result()
    assert not result.ok and result.message == "crashed: FP8"
    assert result.findings[0].subject == "fp8kv-mla"
    assert result.findings[-1].subject == "PID 99" and "not started by this launch" in (
        result.findings[-1].message
    )
    roles = {row["pid"]: row["role"] for row in found.processes_table().records()}
    assert roles == {10: "this launch", 99: "not started by opsbook"}


def test_states_are_the_documented_ones() -> None:
    assert triage.STATES == ("never started", "crashed", "loading", "ready", "hung", "exited")


# -- a stop by opsbook is not a crash ----------------------------------------------------------
# The stop signals the whole process group at once, so vLLM's EngineCore may see its worker die
# before its own shutdown begins and log (vllm/v1/executor/multiproc_executor.py, 0.32.0)
# "Worker proc %s died unexpectedly (exit code: %s), shutting down executor." -- seen on the
# real tier in 1 of 4 stops. The server below does exactly that on SIGTERM: a real process
# group, stopped and classified by the real launch probe (run locally through FakeHost).

RACING_SERVER = """#!/bin/bash
cat {ready!s}
trap 'echo "(EngineCore pid=$$) ERROR 12-03 02:10:00 [multiproc_executor.py:316] \
Worker proc VllmWorker-0 died unexpectedly (exit code: -15), shutting down executor."; \
exit 0' TERM
while true; do sleep 0.1; done
"""


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def racing_host(tmp_path: Path) -> Iterator[Callable[..., tuple[Any, Any]]]:
    """A host (FakeHost, the launch probe run locally) with a racing server to start; the
    server is stopped when the test ends, passed or not (it loops until signalled)."""
    from opsbook.steps import server

    made: list[tuple[Any, Any]] = []

    def make(crash_first: bool = False) -> tuple[Any, Any]:
        made.append(_racing_host(tmp_path, crash_first))
        return made[-1]

    yield make
    for host, paths in made:
        server.stop_server(host, paths, grace=1)


def _racing_host(tmp_path: Path, crash_first: bool = False) -> tuple[Any, Any]:
    from opsbook.remote.testing import FakeHost, local_probe
    from opsbook.steps.server import LaunchPaths

    ready = tmp_path / "ready.log"
    text = READY_LOG if not crash_first else FP8_LOG
    ready.write_text(text)
    script = tmp_path / "serve.sh"
    script.write_text(RACING_SERVER.format(ready=ready))
    script.chmod(0o755)
    paths = LaunchPaths(
        script=str(script), log=str(tmp_path / "vllm.log"), state_dir=str(tmp_path / "state")
    )
    return FakeHost("127.0.8.1", probes={"launch": local_probe("launch")}), paths


def test_a_clean_stop_whose_processes_log_their_deaths_is_not_read_as_a_crash(racing_host):
    from opsbook.steps import server

    host, paths = racing_host()
    port = free_port()  # nothing listens there: the probe only asks whether it is open
    assert server.start_server(host, paths, port).ok
    stopped = server.stop_server(host, paths, grace=5)
    assert stopped.ok, str(stopped)
    log = Path(paths.log).read_text()
    assert "died unexpectedly (exit code: -15)" in log  # the race's line is there
    assert logscan.diagnose_log(log, running=False).failure == "engine-dead"

    state = triage.server_state(host, paths, port)

    assert state.state == "exited", state.message
    assert state.message.startswith("stopped by opsbook at ")
    assert "phase ready" in state.message


def test_a_server_that_had_failed_before_the_stop_is_still_crashed(racing_host):
    from opsbook.steps import server

    host, paths = racing_host(True)
    port = free_port()
    assert server.start_server(host, paths, port).ok
    assert server.stop_server(host, paths, grace=5).ok

    state = triage.server_state(host, paths, port)

    assert state.state == "crashed", state.message
    assert state.diagnosis is not None and state.diagnosis.failure == "fp8kv-mla"


def test_a_ready_server_that_stopped_answering_is_hung_not_loading() -> None:
    ready = diagnosis(READY_LOG, running=True)
    assert ready.state == logscan.READY
    # Port open, /health silent for the watch window, log not growing: hung, whatever the age.
    got = state(port_open=True, log_age=20.0, diagnosis=ready, unresponsive=True)
    assert got[0] == "hung"
    assert f"{triage.UNRESPONSIVE_SECONDS:g} s" in got[1]
    # Without the watch's verdict the same facts stay loading (a busy server gets the window).
    assert state(port_open=True, log_age=20.0, diagnosis=ready)[0] == "loading"


@pytest.mark.parametrize(
    ("port_open", "lost", "says"),
    [
        (False, triage.LOST_REFUSED, "no longer accepts connections"),
        (True, triage.LOST_BUSY, "its log still grows"),
    ],
)
def test_a_ready_server_that_lost_its_answer_is_never_loading(
    port_open: bool, lost: str, says: str
) -> None:
    ready = diagnosis(READY_LOG, running=True)
    got = state(port_open=port_open, log_age=1.0, diagnosis=ready, ready_lost=lost)
    assert got[0] == "hung" and says in got[1], got
    assert got[0] not in ("loading", "ready")


# -- which launch is judged (issue 31, item 5) -------------------------------------------------


def test_the_state_names_the_launch_it_judges(racing_host):
    from opsbook.steps import server

    host, paths = racing_host()
    port = free_port()
    assert server.start_server(host, paths, port).ok
    state = triage.server_state(host, paths, port)
    assert state.started_at is not None
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(state.started_at))
    assert f"(the launch of {when})" in state.message


def test_a_server_whose_script_changed_since_its_start_is_not_the_last_deploys(racing_host):
    from opsbook.steps import server

    host, paths = racing_host()
    port = free_port()
    inputs = {"script": {"files": [paths.script]}}
    assert server.start_server(host, paths, port, inputs=inputs).ok
    same = triage.server_state(host, paths, port, inputs=inputs, last_deploy=True)
    assert not same.superseded and "the last deploy did not launch" not in same.message
    # A deploy rewrote the script and stopped before its launch (02 or 03 failed).
    Path(paths.script).write_text(Path(paths.script).read_text() + "# a new deploy\n")

    state = triage.server_state(host, paths, port, inputs=inputs, last_deploy=True)

    assert state.superseded == ["script"]
    assert "the running server is from" in state.message
    assert "the last deploy did not launch (script changed" in state.message
    assert not state.ok and not state.to_result().ok
    # 04's own look (no last_deploy) is about the server, whose restart it decides.
    assert triage.server_state(host, paths, port, inputs=inputs).superseded == []


def test_a_failed_server_still_exiting_after_the_stop_is_crashed_not_loading(racing_host):
    from opsbook.steps import server

    host, paths = racing_host(True)
    port = free_port()
    assert server.start_server(host, paths, port).ok
    record_path = Path(paths.state_dir) / "launch.json"
    record = json.loads(record_path.read_text())
    # What opsbook's stop notes before it signals: its processes are still exiting.
    record["stop"] = {"at": time.time(), "log_size": Path(paths.log).stat().st_size}
    record_path.write_text(json.dumps(record))

    state = triage.server_state(host, paths, port)

    assert state.state == "crashed", state.message
    assert state.diagnosis is not None and state.diagnosis.failure == "fp8kv-mla"
    assert "still run" in state.message and not state.ok
