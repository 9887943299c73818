"""04_launch over real SSH: the safe stop, the detached start and its proof, readiness, the
smoke test, the timeline, and every fault of the issue, on a rehearsal host of this module's
own (zsh login shell, 8 simulated RTX PRO 6000, the synthetic Kimi-K2.5-NVFP4 checkpoint).

Processes that opsbook must not touch (another user's server, a look-alike of the same user)
are started here as root with ``setpriv`` and stopped here by their PID. Every test ends with
``stop_server``: no server outlives it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pwd
import shlex
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from opsbook.core.deployment import Deployment, load_deployment
from opsbook.core.results import Result
from opsbook.rehearsal.sandbox import Sandbox
from opsbook.remote import probes
from opsbook.remote.hosts import Host
from opsbook.steps import host_facts as preflight
from opsbook.steps import patch, server, triage
from opsbook.steps.launch_answers import StopAnswer
from opsbook.steps.script import render_script, upload_script
from tests.integration.conftest import cmdline, rehearsal_host, stat_fields

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as other users"),
]

ADDRESS = "127.0.0.5"
STARTUP_SECONDS = 1
READY_TIMEOUT = 30.0
LOOKALIKE = "python3 -m vllm.entrypoints.openai.api_server --port 1"
LISTENER = (
    "import socket, sys, time\n"
    "s = socket.socket()\n"
    "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
    "s.bind(('0.0.0.0', int(sys.argv[-1])))\n"
    "s.listen()\n"
    "time.sleep(120)\n"
)


@dataclass
class Rig:
    """A connected host with the deployment of this module's rehearsal host."""

    box: Sandbox
    dep: Deployment
    host: Host
    paths: server.LaunchPaths

    @property
    def port(self) -> int:
        return self.dep.server_port

    @property
    def record_file(self) -> Path:
        return Path(self.paths.state_dir) / "launch.json"

    def deploy(self, **env: str) -> Deployment:
        """Render and upload the launch script, with extra server environment."""
        dep = dataclasses.replace(self.dep, env={**self.dep.env, **env})
        return self.upload(dep)

    def upload(self, dep: Deployment) -> Deployment:
        uploaded = upload_script(self.host, dep, render_script(dep))
        assert uploaded.ok, str(uploaded)
        return dep

    def start(self) -> Result:
        return server.start_server(self.host, self.paths, self.port)

    def wait(self, **kwargs: Any) -> Result:
        kwargs.setdefault("timeout", READY_TIMEOUT)
        kwargs.setdefault("interval", 0.25)
        return server.wait_until_ready(self.host, self.paths, self.port, **kwargs)

    def start_ready(self) -> tuple[Result, Result]:
        started = self.start()
        assert started.ok, str(started)
        ready = self.wait()
        assert ready.ok, str(ready)
        return started, ready

    def state(self, **kwargs: Any) -> triage.ServerState:
        return triage.server_state(self.host, self.paths, self.port, **kwargs)

    def write_record(self, record: dict[str, Any]) -> None:
        """Replace opsbook's launch record, as the login user would by hand."""
        self.host.run(f"mkdir -p -- {shlex.quote(self.paths.state_dir)}", check=True)
        self.host.upload(str(self.record_file), json.dumps(record))

    @contextlib.contextmanager
    def record_kept(self) -> Iterator[None]:
        """Put opsbook's launch record back as it was after a test edits it."""
        saved = self.record_file.read_text() if self.record_file.exists() else None
        try:
            yield
        finally:
            if saved is None:
                self.host.run(f"rm -f -- {shlex.quote(str(self.record_file))}", check=True)
            else:
                self.host.upload(str(self.record_file), saved)


@pytest.fixture(scope="module")
def box() -> Iterator[Sandbox]:
    """A rehearsal host of this module's own, so launches here disturb no other test."""
    with rehearsal_host("launch", address=ADDRESS) as rehearsal:
        settings = rehearsal.venv / "opsbook-vllm-sim.json"
        stored = json.loads(settings.read_text()) if settings.exists() else {}
        settings.write_text(
            json.dumps({**stored, "startup_seconds": STARTUP_SECONDS, "fault": None})
        )
        settings.chmod(0o644)
        yield rehearsal


@pytest.fixture
def rig(box: Sandbox) -> Iterator[Rig]:
    dep = load_deployment(box.deployment_path)
    host = Host.from_deployment(dep)
    rig = Rig(box, dep, host, server.resolve_paths(host, dep))
    rig.upload(dep)
    try:
        yield rig
    finally:
        stopped = server.stop_server(host, rig.paths, grace=2)
        host.close()
    assert not stopped.answer.remaining, str(stopped)


