"""The shipped test doubles of Host: FakeHost answers only what it was told, LocalHost is this
machine; both are hosts of the one protocol and record what they got."""

import os
import stat
from pathlib import Path

import pytest

from opsbook.core.exceptions import (
    CommandTimeout,
    ConnectionRefused,
    HostError,
    ProbeError,
    TransferError,
)
from opsbook.remote.protocol import RemoteHost
from opsbook.remote.testing import Answer, FakeHost, LocalHost, UnexpectedCall, local_probe


def test_the_doubles_are_hosts_of_the_one_protocol(tmp_path: Path) -> None:
    # The annotations are for mypy (run over this file); isinstance checks the members here.
    hosts: list[RemoteHost] = [FakeHost(), LocalHost(home=tmp_path)]
    assert all(isinstance(host, RemoteHost) for host in hosts)


def test_commands_are_answered_by_the_first_matching_pattern() -> None:
    host = FakeHost(
        commands={r"^bash -n": "", r"sha256sum": Answer("abc\n"), "false": Answer(exit_code=1)}
    )
    assert host.run("sha256sum -- x").stdout == "abc\n"
    assert not host.run("false").ok
    assert host.calls == [("run", "sha256sum -- x"), ("run", "false")]
    with pytest.raises(UnexpectedCall, match="rm -rf"):
        host.run("rm -rf /")


def test_probes_answer_a_value_a_function_of_their_arguments_or_raise() -> None:
    boom = ProbeError("no python", host="gpu-01")
    host = FakeHost(probes={"facts": {"a": 1}, "launch": lambda args: args["op"], "configs": boom})
    assert host.probe("facts") == {"a": 1}
    assert host.probe("launch", {"op": "status"}) == "status"
    with pytest.raises(ProbeError):
        host.probe("configs")
    with pytest.raises(UnexpectedCall):
        host.probe("download")
    assert [name for name, _ in host.probe_args] == ["facts", "launch", "configs", "download"]


def test_files_uploaded_can_be_read_back_and_missing_ones_raise() -> None:
    host = FakeHost(files={"/etc/x": "one"})
    host.upload("/srv/launch.sh", "#!/bin/bash\n", mode=0o755)
    assert host.read_text("/srv/launch.sh") == "#!/bin/bash\n" and host.read_text("/etc/x") == "one"
    with pytest.raises(TransferError):
        host.read_bytes("/nope")


def test_an_unreachable_host_refuses_every_call() -> None:
    host = FakeHost("gpu-02", unreachable=True)
    with pytest.raises(ConnectionRefused):
        host.probe("facts")
    with pytest.raises(ConnectionRefused):
        host.home_folder()


def test_a_local_probe_runs_the_real_probe_here(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    host = FakeHost(probes={"download": local_probe("download")})
    answer = host.probe("download", {"op": "check", "path": str(tmp_path)})
    assert answer["summary"]["shards"] == 0


def test_a_local_host_runs_commands_under_bash_with_their_variables_and_input(
    tmp_path: Path,
) -> None:
    host = LocalHost(home=tmp_path)
    done = host.run(
        '[[ -n $V ]] && printf "%s|%s|" "$V" "$HOME" && cat', env={"V": "a b"}, stdin="in"
    )
    assert done.ok and done.stdout == f"a b|{tmp_path}|in" and done.host == host.name
    assert host.run("echo oops >&2; exit 3", label="shown").command == "shown"
    with pytest.raises(HostError, match="exit code 3") as failed:
        host.run("echo oops >&2; exit 3", check=True)
    assert "stderr: oops" in failed.value.message
    with pytest.raises(CommandTimeout):
        host.run("sleep 5", timeout=1)
    assert [kind for kind, _ in host.calls] == ["run"] * 4


def test_a_local_host_writes_files_as_host_upload_does_and_reads_them_back(tmp_path: Path) -> None:
    host = LocalHost(home=tmp_path)
    host.upload("~/launch.sh", "#!/bin/bash\n", mode=0o755)
    host.upload("relative.txt", b"bytes")
    assert stat.S_IMODE((tmp_path / "launch.sh").stat().st_mode) == 0o755
    assert host.read_text(f"{tmp_path}/launch.sh") == "#!/bin/bash\n"
    assert host.read_bytes("relative.txt") == b"bytes"
    assert sorted(os.listdir(tmp_path)) == ["launch.sh", "relative.txt"]  # no temp file left
    with pytest.raises(TransferError):
        host.read_bytes("nope")
    with pytest.raises(TransferError):
        host.upload("no/such/folder/x", "x")
    assert host.home_folder() == str(tmp_path)


def test_a_local_host_runs_the_real_probe_with_the_local_python(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    host = LocalHost()
    answer = host.probe("download", {"op": "check", "path": str(tmp_path)}, python="python9")
    assert answer["summary"]["shards"] == 0
    assert host.calls == [("probe", "download")] and host.probe_args[0][1]["op"] == "check"
