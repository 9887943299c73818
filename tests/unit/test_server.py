"""Launch logic without a remote host: the startup timeline, the start gate from host facts,
and the start and stop verdicts with the launch probe run on this machine (the shipped
:class:`opsbook.remote.testing.LocalHost` runs each probe with the local python, as a host's
python runs it)."""

from __future__ import annotations

import contextlib
import dataclasses
import http.server
import json
import os
import signal
import socket
import threading
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from opsbook.knowledge import logscan
from opsbook.knowledge.logscan import Phase
from opsbook.remote import probes
from opsbook.remote.testing import FakeHost, LocalHost, local_probe
from opsbook.steps import server as launch
from opsbook.steps import triage
from opsbook.steps.host_facts import GpuProcess, HostFacts, facts_from_probe
from opsbook.steps.launch_answers import StatusAnswer, StopAnswer

DATA = Path(__file__).resolve().parents[1] / "data" / "logs"
T0 = datetime(2000, 6, 10, 6, 16, 19)


# -- the timeline -----------------------------------------------------------------------------


def phase(name: str, seconds: float | None, line: int = 1) -> Phase:
    return Phase(name, line, None if seconds is None else T0 + timedelta(seconds=seconds))


def test_timeline_gives_each_phase_its_start_and_length() -> None:
    table = launch.timeline([phase("args", 0), phase("weights", 12.5), phase("ready", 40)])
    assert table.columns == ["phase", "starts at (s)", "lasts (s)"]
    assert table.rows == [["args", 0.0, 12.5], ["weights", 12.5, 27.5], ["ready", 40.0, None]]


def test_timeline_leaves_out_phases_without_a_time() -> None:
    table = launch.timeline(
        [phase("args", None), phase("weights", 3), phase("http", None), phase("ready", 5)]
    )
    assert table.rows == [["weights", 0.0, 2.0], ["ready", 2.0, None]]


def test_timeline_of_nothing_is_an_empty_table() -> None:
    assert launch.timeline([]).rows == []
    assert launch.timeline([phase("args", None)]).rows == []


def test_timeline_of_a_real_startup_log() -> None:
    text = (DATA / "vllm-startup-8x-rtxpro6000-glm51-nvfp4.log").read_text()
    rows = launch.timeline(logscan.phases(text)).rows
    assert [r[0] for r in rows] == [
        "args",
        "engine-config",
        "weights",
        "backend",
        "compile",
        "kv-cache",
        "graphs",
        "engine-ready",
        "http",
        "ready",
    ]
    assert rows[0][1] == 0.0 and rows[-1] == ["ready", 236.0, None]
    # Each phase lasts until the next one starts.
    for row, following in zip(rows, rows[1:], strict=False):
        assert row[1] + row[2] == pytest.approx(following[1])


def test_progress_line_shows_time_state_and_phase() -> None:
    assert launch.Progress(3.4, "weights", "loading", 100).line() == (
        "    3 s  loading       phase: weights"
    )
    assert launch.Progress(0, None, "loading", 0).line().endswith("phase: -")


# -- may it start? ------------------------------------------------------------------------------


def facts(
    listening: list[dict[str, Any]] | None = None, processes: list[GpuProcess] | None = None
) -> HostFacts:
    base = facts_from_probe({"listening": listening or []}, host="gpu1", server_port=8000)
    return dataclasses.replace(base, processes=processes or [])


def test_a_free_port_and_idle_gpus_may_start() -> None:
    other_port = {"port": 22, "address": "0.0.0.0", "family": "tcp", "user": "root"}
    result = launch.check_can_start(facts([other_port]), 8000)
    assert result.ok and result.message == "port free and GPUs idle" and not result.findings


def test_a_taken_port_is_refused_naming_the_holder() -> None:
    holder = {
        "port": 8000,
        "address": "0.0.0.0",
        "family": "tcp",
        "user": "alice",
        "pid": 4242,
        "process": "python3",
        "cmdline": "python3 -m vllm.entrypoints.openai.api_server",
    }
    result = launch.check_can_start(facts([holder]), 8000)
    assert not result.ok and result.message == "cannot start yet"
    (finding,) = result.findings
    assert finding.severity == "error" and finding.subject == "port 8000"
    assert "PID 4242 (python3 -m vllm.entrypoints.openai.api_server)" in finding.message
    assert "server.port" in finding.remedy