@pytest.fixture
def patched(rig: Rig) -> None:
    """The checkpoint with the incident's config patch (the FP8 KV cache keys removed)."""
    texts = patch.read_configs(rig.host, rig.dep.model_path)
    plan = patch.plan_patch(texts, patch.fp8_kv_cache_edits(texts))
    applied = patch.apply_patch(rig.host, rig.dep.model_path, plan, apply=True)
    assert applied.ok, str(applied)


# -- processes opsbook did not start ---------------------------------------------------------


def spawn_as(user: str, argv: list[str]) -> subprocess.Popen[bytes]:
    """Start ``argv`` as ``user`` in a session of its own: a process opsbook knows nothing of."""
    account = pwd.getpwnam(user)
    return subprocess.Popen(
        [
            "setpriv",
            f"--reuid={account.pw_uid}",
            f"--regid={account.pw_gid}",
            "--clear-groups",
            "--",
            *argv,
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def named_like_vllm(user: str, title: str) -> subprocess.Popen[bytes]:
    """A sleeping process of ``user`` whose command line starts with ``title``."""
    proc = spawn_as(user, ["/bin/bash", "-c", 'exec -a "$0" sleep 60', title])
    until(lambda: cmdline(proc.pid).startswith(title), f"PID {proc.pid} renamed")
    return proc


def end(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(10)


def alive(pid: int) -> bool:
    try:
        return stat_fields(pid)[0] not in ("Z", "X")
    except OSError:
        return False


def group(pgid: int) -> list[int]:
    """Live members of process group ``pgid``."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                fields = stat_fields(int(name))
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
                found.append(int(name))
    return found


def until(condition: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for: {what}"
        time.sleep(0.05)


def listening(port: int) -> bool:
    text = Path("/proc/net/tcp").read_text() + Path("/proc/net/tcp6").read_text()
    return any(
        len(f) > 3 and f[3] == "0A" and int(f[1].rpartition(":")[2], 16) == port
        for f in (line.split() for line in text.splitlines()[1:])
    )


def shm_files(uid: int) -> set[str]:
    names = set()
    for name in os.listdir("/dev/shm"):
        if name.startswith(("psm_", "sem.mp-")):
            try:
                if os.lstat(f"/dev/shm/{name}").st_uid == uid:
                    names.add(name)
            except OSError:
                pass
    return names


# -- the incident's checkpoint, then the patch ------------------------------------------------


def test_default_checkpoint_fails_at_launch_and_the_diagnosis_points_to_the_patch(
    rig: Rig,
) -> None:
    patch.restore_patch(rig.host, rig.dep.model_path)
    can = server.check_can_start(preflight.gather_facts(rig.host, rig.dep), rig.port)
    assert can.ok, str(can)

    started = rig.start()
    assert not started.ok
    assert started.message.startswith("crashed within seconds (exit code 1)")
    diagnosis = started.diagnosis
    assert diagnosis.failure == "fp8kv-mla"
    assert "kv_cache_dtype=fp8_e4m3" in diagnosis.line.raw
    assert "TRITON_MLA" in rig.host.read_text(rig.paths.log)
    assert "02_config_patch" in started.findings[0].remedy

    verdict = rig.wait()
    assert not verdict.ok and verdict.message.startswith("failed: FP8 KV cache")
    state = rig.state()
    assert state.state == "crashed" and state.diagnosis is not None
    assert state.diagnosis.failure == "fp8kv-mla"
    assert "02_config_patch" in state.diagnosis.remedy


def test_after_the_patch_the_server_is_ready_and_answers_the_smoke_test(
    rig: Rig, patched: None
) -> None:
    began = time.monotonic()
    started = rig.start()
    proof_seconds = time.monotonic() - began
    assert started.ok, str(started)
    assert proof_seconds < 4.0
    record, proof = started.record, started.proof
    assert record is not None and proof is not None
    assert proof.alive and proof.log_exists and proof.log_bytes > 0
    pid = record.pid
    # Detached in a session and process group of its own, logging to the deployment's log.
    assert record.pgid == pid == int(stat_fields(pid)[3])
    assert record.log == rig.paths.log
    assert "vllm serve" in json.loads(rig.record_file.read_text())["cmdline"]

    seen: list[server.Progress] = []
    ready = rig.wait(on_progress=seen.append)
    assert ready.ok, str(ready)
    assert seen and seen[-1].state == "ready" and seen[-1].phase == "ready"

    smoke = server.smoke_test(rig.host, rig.port)
    assert smoke.ok, str(smoke)
    assert [f.subject for f in smoke.findings] == ["/health", "/v1/models", "/v1/completions"]
    assert smoke.model == rig.dep.model_path and smoke.completion

    table = server.timeline(ready.diagnosis.phases)
    names = [row[0] for row in table.rows]
    assert names[0] == "args" and names[-1] == "ready" and "weights" in names
    assert table.rows[0][1] == 0.0 and table.rows[-1][2] is None

    assert rig.state().state == "ready"
    again = rig.start()
    assert not again.ok and f"still running (PID {pid})" in again.message

    stopped = server.stop_server(rig.host, rig.paths, grace=5)
    assert stopped.ok and stopped.message == "stopped 10 process(es) with SIGTERM"
    assert group(pid) == []
    assert rig.state().state == "exited"


# -- the stop ---------------------------------------------------------------------------------


def test_a_stop_takes_the_orphans_of_its_launch_and_nothing_else(rig: Rig, patched: None) -> None:
    started, _ = rig.start_ready()
    pid = started.record.pid
    orphans = set(group(pid)) - {pid}
    assert len(orphans) == 9
    os.kill(pid, signal.SIGKILL)
    until(lambda: not alive(pid), "the API server gone")
    lookalikes = [
        named_like_vllm(rig.box.user, LOOKALIKE),
        named_like_vllm(rig.box.user, "VLLM::EngineCore"),
    ]
    try:
        state = rig.state()
        assert state.state == "exited"
        assert "9 of its processes still run (orphans" in state.message
        assert {p.pid for p in state.others} >= {p.pid for p in lookalikes}

        stopped = server.stop_server(rig.host, rig.paths, grace=5)
        assert stopped.ok, str(stopped)
        assert {row["pid"] for row in stopped.stopped.records()} == orphans
        assert set(group(pid)) == set()
        for proc in lookalikes:
            assert alive(proc.pid)
            assert any(
                f.subject == f"PID {proc.pid}" and "left alone" in f.message
                for f in stopped.findings
            )

        # SIGKILL left the API server's semaphores in /dev/shm; nothing holds them now.
        uid = pwd.getpwnam(rig.box.user).pw_uid
        assert shm_files(uid)
        cleaned = server.clean_stale_shm(rig.host)
        assert cleaned.ok and cleaned.answer.removed
        assert shm_files(uid) == set()
    finally:
        for proc in lookalikes:
            end(proc)


def test_a_server_that_ignores_sigterm_gets_sigkill(rig: Rig, patched: None) -> None:
    rig.deploy(OPSBOOK_SIM_FAULT="ignore-sigterm")
    started, _ = rig.start_ready()
    pid = started.record.pid
    stopped = server.stop_server(rig.host, rig.paths, grace=1)
    assert stopped.ok, str(stopped)
    assert stopped.answer.signals == ["TERM", "KILL"]
    assert "SIGTERM+KILL" in stopped.message
    assert group(pid) == []


def test_another_users_server_on_the_port_is_named_reported_and_left_alone(rig: Rig) -> None:
    argv = [
        "/usr/bin/python3",
        "-c",
        LISTENER,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--port",
        str(rig.port),
    ]
    other = spawn_as("nobody", argv)
    try:
        until(lambda: listening(rig.port), f"nobody listening on {rig.port}")
        can = server.check_can_start(preflight.gather_facts(rig.host, rig.dep), rig.port)
        assert not can.ok
        assert any("a process of user nobody" in f.message for f in can.findings)

        started = rig.start()
        assert not started.ok
        assert f"port {rig.port} is already taken by a process of uid 65534" in started.message

        stopped = server.stop_server(rig.host, rig.paths)
        assert stopped.ok, str(stopped)
        assert any(
            f.subject == f"PID {other.pid}" and "another user" in f.message
            for f in stopped.findings
        )

        # A record that names the other user's process (edited by hand, or a reused PID).
        ticks = int(stat_fields(other.pid)[19])
        with rig.record_kept():
            for start, reason in ((ticks, "another user"), (ticks + 1, "another process")):
                rig.write_record({"pid": other.pid, "pgid": other.pid, "start": start})
                refused = server.stop_server(rig.host, rig.paths, grace=1)
                assert not refused.ok and reason in refused.message, str(refused)
        assert alive(other.pid)
    finally:
        end(other)


def test_a_stop_never_signals_its_own_session(rig: Rig) -> None:
    write_record = (
        "import json, os, sys; p = os.getppid(); s = open(f'/proc/{p}/stat').read(); "
        "t = s[s.rindex(')') + 2:].split(); "
        "json.dump({'pid': p, 'pgid': int(t[2]), 'start': int(t[19])}, open(sys.argv[1], 'w'))"
    )
    program = probes.assemble("launch", rig.paths.probe_args(op="stop", grace=1))
    with rig.record_kept():
        # The record names the very shell that then runs the stop probe.
        rig.host.run(f"mkdir -p -- {shlex.quote(rig.paths.state_dir)}", check=True)
        done = rig.host.run(
            f"python3 -c {shlex.quote(write_record)} {shlex.quote(str(rig.record_file))}"
            " && exec python3 -",
            stdin=program,
        )
        answer = probes.decode("launch", done.stdout, done.stderr, done.exit_code)
        stop = StopAnswer.parse(answer)
        assert stop.reason == "own-session" and not stop.stopped
        assert rig.host.run("echo still here").stdout == "still here\n"


def test_stale_shm_files_are_removed_under_a_zsh_login_shell(rig: Rig) -> None:
    token = os.urandom(4).hex()
    # The incident's way: zsh aborts `rm -f /dev/shm/psm_*` when the glob matches nothing.
    plain = subprocess.run(
        rig.box.ssh_command(f"rm -f /dev/shm/psm_none{token}*"),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert plain.returncode != 0 and "no matches found" in plain.stderr

    stale, held, foreign = f"psm_stale{token}", f"sem.mp-held{token}", f"psm_root{token}"
    rig.host.run(f": > /dev/shm/{stale}", check=True)
    holder = spawn_as(
        rig.box.user,
        [
            "/usr/bin/python3",
            "-c",
            f"f = open('/dev/shm/{held}', 'w'); import time; time.sleep(60)",
        ],
    )
    Path(f"/dev/shm/{foreign}").write_text("")
    try:
        until(lambda: Path(f"/dev/shm/{held}").exists(), "the held file")
        dry = server.clean_stale_shm(rig.host, apply=False)
        assert dry.ok and stale in [r.file for r in dry.answer.removed]
        assert Path(f"/dev/shm/{stale}").exists()

        cleaned = server.clean_stale_shm(rig.host)
        assert cleaned.ok and stale in [r.file for r in cleaned.answer.removed]
        kept = {k.file: k.why for k in cleaned.answer.kept}
        assert kept[held] == f"open in process {holder.pid}"
        assert kept[foreign] == "belongs to uid 0"
        assert not Path(f"/dev/shm/{stale}").exists()

        nothing = server.clean_stale_shm(rig.host)
        assert nothing.ok and nothing.message.startswith("removed 0 stale file(s)")
    finally:
        end(holder)
        for name in (stale, held, foreign):
            Path(f"/dev/shm/{name}").unlink(missing_ok=True)


# -- start faults -----------------------------------------------------------------------------


def test_a_missing_or_broken_script_never_starts_and_says_why(rig: Rig) -> None:
    rig.host.run(f"rm -f -- {rig.paths.script}", check=True)
    missing = rig.start()
    assert not missing.ok and "does not exist" in missing.message
    assert "03_launch_script" in missing.message

    rig.host.upload(rig.paths.script, render_script(rig.dep), mode=0o644)
    assert "is not executable" in rig.start().message

    try:
        rig.host.upload(rig.paths.script, "#!/bin/bash\nexit 3\n", mode=0o755)
        silent = rig.start()
        assert silent.message == "never started: exited with code 3 and logged nothing"
        assert rig.state().state == "never started"

        rig.host.upload(
            rig.paths.script, "#!/bin/bash\necho 'python3: not found' >&2\nexit 127\n", mode=0o755
        )
        said = rig.start()
        assert said.message == "exited at once with code 127: python3: not found"
        assert rig.state().state == "never started"
    finally:
        # Scripts written by hand are not opsbook's: the next tests' uploads would leave them.
        rig.host.run(f"rm -f -- {rig.paths.script}", check=True)


def test_a_server_that_dies_one_second_after_starting(rig: Rig, patched: None) -> None:
    rig.deploy(OPSBOOK_SIM_FAULT="die-after-1s", OPSBOOK_SIM_STARTUP_SECONDS="5")
    started = rig.start()
    assert not started.ok
    assert started.message.startswith("crashed within seconds (exit code 1)"), started.message
    assert started.diagnosis.failure is not None
    pgid = started.record.pgid
    until(lambda: group(pgid) == [], "the whole launch gone")
    verdict = rig.wait()
    assert not verdict.ok and verdict.message.startswith("failed: ")
    assert rig.state().state == "crashed"


def test_a_server_that_hangs_gets_a_timeout_verdict(rig: Rig, patched: None) -> None:
    rig.deploy(OPSBOOK_SIM_FAULT="hang", OPSBOOK_SIM_STARTUP_SECONDS="2")
    assert rig.start().ok
    verdict = rig.wait(timeout=3)
    assert not verdict.ok and verdict.message.startswith("not ready after 3 s"), verdict.message
    assert "raise the timeout" in verdict.findings[0].remedy
    assert rig.state(silent_after=0.5).state == "hung"


def test_bad_input_reaches_the_server_literally(rig: Rig, patched: None) -> None:
    link = rig.box.dir / "models" / 'Kimi K2.5 "quoted" it\'s'
    link.symlink_to(rig.box.model_path)
    marker = rig.box.dir / f"pwned-{os.getpid()}"
    name = f"kimi $(touch {marker}) `touch {marker}`"
    dep = dataclasses.replace(
        rig.dep, model_path=str(link), serve_args={**rig.dep.serve_args, "served-model-name": name}
    )
    try:
        rig.upload(dep)
        rig.start_ready()
        smoke = server.smoke_test(rig.host, rig.port)
        assert smoke.ok and smoke.model == name, str(smoke)
        assert str(link) in json.loads(rig.record_file.read_text())["cmdline"]
        assert not marker.exists()
    finally:
        server.stop_server(rig.host, rig.paths, grace=2)
        link.unlink()


def test_the_wait_survives_a_dropped_ssh_connection_and_reattaches_by_pid(
    rig: Rig, patched: None
) -> None:
    rig.deploy(OPSBOOK_SIM_STARTUP_SECONDS="6")
    started = rig.start()
    assert started.ok, str(started)
    pid = started.record.pid
    cuts: list[float] = []

    def cut_the_connection() -> None:
        # Cut often enough that some cuts land while a probe is running on the channel (the
        # watch waits on the host, so most do); the wait reconnects after a pause.
        deadline = time.monotonic() + 4.5
        while len(cuts) < 4 and time.monotonic() < deadline:
            time.sleep(0.15)
            conn = rig.host._conn
            transport = conn.client.get_transport() if conn is not None else None
            if transport is not None and transport.is_authenticated():
                transport.close()
                cuts.append(time.monotonic())

    cutter = threading.Thread(target=cut_the_connection)
    cutter.start()
    try:
        ready = rig.wait(interval=0.1)
    finally:
        cutter.join()
    assert len(cuts) >= 3, "the connection was hardly cut"
    assert ready.ok, str(ready)
    assert ready.status.record.pid == pid
    cut_mid_probe = [e for e in rig.host.journal.entries if e.note.startswith("connection dropped")]
    assert cut_mid_probe, "no cut landed while a probe ran"

    # A new session later finds the same server by its recorded PID.
    with Host.from_deployment(rig.dep) as again:
        state = triage.server_state(again, rig.paths, rig.port)
    assert state.state == "ready" and state.processes[0].pid == pid


def test_a_traceback_logged_before_readiness_ends_ready_with_a_warning(
    rig: Rig, patched: None
) -> None:
    # vLLM's traceback of a plugin that fails to load (vllm/plugins/__init__.py), logged at
    # ERROR as the server starts; the server then comes up and serves.
    rig.deploy(OPSBOOK_SIM_FAULT="plugin-error")
    started = rig.start()
    assert started.ok, str(started)
    ready = rig.wait()
    assert ready.ok, ready.message
    assert "past 1 error(s) logged before readiness" in ready.message
    [warning] = ready.findings
    assert warning.severity == "warning"
    assert "ModuleNotFoundError: No module named 'paddlex_genai_plugin'" in warning.message
    number = int(warning.message.split("at line ")[1].split(":")[0])
    # The follower numbers the lines of this launch's part of the log, which is appended to.
    log = rig.host.read_text(rig.paths.log).encode()[started.record.log_offset :].decode()
    assert "paddlex_genai_plugin" in log.splitlines()[number - 1]
    assert server.smoke_test(rig.host, rig.port).ok


def test_04_launch_keeps_the_warning_in_its_record(rig: Rig, patched: None) -> None:
    from opsbook import stages

    rig.deploy(OPSBOOK_SIM_FAULT="plugin-error")
    launched = stages.run_stage(
        stages.get("launch"), rig.dep, on_result=None, apply=True, ready_timeout=30
    )
    [result] = launched.results
    assert result.state.value == "changed", result.message
    warnings = [f for f in result.findings if f.severity == "warning"]
    assert len(warnings) == 1 and "paddlex_genai_plugin" in warnings[0].message
