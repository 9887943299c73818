"""Pure parts of the Host seam: the script and the words the login shell receives."""

import shutil
import subprocess
from pathlib import Path

import paramiko
import pytest

from opsbook.remote.commands import wire_command, wrap_command
from opsbook.remote.hosts import fingerprint, known_hosts_name

TRICKY = "echo \"$0\" 'single' $V; ls /no/such/dir/* 2>&1 | head -1; true && echo and; echo ';'"


def run_wire(shell: str, command: str, env: dict[str, str] | None = None) -> str:
    wire = wire_command(wrap_command(command, env), timeout=10)
    return subprocess.run([shell, "-c", wire], capture_output=True, text=True, check=True).stdout


@pytest.mark.parametrize("shell", ["bash", "zsh", "sh"])
def test_the_login_shell_does_not_change_what_runs(shell: str) -> None:
    if shutil.which(shell) is None:
        pytest.fail(f"{shell} is not installed; `make test` installs it")
    assert run_wire(shell, TRICKY, {"V": "x"}) == run_wire("bash", TRICKY, {"V": "x"})
    assert run_wire(shell, TRICKY, {"V": "x"}).splitlines()[0] == "bash single x"


def test_environment_values_reach_the_program_literally(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    value = f"$(touch {marker}) `touch {marker}` a&b; 'q' \"d\" \\"
    out = run_wire("zsh", 'printf %s "$VALUE"', {"VALUE": value})
    assert out == value
    assert not marker.exists()


def test_wire_command_is_plain_words() -> None:
    wire = wire_command("echo 'hi' \"$HOME\" `x` \\n", timeout=2.5)
    assert wire.startswith("timeout -k 5 3 bash -c '")
    inner = wire.split("'", 2)[1]
    assert "\\" not in inner and "`" not in inner


def test_bad_environment_name_is_refused() -> None:
    with pytest.raises(ValueError, match="not a valid environment variable name"):
        wrap_command("true", {"A-B": "1"})


def test_fingerprint_matches_ssh_keygen(tmp_path: Path) -> None:
    key_file = tmp_path / "k"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key_file)], check=True)
    listed = subprocess.run(
        ["ssh-keygen", "-lf", str(key_file) + ".pub"], capture_output=True, text=True, check=True
    ).stdout.split()[1]
    assert fingerprint(paramiko.Ed25519Key.from_private_key_file(str(key_file))) == listed


def test_known_hosts_name_brackets_non_default_ports() -> None:
    assert known_hosts_name("gpu-01", 22) == "gpu-01"
    assert known_hosts_name("127.0.0.1", 2222) == "[127.0.0.1]:2222"


def test_a_stopped_sshd_is_a_connect_timeout_naming_the_host() -> None:
    from opsbook.core.deployment import HostSpec
    from opsbook.core.exceptions import ConnectTimeout
    from opsbook.remote.hosts import Host

    host = Host(HostSpec(address="127.0.3.250", port=2222, user="ops", connect_timeout=7))
    error = host._translate_connect_error(paramiko.SSHException("No existing session"))
    assert isinstance(error, ConnectTimeout)
    assert error.host == "ops@127.0.3.250:2222"
    assert "did not answer within 7 s" in error.message
    assert "hung or stopped" in error.message


def test_host_is_a_host_of_the_one_protocol() -> None:
    from opsbook.core.deployment import HostSpec
    from opsbook.remote.hosts import Host
    from opsbook.remote.protocol import RemoteHost

    # The annotation is for mypy (which also checks it where HostGroup takes a Host).
    host: RemoteHost = Host(HostSpec(address="127.0.3.250"))
    assert isinstance(host, RemoteHost)


def test_a_group_records_in_the_journal_it_is_given_even_before_its_first_entry(
    tmp_path: Path,
) -> None:
    from opsbook.core.deployment import parse_deployment
    from opsbook.remote.hosts import HostGroup
    from opsbook.remote.journal import Journal

    deployment = parse_deployment(
        {"hosts": [{"address": "127.0.0.9", "user": "u"}], "model": {"path": "/m"}}
    )
    given = Journal(path=tmp_path / "journal.jsonl")
    group = HostGroup.from_deployment(deployment, 1, journal=given)
    assert len(given) == 0  # empty, so falsy: the group must not take another
    assert all(host.journal is given for host in group.hosts)