def test_a_port_held_by_another_user_names_the_user_once_for_both_families() -> None:
    v4 = {"port": 8000, "address": "0.0.0.0", "family": "tcp", "user": "bob"}
    v6 = {"port": 8000, "address": "::", "family": "tcp6", "user": "bob"}
    result = launch.check_can_start(facts([v4, v6]), 8000)
    (finding,) = result.findings
    assert "a process of user bob (its PID is not visible)" in finding.message


def test_gpu_memory_held_by_a_process_is_refused_naming_it() -> None:
    orphan = GpuProcess(
        pid=777, process_name="VLLM::EngineCore", used_memory_mib=81000, gpu_index=3
    )
    result = launch.check_can_start(facts(processes=[orphan]), 8000)
    (finding,) = result.findings
    assert not result.ok and finding.subject == "GPU 3"
    assert finding.message == "PID 777 (VLLM::EngineCore) holds 81000 MiB on GPU 3"
    assert "orphan VLLM::EngineCore" in finding.remedy


def test_every_holder_is_a_finding() -> None:
    holder = {"port": 8000, "address": "0.0.0.0", "family": "tcp", "user": "bob"}
    gpus = [
        GpuProcess(pid=p, process_name="python3", used_memory_mib=10, gpu_index=i)
        for i, p in enumerate((11, 12))
    ]
    result = launch.check_can_start(facts([holder], gpus), 8000)
    assert [f.subject for f in result.findings] == ["port 8000", "GPU 0", "GPU 1"]


# -- start and stop verdicts, with the probe run on this machine -------------------------------


@pytest.fixture
def paths(tmp_path: Path) -> launch.LaunchPaths:
    return launch.LaunchPaths(
        script=str(tmp_path / "launch.sh"),
        log=str(tmp_path / "vllm.log"),
        state_dir=str(tmp_path / "state"),
    )


def script(paths: launch.LaunchPaths, body: str, mode: int = 0o755) -> None:
    Path(paths.script).write_text("#!/bin/bash\n" + body)
    os.chmod(paths.script, mode)


def start(paths: launch.LaunchPaths) -> Any:
    return launch.start_server(LocalHost(), paths, free_port())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_missing_script_never_starts(paths: launch.LaunchPaths) -> None:
    result = start(paths)
    assert not result.ok and result.message.endswith(
        "does not exist: upload it with notebook 03_launch_script"
    )
    assert not Path(paths.state_dir, "launch.json").exists()


def test_a_script_that_is_not_executable_never_starts(paths: launch.LaunchPaths) -> None:
    script(paths, "exit 0\n", mode=0o644)
    assert "is not executable" in start(paths).message


def test_a_silent_exit_is_never_started(paths: launch.LaunchPaths) -> None:
    script(paths, "exit 3\n")
    result = start(paths)
    assert not result.ok
    assert result.message == "never started: exited with code 3 and logged nothing"


def test_an_exit_with_words_says_them(paths: launch.LaunchPaths) -> None:
    script(paths, "echo 'zsh: command not found: python3' >&2\nexit 127\n")
    result = start(paths)
    assert result.message == "exited at once with code 127: zsh: command not found: python3"
    assert result.proof.exit_code == 127


def test_a_known_failure_in_the_first_seconds_is_a_crash(paths: launch.LaunchPaths) -> None:
    log = (DATA / "fp8kv-mla-1.log").read_text()
    Path(paths.script).with_name("crash.log").write_text(log)
    script(paths, 'cat "$(dirname "$0")/crash.log"\nexit 1\n')
    result = start(paths)
    assert result.message.startswith("crashed within seconds (exit code 1): FP8 KV cache")
    assert result.diagnosis.failure == "fp8kv-mla"
    assert "02_config_patch" in result.findings[0].remedy


def test_a_taken_port_is_refused_by_the_start_itself(paths: launch.LaunchPaths) -> None:
    script(paths, "exit 0\n")
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        result = launch.start_server(LocalHost(), paths, port)
    assert not result.ok
    assert f"port {port} is already taken by PID {os.getpid()}" in result.message


