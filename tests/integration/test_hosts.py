"""The Host seam over real SSH to the rehearsal host (a real sshd, zsh login shell)."""

import os
import shutil
import signal
import socket
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from opsbook.core.deployment import HostSpec, load_deployment
from opsbook.core.exceptions import (
    AuthenticationFailed,
    CommandTimeout,
    ConnectionRefused,
    HostKeyChanged,
    HostKeyUnknown,
    HostUnreachable,
    ProbeError,
    TransferError,
    UnknownHostName,
)
from opsbook.remote import hosts
from opsbook.remote.hosts import Host, close_kept_connections, open_ahead
from opsbook.steps.host_facts import facts_from_probe

pytestmark = pytest.mark.integration

TRICKY = (
    'echo "$0" \'it\'"\'"\'s\' "$HOME" | sed "s|$HOME|~|"; ls /no/such/* 2>&1 | head -1; '
    "false && echo never; echo $((6*7)); echo *.nomatch"
)


def host_of(box) -> Host:
    return Host.from_deployment(load_deployment(box.deployment_path))


def login_shell(host: Host) -> str:
    return host.run('getent passwd "$(id -un)" | cut -d: -f7', check=True).stdout.strip()


def test_same_command_same_result_under_zsh_and_bash_login_shells(sandbox, bash_sandbox) -> None:
    with host_of(sandbox) as zsh_host, host_of(bash_sandbox) as bash_host:
        assert login_shell(zsh_host).endswith("zsh")
        assert login_shell(bash_host).endswith("bash")
        on_zsh, on_bash = zsh_host.run(TRICKY), bash_host.run(TRICKY)
    assert on_zsh.stdout == on_bash.stdout
    assert on_zsh.exit_code == on_bash.exit_code == 0
    assert on_zsh.stdout.splitlines() == [
        "bash it's ~",
        "ls: cannot access '/no/such/*': No such file or directory",
        "42",
        "*.nomatch",
    ]


def test_environment_value_with_command_substitution_runs_nothing(sandbox) -> None:
    with host_of(sandbox) as host:
        marker = f"/tmp/opsbook-pwned-{time.time_ns()}"
        value = f"$(touch {marker}) `touch {marker}` a&b;c"
        out = host.run('printf %s "$V"; test -e "$M" && echo RAN', env={"V": value, "M": marker})
    assert out.stdout == value
    assert not Path(marker).exists()


def test_a_command_that_ends_before_reading_its_input_says_how_it_ended(sandbox) -> None:
    # A login shell that exits at once closes the channel while the probe is still being sent
    # (CI saw "Socket is closed"): that is the command's own end, not a dropped connection.
    with host_of(sandbox) as host:
        out = host.run("echo early; exit 3", stdin=b"x" * (8 << 20))
        assert (out.exit_code, out.stdout) == (3, "early\n")
        assert host.run("echo still-here").stdout == "still-here\n"


def test_the_connection_sends_each_message_at_once(sandbox, keeping) -> None:
    # Nagle's algorithm held a command's input end behind its data until the host's delayed
    # acknowledgement (40 ms a command): off on every connection, opened ahead or not.
    def nodelay(host: Host) -> int:
        sock = host.connect().client.get_transport().sock
        return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)

    with host_of(sandbox) as host:
        assert host.run("echo x", stdin="y").stdout == "x\n"
        assert nodelay(host) != 0
    spec = load_deployment(sandbox.deployment_path).hosts[0]
    [opening] = open_ahead([spec])
    opened = opening.result(timeout=30)
    with Host(spec) as ahead:
        assert ahead.connect() is opened
        assert nodelay(ahead) != 0


def test_output_written_after_the_command_exits_is_read_to_its_end(sandbox) -> None:
    # sshd reports the exit as soon as it sees it and forwards what is still in the pipe after:
    # here the shell exits at once and a child it leaves writes to the same output after it.
    with host_of(sandbox) as host:
        out = host.run("(sleep 0.2; echo late) & echo early")
    assert (out.exit_code, out.stdout) == (0, "early\nlate\n")


def test_a_background_process_holding_the_output_does_not_hold_the_command(sandbox) -> None:
    with host_of(sandbox) as host:
        started = host.run("sleep 60 & echo $!", check=True)
        pid = started.stdout.strip()
        try:
            # back while the sleep, which still holds the command's output, runs on
            assert host.run(f"kill -0 {pid} && echo running").stdout == "running\n"
        finally:
            host.run(f"kill {pid}")


