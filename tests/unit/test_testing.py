"""The shipped test double of Host answers only what it was told, and records what it got."""

import pytest

from opsbook.core.exceptions import ConnectionRefused, ProbeError, TransferError
from opsbook.remote.testing import Answer, FakeHost, UnexpectedCall, local_probe


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


def test_a_local_probe_runs_the_real_probe_here(tmp_path) -> None:
    (tmp_path / "config.json").write_text("{}")
    host = FakeHost(probes={"download": local_probe("download")})
    answer = host.probe("download", {"op": "check", "path": str(tmp_path)})
    assert answer["summary"]["shards"] == 0