def test_start_records_its_group_and_stop_ends_it_with_sigkill_when_ignored(
    paths: launch.LaunchPaths,
) -> None:
    # A server that ignores SIGTERM, with a child in its group.
    script(paths, "trap '' TERM\necho starting\nsleep 60 &\nwhile true; do sleep 0.1; done\n")
    started = start(paths)
    record = started.record
    try:
        assert started.ok and started.message.startswith(f"started: PID {record.pid}")
        assert record.pgid == record.pid != os.getpgid(0)
        saved = json.loads(Path(paths.state_dir, "launch.json").read_text())
        assert saved["cmdline"].startswith("/bin/bash") and saved["start"] == record.start
        again = start(paths)
        assert not again.ok and "still running" in again.message

        stopped = launch.stop_server(LocalHost(), paths, grace=0.5)
        assert stopped.ok and "with SIGTERM+KILL" in stopped.message
        assert len(stopped.stopped.rows) >= 2
        assert not _alive(record.pid)
    finally:
        _kill_group(record.pgid)


def test_stop_refuses_a_recorded_pid_now_used_by_another_process(
    paths: launch.LaunchPaths,
) -> None:
    Path(paths.state_dir).mkdir()
    me = os.getpid()
    Path(paths.state_dir, "launch.json").write_text(
        json.dumps({"pid": me, "pgid": os.getpgid(0), "start": 1})
    )
    stopped = launch.stop_server(LocalHost(), paths)
    assert not stopped.ok
    assert stopped.message.startswith("the recorded PID now belongs to another process")
    assert stopped.answer.reason == "pid-reused"


def test_a_script_that_execs_late_is_still_the_recorded_launch(paths: launch.LaunchPaths) -> None:
    # Recorded while still the script (before its exec), then it becomes the "server".
    script(paths, "echo preparing\nsleep 2.5\nexec sleep 60\n")
    started = start(paths)
    record = started.record
    try:
        assert started.ok and "launch.sh" in (record.cmdline or "")
        until_cmdline(record.pid, "sleep 60")
        found = triage.server_state(LocalHost(), paths, free_port())
        assert found.state == "loading" and found.processes[0].pid == record.pid
        stopped = launch.stop_server(LocalHost(), paths, grace=2)
        assert stopped.ok and stopped.message == "stopped 1 process(es) with SIGTERM"
    finally:
        _kill_group(record.pgid)


def test_stop_refuses_a_recorded_pid_now_running_another_program(
    paths: launch.LaunchPaths,
) -> None:
    Path(paths.state_dir).mkdir()
    me = os.getpid()
    text = Path(f"/proc/{me}/stat").read_text()
    ticks = int(text[text.rindex(")") + 2 :].split()[19])
    record = {
        "pid": me,
        "pgid": os.getpgid(0),
        "start": ticks,
        "cmdline": "vllm serve /m",
        "script": paths.script,
    }
    Path(paths.state_dir, "launch.json").write_text(json.dumps(record))
    stopped = launch.stop_server(LocalHost(), paths)
    assert stopped.answer.reason == "pid-reused" and not stopped.stopped.rows


def until_cmdline(pid: int, expected: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").strip() != (
        expected.encode()
    ):
        assert time.monotonic() < deadline, f"PID {pid} never ran {expected!r}"
        time.sleep(0.05)


def test_stop_without_a_record_has_nothing_to_stop(paths: launch.LaunchPaths) -> None:
    stopped = launch.stop_server(LocalHost(), paths)
    assert stopped.answer.reason == "no-record" and not stopped.stopped.rows
    # A typed result shows as any result does: its message, not its fields.
    assert repr(stopped) == str(stopped) and "StopAnswer" not in repr(stopped)


def _alive(pid: int) -> bool:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return text[text.rindex(")") + 2] not in "ZX"


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        return
    time.sleep(0.1)


# -- the status probe answers a health check in one round trip ---------------------------------