def test_a_dropped_connection_ends_the_command_at_once(sandbox, monkeypatch) -> None:
    # A dropped connection closes the channel without an end of output: nothing more can come,
    # so the command must not wait for it (as it may for a background process holding it).
    monkeypatch.setattr(hosts, "OUTPUT_AFTER_EXIT", 60.0)
    with host_of(sandbox) as host:
        session = sshd_session(host)
        killer = threading.Timer(1.0, os.kill, (int(session), signal.SIGKILL))
        killer.start()
        started = time.monotonic()
        try:
            with pytest.raises(HostUnreachable):
                host.run("sleep 30")
        finally:
            killer.join()
        assert time.monotonic() - started < 20
        assert host.run("echo reconnected").stdout == "reconnected\n"


def test_a_hanging_command_times_out_and_the_host_stays_usable(sandbox) -> None:
    with host_of(sandbox) as host:
        started = time.monotonic()
        with pytest.raises(CommandTimeout) as e:
            host.run("sleep 600", timeout=2)
        assert time.monotonic() - started < 10
        assert "timed out after 2 s" in str(e.value) and e.value.remedy
        assert host.run("echo still-here").stdout == "still-here\n"
        assert host.journal.entries[-2].exit_code == 124


def test_unknown_host_key_is_refused_with_fingerprint_and_remedy(sandbox, tmp_path) -> None:
    dep = load_deployment(sandbox.deployment_path)
    spec = HostSpec(**{**dep.host.__dict__, "known_hosts": str(tmp_path / "empty")})
    with pytest.raises(HostKeyUnknown) as e, Host(spec) as host:
        host.run("true")
    assert e.value.fingerprint.startswith("SHA256:")
    assert e.value.fingerprint in str(e.value)
    assert ">> " in (e.value.remedy or "") and not (tmp_path / "empty").exists()


def test_trust_on_first_use_records_the_key_then_checks_it(sandbox, tmp_path) -> None:
    dep = load_deployment(sandbox.deployment_path)
    known = tmp_path / "kh"
    spec = HostSpec(**{**dep.host.__dict__, "known_hosts": str(known), "trust_on_first_use": True})
    with Host(spec) as host:
        assert host.run("true").ok
    assert f"[{dep.host.address}]:{dep.host.port} ssh-ed25519 " in known.read_text()


def test_changed_host_key_is_always_refused(sandbox, tmp_path) -> None:
    dep = load_deployment(sandbox.deployment_path)
    other = Path(shutil.copy(dep.host.known_hosts, tmp_path / "kh"))
    import subprocess

    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "k")])
    fake = (tmp_path / "k.pub").read_text().split()[:2]
    name = other.read_text().split()[0]
    other.write_text(f"{name} {fake[0]} {fake[1]}\n")
    spec = HostSpec(**{**dep.host.__dict__, "known_hosts": str(other), "trust_on_first_use": True})
    with pytest.raises(HostKeyChanged) as e, Host(spec) as host:
        host.run("true")
    assert "CHANGED" in str(e.value) and "ssh-keygen -R" in (e.value.remedy or "")


def test_wrong_key_is_an_authentication_failure(sandbox, tmp_path) -> None:
    import subprocess

    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "k")])
    dep = load_deployment(sandbox.deployment_path)
    spec = HostSpec(**{**dep.host.__dict__, "key": str(tmp_path / "k")})
    with pytest.raises(AuthenticationFailed) as e, Host(spec) as host:
        host.run("true")
    assert "authorized_keys" in (e.value.remedy or "")


def test_refused_and_unresolvable_hosts_are_named(sandbox) -> None:
    dep = load_deployment(sandbox.deployment_path)
    closed = HostSpec(**{**dep.host.__dict__, "port": 1})
    with pytest.raises(ConnectionRefused, match="port 1 refused"), Host(closed) as host:
        host.run("true")
    # A name glibc rejects before asking any resolver: no packet leaves the machine.
    nameless = HostSpec(**{**dep.host.__dict__, "address": "-no-such-host"})
    with pytest.raises(UnknownHostName, match="does not resolve"), Host(nameless) as host:
        host.run("true")


def test_upload_is_atomic_with_the_given_mode(sandbox) -> None:
    with host_of(sandbox) as host:
        home = host.run('printf %s "$HOME"').stdout
        target = f"{home}/upload test 'q'.sh"
        host.upload(target, "#!/bin/bash\necho hi\n", mode=0o750)
        listing = host.run(f"stat -c '%a %s' {_q(target)}; ls -a {_q(home)}").stdout
        assert listing.startswith("750 20\n")
        assert ".tmp" not in listing
        assert host.read_text(target) == "#!/bin/bash\necho hi\n"
        with pytest.raises(TransferError, match="could not write"):
            host.upload("/no/such/dir/x", "x")


