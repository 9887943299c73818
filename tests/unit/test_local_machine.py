"""``address: local``: this machine as a host, without SSH, sending every command as Host does
(quoted, base64, under a timeout), journalled and redacted, each in a session of its own."""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path

import pytest

from opsbook.core.channel import OUTCOME_ENV
from opsbook.core.deployment import HostSpec, load_deployment
from opsbook.core.exceptions import CommandTimeout, HostError, ProbeError, TransferError
from opsbook.core.redact import Redactor
from opsbook.remote import hosts
from opsbook.remote.hosts import HostGroup, open_ahead
from opsbook.remote.journal import Journal
from opsbook.remote.local_machine import LocalMachine, command_environment, is_local
from opsbook.remote.protocol import RemoteHost

SPEC = HostSpec(address="local", command_timeout=30)


def machine(home: Path, secrets: tuple[str, ...] = (), **environ: str) -> LocalMachine:
    env = {**os.environ, "HOME": str(home), **environ}
    return LocalMachine(SPEC, secrets, Journal(Redactor(secrets)), environ=env)


def test_it_is_a_host_of_the_one_protocol(tmp_path: Path) -> None:
    host: RemoteHost = machine(tmp_path)
    assert isinstance(host, RemoteHost)
    assert host.name == "local" and is_local(host.spec)


def test_a_value_reaches_the_command_literally(tmp_path: Path) -> None:
    tricky = 'it\'s $HOME `id` "quoted" ; rm -rf /nope *'
    result = machine(tmp_path).run('printf %s "$V"', env={"V": tricky})
    assert result.ok and result.stdout == tricky


def test_commands_are_journalled_with_secrets_masked(tmp_path: Path) -> None:
    host = machine(tmp_path, secrets=("s3cr3t-value",))
    host.run("echo s3cr3t-value", label="echo the token")
    entry = host.journal.entries[-1]
    assert (entry.host, entry.kind, entry.command, entry.exit_code) == (
        "local",
        "run",
        "echo the token",
        0,
    )
    assert "s3cr3t-value" not in entry.stdout_tail


def test_a_failed_command_raises_when_checked_and_names_its_stderr(tmp_path: Path) -> None:
    host = machine(tmp_path)
    assert host.run("exit 3").exit_code == 3
    with pytest.raises(HostError, match=r"exit code 3[\s\S]*went wrong"):
        host.run("echo went wrong >&2; exit 3", check=True)


def test_a_command_past_its_timeout_is_stopped(tmp_path: Path) -> None:
    started = time.monotonic()
    with pytest.raises(CommandTimeout, match="timed out after 1 s"):
        machine(tmp_path).run("sleep 30", timeout=1)
    assert time.monotonic() - started < 10


def test_a_background_process_holding_the_output_does_not_hold_the_call(tmp_path: Path) -> None:
    # A server started in the background keeps the output open; over SSH the command is over
    # at its exit status, and so it is here.
    pid_file = tmp_path / "pid"
    started = time.monotonic()
    result = machine(tmp_path).run(f"sleep 30 & echo $! > {pid_file}; echo started")
    took = time.monotonic() - started
    os.kill(int(pid_file.read_text()), 15)  # the sleep this test started, by its PID
    assert result.stdout == "started\n"
    assert took < 5


def test_a_command_starts_in_the_home_folder_as_over_ssh(tmp_path: Path) -> None:
    (tmp_path / "opsbook").mkdir()
    (tmp_path / "opsbook" / "launch.sh").write_text("exit 0\n")
    host = machine(tmp_path)
    assert host.run("pwd").stdout == f"{tmp_path}\n"
    assert host.run("bash -n opsbook/launch.sh").ok
    assert machine(tmp_path / "gone").run("pwd").stdout == "/\n"


def test_each_command_runs_in_a_session_of_its_own(tmp_path: Path) -> None:
    answer = machine(tmp_path).run("python3 -c 'import os; print(os.getsid(0))'")
    assert int(answer.stdout) != os.getsid(0)


def test_opsbook_run_variables_are_not_passed_on(tmp_path: Path) -> None:
    host = machine(tmp_path, **{OUTCOME_ENV: "/tmp/results.jsonl", "KEPT": "yes"})
    said = host.run(f'printf "%s|%s" "${{{OUTCOME_ENV}:-unset}}" "$KEPT"').stdout
    assert said == "unset|yes"
    assert OUTCOME_ENV not in command_environment({OUTCOME_ENV: "x", "PATH": "/bin"})


def test_a_probe_runs_with_the_interpreter_named_and_is_journalled(tmp_path: Path) -> None:
    host = machine(tmp_path)
    answer = host.probe("download", {"op": "check", "path": str(tmp_path)}, python="python3")
    assert isinstance(answer, dict)
    assert host.journal.entries[-1].command.startswith("probe download (python3 -)")
    with pytest.raises(ProbeError, match="exit code 127"):
        host.probe("download", {"op": "check", "path": str(tmp_path)}, python="python9")


def test_files_are_written_atomically_with_their_mode_relative_to_home(tmp_path: Path) -> None:
    host = machine(tmp_path)
    (tmp_path / "opsbook").mkdir()
    host.upload("opsbook/launch.sh", "#!/bin/bash\n", mode=0o700)
    written = tmp_path / "opsbook" / "launch.sh"
    assert stat.S_IMODE(written.stat().st_mode) == 0o700
    assert host.read_text("~/opsbook/launch.sh") == "#!/bin/bash\n"
    assert [p.name for p in written.parent.iterdir()] == ["launch.sh"]
    assert host.home_folder() == str(tmp_path)
    kinds = [e.kind for e in host.journal.entries]
    assert kinds == ["upload", "download"]


def test_a_missing_folder_or_file_is_a_transfer_error(tmp_path: Path) -> None:
    host = machine(tmp_path)
    with pytest.raises(TransferError, match="could not write nowhere/x"):
        host.upload("nowhere/x", "y")
    with pytest.raises(TransferError, match="could not read gone"):
        host.read_bytes("gone")


def test_a_local_deployment_host_is_this_machine_and_no_connection_is_opened(
    tmp_path: Path,
) -> None:
    path = tmp_path / "d.yml"
    path.write_text(json.dumps({"hosts": ["local", "gpu-02"], "model": {"path": "/m"}}))
    group = HostGroup.from_deployment(load_deployment(path), journal=Journal())
    assert [type(h) for h in group.hosts] == [LocalMachine, hosts.Host]
    assert open_ahead([SPEC]) == []
