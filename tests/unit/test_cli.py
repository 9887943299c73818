"""The thin CLI: what it prints for a fleet run, and what it refuses."""

from pathlib import Path

import pytest

from opsbook import cli, run
from opsbook.results import Finding, HostResult, State


def test_a_failed_host_line_carries_its_remedy(capsys) -> None:
    problem = Finding("error", "shard 1", "truncated", "download this shard again")
    cli._print_result(
        HostResult("ops@a", "download", State.FAILED, "1 truncated", findings=(problem,))
    )
    cli._print_result(HostResult("ops@b", "download", State.OK, "all 119 shards complete"))
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:3] == ["download", "ops@a", "failed"]
    assert lines[1].strip() == "remedy: download this shard again"
    assert lines[2].split()[:3] == ["download", "ops@b", "ok"] and len(lines) == 3


def test_the_recap_has_a_line_per_host(capsys) -> None:
    record = run.RunRecord(
        folder=Path("/r"),
        notebook="deploy",
        exit_code=4,
        status="host unreachable",
        message="m",
        duration=1.0,
        results=[
            HostResult("ops@a", "preflight", State.OK, ""),
            HostResult("ops@bb", "preflight", State.UNREACHABLE, "refused"),
        ],
    )
    cli._print_recap(record)
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "RECAP"
    assert out[1] == "ops@a  ok=1  changed=0  failed=0  unreachable=0  skipped=0"
    assert out[2].startswith("ops@bb ok=0  changed=0  failed=0  unreachable=1")
    assert out[3] == "host unreachable: m"


@pytest.mark.parametrize("argv", [["-p", "hosts", "[a]"], ["-p", "serial", "-1"], ["--forks", "0"]])
def test_bad_deploy_arguments_are_refused(argv, tmp_path, capsys) -> None:
    dep = tmp_path / "d.yml"
    dep.write_text("hosts: [127.0.1.250]\nmodel: {path: /m}\n")  # loopback, should it ever run
    try:
        code = cli.main(
            ["run", "deploy", "-f", str(dep), "--runs-dir", str(tmp_path / "runs"), *argv]
        )
    except SystemExit as e:  # argparse refuses --forks 0 itself
        code = e.code
    assert code == run.EXIT_USAGE
    assert not (tmp_path / "runs").exists()


def test_a_multinode_rehearsal_of_one_host_is_refused(tmp_path, capsys) -> None:
    code = cli.main(["sandbox", "up", "--dir", str(tmp_path / "box"), "--multinode"])
    assert code == run.EXIT_USAGE
    assert "at least 2 hosts" in capsys.readouterr().err
    assert not (tmp_path / "box").exists()


def test_cluster_commands_refuse_a_deployment_without_a_cluster(tmp_path, capsys) -> None:
    dep = tmp_path / "d.yml"
    dep.write_text("hosts: [127.0.6.250]\nmodel: {path: /m}\n")  # loopback, should it ever run
    assert cli.main(["cluster", "stop", "-f", str(dep)]) == run.EXIT_USAGE
    assert "has no cluster section" in capsys.readouterr().err