class _Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def test_status_asks_health_when_the_port_is_open_and_reads_the_notes(
    paths: launch.LaunchPaths,
) -> None:
    Path(paths.state_dir).mkdir()
    Path(paths.state_dir, "running-script.sha256").write_text("abc123\n")
    server = http.server.HTTPServer(("127.0.0.1", 0), _Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        args = paths.probe_args(op="status", port=server.server_port, health="/health")
        args["notes"] = ["running-script.sha256", "missing", "../launch.sh"]
        answer = StatusAnswer.parse(probes.run_local("launch", args))
    finally:
        server.shutdown()
        server.server_close()
    assert answer.port_open is True
    assert answer.health is not None and answer.health.status == 200
    assert answer.notes == {
        "running-script.sha256": "abc123\n",
        "missing": None,
        "../launch.sh": None,
    }


def test_status_asks_no_health_when_the_port_is_closed(paths: launch.LaunchPaths) -> None:
    args = paths.probe_args(op="status", port=free_port(), health="/health")
    raw = probes.run_local("launch", args)
    answer = StatusAnswer.parse(raw)
    assert answer.port_open is False and answer.health is None
    assert "health" not in raw and "notes" not in raw


class _Unwell(_Health):
    def do_GET(self) -> None:
        self.send_response(503)
        self.end_headers()
        self.wfile.write(b"engine dead")


def _serving(handler: type[http.server.BaseHTTPRequestHandler]) -> http.server.HTTPServer:
    server = http.server.HTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_the_health_answer_is_read_over_a_bare_socket(paths: launch.LaunchPaths) -> None:
    server = _serving(_Unwell)
    try:
        args = paths.probe_args(op="status", port=server.server_port, health="/health")
        answer = StatusAnswer.parse(probes.run_local("launch", args))
    finally:
        server.shutdown()
        server.server_close()
    assert answer.health is not None and answer.health.status == 503
    assert answer.health.body == "engine dead"


def test_a_port_that_does_not_speak_http_is_no_health_answer(paths: launch.LaunchPaths) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()

        def greet() -> None:  # every caller: the probe's port look and its health request
            while True:
                try:
                    conn, _ = listener.accept()
                except OSError:  # the listener is closed: the test is over
                    return
                # As sshd: it reads what the client sent (unread bytes would make the close a
                # reset), then answers. The port look hangs up at once; the next is greeted.
                with conn, contextlib.suppress(OSError):
                    conn.recv(1024)
                    conn.sendall(b"SSH-2.0-OpenSSH_9.2\r\n")

        threading.Thread(target=greet, daemon=True).start()
        port = listener.getsockname()[1]
        asked = paths.probe_args(op="status", port=port, health="/h", health_timeout=5)
        answer = StatusAnswer.parse(probes.run_local("launch", asked))
    assert answer.health is not None and answer.health.status is None
    assert (answer.health.error or "").startswith("not an HTTP answer: b'SSH-2.0")


def test_a_running_healthy_server_s_log_stays_on_the_host_when_the_check_asks(
    paths: launch.LaunchPaths,
) -> None:
    script(paths, "echo 'INFO: Application startup complete.'\nsleep 60\n")
    server = _serving(_Health)
    started = start(paths)
    try:
        args = paths.probe_args(op="status", port=server.server_port, health="/health")
        brief = StatusAnswer.parse(probes.run_local("launch", dict(args, log_when_healthy=False)))
        full = StatusAnswer.parse(probes.run_local("launch", args))
    finally:
        launch.stop_server(LocalHost(), paths, grace=0.5)
        server.shutdown()
        server.server_close()
    assert started.ok and brief.running and brief.health and brief.health.status == 200
    assert brief.log.text == "" and (brief.log.size or 0) > 0
    assert "Application startup complete" in full.log.text


def test_an_unhealthy_server_s_log_is_read_even_when_the_check_asks_not_to(
    paths: launch.LaunchPaths,
) -> None:
    script(paths, "echo 'ERROR: engine core died'\nsleep 60\n")
    server = _serving(_Unwell)
    start(paths)
    try:
        args = paths.probe_args(op="status", port=server.server_port, health="/health")
        answer = StatusAnswer.parse(probes.run_local("launch", dict(args, log_when_healthy=False)))
    finally:
        launch.stop_server(LocalHost(), paths, grace=0.5)
        server.shutdown()
        server.server_close()
    assert answer.running and answer.health is not None and answer.health.status == 503
    assert "engine core died" in answer.log.text


# -- the readiness wait: one waiting look at a time, each new byte read once -------------------


def test_the_wait_asks_for_new_bytes_only_and_lets_the_host_wait(paths: launch.LaunchPaths) -> None:
    ready_log = (Path(__file__).parents[1] / "data" / "logs" / "ready-4.log").read_bytes()
    cut = ready_log.rindex(b"Application startup complete")
    pieces = [ready_log[:2000], ready_log[2000:cut], ready_log[cut:]]
    looks: list[dict[str, Any]] = []

    def watch(args: dict[str, Any]) -> dict[str, Any]:
        looks.append(args)
        n = len(looks) - 1
        start = sum(len(p) for p in pieces[:n])
        text = pieces[n].decode("utf-8", "surrogateescape")
        last = n == len(pieces) - 1
        answer: dict[str, Any] = {
            "record": {"pid": 7},
            "running": True,
            "port_open": last,
            "log": {"exists": True, "text": text, "end": start + len(pieces[n])},
            "watched_steps": 3,
        }
        if last:
            answer["health"] = {"status": 200}
        return answer

    host = FakeHost(probes={"launch": watch})
    slept: list[float] = []
    done = launch.wait_until_ready(host, paths, 8000, interval=0.5, sleep=slept.append)
    assert done.ok, done.message
    assert [a["op"] for a in looks] == ["watch"] * 3
    assert [a["wait"] for a in looks] == [0.0, 0.5, 0.5]  # the host waits, not this process
    assert [a["offset"] for a in looks] == [None, 2000, cut]  # each byte crosses once
    assert slept == []
    diagnosis = launch.diagnosis_of(done)
    assert diagnosis is not None and diagnosis.state == "ready"


def test_a_launch_record_that_cannot_be_written_leaves_no_temp_file(tmp_path: Path) -> None:
    from opsbook.remote.probes import launch as launch_probe

    args = {"state_dir": str(tmp_path)}
    # A value JSON cannot hold fails the write midway, after the temp file was opened.
    with pytest.raises(TypeError):
        launch_probe.write_record(args, {"pid": 1, "start": object()})
    assert list(tmp_path.iterdir()) == []


def test_a_status_runs_the_command_asked_beside_it_only_for_a_ready_server(
    tmp_path: Path,
) -> None:
    import sys

    from opsbook.remote.probes import launch as launch_probe

    said = launch_probe.run_side([sys.executable, "-c", "import os; print(os.getcwd())"])
    assert said == {"exit_code": 0, "output": os.path.expanduser("~") + "\n"}  # from home
    assert launch_probe.run_side(["/nonexistent/python"])["output"] == "not run: FileNotFoundError"
    args = {"state_dir": str(tmp_path), "log": str(tmp_path / "vllm.log"), "script": "s"}
    marker = tmp_path / "ran"
    asked = [sys.executable, "-c", f"open({str(marker)!r}, 'w')"]
    answer = launch_probe.status({**args, "port": None, "when_healthy": asked})
    assert "side" not in answer and not marker.exists()  # nothing runs: nothing asked


def test_an_unreadable_launch_record_is_named_apart_from_a_missing_one(tmp_path: Path) -> None:
    from opsbook.remote.probes import launch as launch_probe

    args = {"state_dir": str(tmp_path)}
    assert launch_probe.record_problem(args) is None
    (tmp_path / "launch.json").write_text('{"pid": 12')
    problem = launch_probe.record_problem(args)
    assert problem is not None and "launch.json is unreadable" in problem
    (tmp_path / "launch.json").write_text('["not", "a", "record"]')
    assert "not a launch record" in (launch_probe.record_problem(args) or "")
    assert launch_probe.read_record(args) is None


@pytest.mark.parametrize(
    ("reason", "refused", "allowed"),
    [
        ("stopped", [{"pid": 9, "uid": 1000}], True),  # the launch is gone; others are findings
        ("no-record", [], True),
        ("not-running", [{"pid": 9, "uid": 0}], True),  # another user's server
        ("not-running", [{"pid": 9, "uid": 1000}], False),  # one of this user's, not opsbook's
        ("no-record", [{"pid": 9, "uid": None}], False),  # an owner not seen counts as this user
        ("pid-reused", [], False),
        ("survived", [], False),
    ],
)
def test_the_stop_cleans_shared_memory_only_when_launch_would_go_on(
    reason: str, refused: list[dict[str, Any]], allowed: bool
) -> None:
    from opsbook.remote.probes import launch as launch_probe

    answer = {"reason": reason, "refused": refused, "uid": 1000}
    assert launch_probe.stop_allows_start(answer) is allowed
    stopped = launch._stop_result(StopAnswer.parse(dict(answer, stopped=[], signals=["TERM"])))
    assert stopped.ok is allowed  # the probe and the library judge alike


def test_stop_previous_is_one_probe_and_reports_both_steps() -> None:
    asked: list[dict[str, Any]] = []

    def stop(args: dict[str, Any]) -> dict[str, Any]:
        asked.append(args)
        shm = {"removed": [{"file": "psm_1", "bytes": 4096}], "kept": []}
        return {"reason": "not-running", "refused": [], "uid": 1000, "shm": shm}

    host = FakeHost(probes={"launch": stop})
    paths = launch.LaunchPaths("/s/launch.sh", "/s/vllm.log", "/s/state")
    done = launch.stop_previous(host, paths, grace=1)
    assert [a["op"] for a in asked] == ["stop"] and asked[0]["clean_shm"] is True
    assert (
        done.ok
        and done.message == "nothing to stop; removed 1 stale file(s) (4096 bytes); 0 in use kept"
    )


# -- the smoke test asks the host once --------------------------------------------------------


class _OpenAI(http.server.BaseHTTPRequestHandler):
    """/health, /v1/models and /v1/completions as vLLM's OpenAI server answers them; every
    request needs the key."""

    def do_GET(self) -> None:
        if self.path == "/health":
            return self._answer(200, "")
        if self.headers.get("Authorization") != "Bearer sk-test":
            return self._answer(401, '{"error": "Unauthorized"}')
        return self._answer(200, json.dumps({"data": [{"id": "/models/Kimi K2.5"}]}))

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.headers.get("Authorization") != "Bearer sk-test":
            return self._answer(401, '{"error": "Unauthorized"}')
        text = f" {body['model']} x{body['max_tokens']}"
        return self._answer(200, json.dumps({"choices": [{"text": text}]}))

    def _answer(self, status: int, body: str) -> None:
        self.send_response(status)
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def openai_port() -> Any:
    server = http.server.HTTPServer(("127.0.0.1", 0), _OpenAI)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_port
    server.shutdown()
    server.server_close()


def test_the_smoke_test_is_one_probe_asking_the_first_model_for_a_completion(
    openai_port: int,
) -> None:
    host = FakeHost(probes={"launch": local_probe("launch")})
    smoke = launch.smoke_test(host, openai_port, api_key="sk-test")
    assert smoke.ok, smoke.findings
    assert smoke.message == "smoke test passed: /models/Kimi K2.5 answered ' /models/Kimi K2.5 x8'"
    assert [f.subject for f in smoke.findings] == ["/health", "/v1/models", "/v1/completions"]
    assert len(host.calls) == 1


def test_a_smoke_test_without_the_key_fails_at_the_models_list(openai_port: int) -> None:
    host = FakeHost(probes={"launch": local_probe("launch")})
    smoke = launch.smoke_test(host, openai_port)
    assert not smoke.ok
    assert [(f.subject, f.severity) for f in smoke.findings] == [
        ("/health", "ok"),
        ("/v1/models", "error"),
    ]
    assert "HTTP 401" in smoke.findings[1].message


@pytest.mark.parametrize(("reason", "facts_read"), [("no-record", 1), ("stopped", 2)])
def test_the_launch_stage_reads_the_gpus_and_port_again_only_after_a_stop_signalled(
    reason: str, facts_read: int
) -> None:
    from opsbook.core.deployment import parse_deployment
    from opsbook.stages import launch_server as launch_stage

    def launch_probe(args: dict[str, Any]) -> dict[str, Any]:
        if args["op"] == "stop":
            return {"reason": reason, "stopped": [], "signals": ["TERM"], "shm": SHM_NONE}
        return {"started": False, "reason": "no-script"}

    facts = {"user": "ops", "nvidia_smi": {"path": None}, "listening": [], "ports": [8000]}
    host = FakeHost("a", user="ops", probes={"launch": launch_probe, "facts": facts})
    dep = parse_deployment({"hosts": ["a"], "model": {"path": "/m"}, "server": {"port": 8000}})
    report = launch_stage.run(host, dep, launch_stage.Options(apply=True))
    assert "does not exist: upload it" in report.verdict.message  # it went on to the start
    asked = [name for name, _ in host.probe_args]
    assert asked.count("facts") == facts_read


SHM_NONE: dict[str, list[dict[str, Any]]] = {"removed": [], "kept": []}


# -- the readiness wait: a launch is judged by what the server does ----------------------------


def _looks(*pieces: tuple[str, bool, bool]) -> tuple[FakeHost, list[dict[str, Any]]]:
    """A host whose watch answers one piece of the log per look: (text, running, healthy)."""
    looks: list[dict[str, Any]] = []
    ends = [0]

    def watch(args: dict[str, Any]) -> dict[str, Any]:
        looks.append(args)
        text, running, healthy = pieces[min(len(looks), len(pieces)) - 1]
        text = text if len(looks) <= len(pieces) else ""
        ends[0] += len(text.encode("utf-8", "surrogateescape"))
        answer: dict[str, Any] = {
            "record": {"pid": 7},
            "running": running,
            "port_open": healthy,
            "log": {"exists": True, "text": text, "end": ends[0]},
            "watched_steps": 1,
        }
        if healthy:
            answer["health"] = {"status": 200}
        return answer

    return FakeHost(probes={"launch": watch}), looks


def _plugin_startup() -> tuple[str, str, str]:
    """A real vLLM 0.11.2 startup (ready-4.log) with vLLM's real traceback of a plugin that
    fails to load spliced in where vLLM loads its plugins, cut: before, the error, the rest."""
    text = (DATA / "ready-4.log").read_text(errors="surrogateescape")
    args_end = text.index("\n", text.index("non-default args: ")) + 1
    prefix = "\x1b[1;36m(APIServer pid=155)\x1b[0;0m "
    lines = (DATA / "survived" / "plugin-load-error.txt").read_text().splitlines()[1:]
    return text[:args_end], "".join(prefix + line + "\n" for line in lines), text[args_end:]


def test_a_traceback_the_startup_goes_past_ends_ready_with_a_warning(
    paths: launch.LaunchPaths,
) -> None:
    before, error, after = _plugin_startup()
    next_record = after.index("\n") + 1
    host, looks = _looks(
        (before + error, True, False),
        (after[:next_record], True, False),
        (after[next_record:], True, True),
    )
    seen: list[launch.Progress] = []
    done = launch.wait_until_ready(
        host, paths, 8000, interval=0.1, sleep=lambda _: None, on_progress=seen.append
    )
    assert done.ok, done.message
    assert len(looks) == 3 and "past 1 error(s) logged before readiness" in done.message
    # The live lines never said the start failed.
    assert [p.state for p in seen] == ["loading", "loading", "ready"]
    [warning] = done.findings
    assert warning.severity == "warning"
    assert "No module named 'paddlex_genai_plugin'" in warning.message
    line = int(warning.message.split("at line ")[1].split(":")[0])
    assert (
        (before + error)
        .splitlines()[line - 1]
        .endswith("ModuleNotFoundError: No module named 'paddlex_genai_plugin'")
    )


def test_an_error_seen_with_readiness_in_one_look_is_a_warning(paths: launch.LaunchPaths) -> None:
    before, error, after = _plugin_startup()
    host, _ = _looks((before + error + after, True, True))
    done = launch.wait_until_ready(host, paths, 8000, interval=0.1, sleep=lambda _: None)
    assert done.ok, done.message
    assert [f.severity for f in done.findings] == ["warning"]
    assert "paddlex_genai_plugin" in done.findings[0].message


def test_an_error_whose_server_then_exits_fails_at_that_look(paths: launch.LaunchPaths) -> None:
    before, error, _ = _plugin_startup()
    host, looks = _looks((before + error, True, False), ("", False, False))
    done = launch.wait_until_ready(host, paths, 8000, interval=0.1, sleep=lambda _: None)
    assert not done.ok and len(looks) == 2
    assert done.message.startswith("failed: ")
    assert done.diagnosis.line is not None and "paddlex_genai_plugin" in done.diagnosis.line.text


def test_an_error_whose_process_stays_silent_ends_the_wait_after_the_settle_time(
    paths: launch.LaunchPaths, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(launch, "SETTLE_SECONDS", 0.05)
    before, error, _ = _plugin_startup()
    host, looks = _looks((before + error, True, False), ("", True, False))
    done = launch.wait_until_ready(host, paths, 8000, timeout=60, interval=0.1)
    assert not done.ok and "its process has logged nothing but errors since" in done.message
    assert len(looks) >= 2 and done.seconds < 5  # far from the timeout


def test_vllm_s_notice_of_a_dead_engine_fails_at_once_while_the_server_runs(
    paths: launch.LaunchPaths,
) -> None:
    host, looks = _looks(((DATA / "engine-dead-1.log").read_text(), True, False))
    done = launch.wait_until_ready(host, paths, 8000, interval=0.1, sleep=lambda _: None)
    assert not done.ok and len(looks) == 1
    assert done.diagnosis.failure == "engine-dead"