def test_probe_answers_json_and_failures_carry_stderr(sandbox) -> None:
    with host_of(sandbox) as host:
        with pytest.raises(ProbeError) as e:
            host.probe("facts", python="/no/such/python")
        assert "No such file" in e.value.stderr or "not found" in e.value.stderr


def test_journal_redacts_secrets(sandbox, monkeypatch) -> None:
    token = "hf_" + "Zz9" * 12
    monkeypatch.setenv("HF_TOKEN", token)
    with host_of(sandbox) as host:
        host.run('echo "$HF_TOKEN"', env={"HF_TOKEN": token})
        entry = host.journal.entries[-1]
    assert token not in entry.command + entry.stdout_tail
    assert "***" in entry.stdout_tail


def _q(text: str) -> str:
    import shlex

    return shlex.quote(text)


def test_a_group_answers_per_host_and_one_failure_does_not_stop_the_others(
    sandbox, bash_sandbox
) -> None:
    from opsbook.remote.hosts import HostGroup

    good = [host_of(sandbox), host_of(bash_sandbox)]
    closed = Host(HostSpec(**{**good[0].spec.__dict__, "port": 1}))
    group = HostGroup([*good, closed])
    try:
        answers = group.run("id -un")
        facts = group.probe("facts", {"python": "python3", "model_path": "/", "ports": []})
    finally:
        group.close()
    assert [answers[h.name].stdout.strip() for h in good] == [sandbox.user, bash_sandbox.user]
    assert isinstance(answers[closed.name], ConnectionRefused)
    assert all(facts_from_probe(facts[h.name]).nvidia_smi_path for h in good)
    assert isinstance(facts[closed.name], ConnectionRefused)


# -- connections kept between the stages of a run --------------------------------------------


def sshd_session(host: Host) -> str:
    """The pid of the sshd serving this connection (the parent of the login shell's parent
    differs per connection, the same for every command on one connection)."""
    return host.run("ps -o ppid= -p $PPID", check=True).stdout.strip()


@pytest.fixture
def keeping(monkeypatch):
    monkeypatch.setenv("OPSBOOK_KEEP_CONNECTIONS", "1")
    yield
    close_kept_connections()


def test_with_keeping_on_a_closed_host_leaves_its_connection_to_the_next(
    sandbox, keeping, monkeypatch
) -> None:
    with host_of(sandbox) as first:
        session = sshd_session(first)
    with host_of(sandbox) as second:
        assert sshd_session(second) == session
    monkeypatch.delenv("OPSBOOK_KEEP_CONNECTIONS")
    with host_of(sandbox) as third:  # the kept one is not handed out without keeping
        assert sshd_session(third) != session


def test_a_connection_opened_ahead_is_the_first_hosts_and_only_its(sandbox, keeping) -> None:
    spec = load_deployment(sandbox.deployment_path).hosts[0]
    [opening] = open_ahead([spec])
    opened = opening.result(timeout=30)
    with Host(spec) as first:
        assert first.connect() is opened
        session = sshd_session(first)
    with Host(spec) as second:  # then kept as any closed Host's connection is
        assert sshd_session(second) == session


def test_a_connection_that_fails_ahead_fails_the_host_that_takes_it(sandbox, keeping) -> None:
    spec = replace(load_deployment(sandbox.deployment_path).hosts[0], port=1)
    [opening] = open_ahead([spec])
    assert isinstance(opening.exception(timeout=30), ConnectionRefused)
    host = Host(spec)
    with pytest.raises(ConnectionRefused):
        host.run("true")
    [entry] = host.journal.entries
    assert entry.kind == "connect" and entry.command == f"ssh {spec.name}"


def test_a_host_trusted_on_first_use_is_not_opened_ahead(sandbox) -> None:
    spec = load_deployment(sandbox.deployment_path).hosts[0]
    assert open_ahead([replace(spec, trust_on_first_use=True)]) == []


def test_a_connection_that_dropped_is_never_handed_on(sandbox, keeping) -> None:
    with host_of(sandbox) as first:
        session = sshd_session(first)
        conn = first.connect()
        os.kill(int(session), signal.SIGKILL)  # this connection's own sshd, of our rehearsal host
        deadline = time.monotonic() + 10
        while conn.is_connected and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not conn.is_connected
    with host_of(sandbox) as second:
        assert second.run("echo fresh").stdout == "fresh\n"
        assert sshd_session(second) != session
