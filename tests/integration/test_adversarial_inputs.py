"""Bad inputs and secrets against a real rehearsal host (issue 13): a key given in
``server.env`` never reaches a record or the launch script, the secrets file follows the
deployment (rewritten, or removed when it has none) so an old API key stops working, run
folders are the operator's alone, and a parameter or deployment value that does not fit exits
2 with the host untouched."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import stat
import string
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from opsbook import cli, launch, sandbox
from opsbook.deployment import load_deployment
from opsbook.hosts import Host
from opsbook.run import EXIT_OK, EXIT_USAGE, RunRecord, run_deploy
from opsbook.sandbox import Sandbox

pytestmark = pytest.mark.integration

ADDRESS = "127.0.2.1"
ALPHANUMERIC = string.ascii_letters + string.digits


def random_key() -> str:
    # No token-like prefix: only the declared values can mask it, not a pattern.
    return "".join(secrets.choice(ALPHANUMERIC) for _ in range(40))


@pytest.fixture(scope="module")
def box() -> Iterator[Sandbox]:
    folder = Path(tempfile.mkdtemp(prefix="opsbook-adversarial-", dir="/tmp"))
    try:
        yield sandbox.up(folder, address=ADDRESS)
    finally:
        sandbox.down(folder)
        shutil.rmtree(folder, ignore_errors=True)


def deployment_with(box: Sandbox, folder: Path, name: str, **env: str) -> Path:
    doc: dict[str, Any] = yaml.safe_load(box.deployment_path.read_text())
    doc["server"]["env"] = {**doc["server"]["env"], **env}
    path = folder / f"{name}.yml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def models_status(port: int, key: str | None) -> int:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/models")
    if key:
        request.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as error:
        return int(error.code)


def server_pid(deployment: Path) -> int:
    dep = load_deployment(deployment)
    with Host.from_deployment(dep) as host:
        state_dir = launch.resolve_paths(host, dep).state_dir
    return int(json.loads((Path(state_dir) / "launch.json").read_text())["pid"])


def files_holding(folder: Path, value: str) -> list[str]:
    return [
        str(p.relative_to(folder))
        for p in sorted(folder.rglob("*"))
        if p.is_file() and value.encode() in p.read_bytes()
    ]


@pytest.fixture(scope="module")
def keys(box: Sandbox, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Three deploys in turn: VLLM_API_KEY in server.env as K1, then as K2, then none."""
    folder = tmp_path_factory.mktemp("deployments")
    runs = tmp_path_factory.mktemp("runs")
    first, second = random_key(), random_key()
    stages: dict[str, Any] = {"K1": first, "K2": second, "port": None}
    try:
        with pytest.MonkeyPatch.context() as patch:
            for variable in ("VLLM_API_KEY", "HF_TOKEN", "OPENAI_API_KEY"):
                patch.delenv(variable, raising=False)
            one = deployment_with(box, folder, "one", VLLM_API_KEY=first)
            stages["one"] = run_deploy(one, runs / "one")
            stages["port"] = load_deployment(one).server_port
            stages["status_one"] = (
                models_status(stages["port"], None),
                models_status(stages["port"], first),
            )
            two = deployment_with(box, folder, "two", VLLM_API_KEY=second)
            stages["two"] = run_deploy(two, runs / "two")
            stages["status_two"] = (
                models_status(stages["port"], first),
                models_status(stages["port"], second),
            )
            three = deployment_with(box, folder, "three")
            stages["three"] = run_deploy(three, runs / "three")
            stages["status_three"] = models_status(stages["port"], None)
            stages["deployment"] = three
            yield stages
    finally:
        dep = load_deployment(box.deployment_path)
        with Host.from_deployment(dep) as host:
            launch.stop_server(host, launch.resolve_paths(host, dep))


def test_a_key_in_server_env_is_in_no_record_and_not_in_the_script(keys, box) -> None:
    record: RunRecord = keys["one"]
    assert record.exit_code == EXIT_OK, record.message
    assert files_holding(record.folder, keys["K1"]) == []
    script = Path(load_deployment(box.deployment_path).script_path)
    assert keys["K1"] not in script.read_text()
    assert keys["status_one"] == (401, 200)


def test_the_secrets_file_is_rewritten_so_the_old_key_stops_working(keys) -> None:
    record: RunRecord = keys["two"]
    assert record.exit_code == EXIT_OK, record.message
    assert keys["status_two"] == (401, 200)
    assert files_holding(record.folder, keys["K2"]) == []


def test_a_deployment_without_secrets_removes_the_old_file(keys, box) -> None:
    record: RunRecord = keys["three"]
    assert record.exit_code == EXIT_OK, record.message  # the smoke test needs no key
    assert keys["status_three"] == 200
    script = Path(load_deployment(box.deployment_path).script_path)
    assert not Path(f"{script}.env").exists()


def test_run_folders_are_sealed_private(keys) -> None:
    for name in ("one", "two", "three"):
        folder: Path = keys[name].folder
        for path in [folder, *folder.rglob("*")]:
            mode = stat.S_IMODE(path.lstat().st_mode)
            assert not mode & 0o077, f"{path} is {oct(mode)}"
            assert not mode & 0o222, f"{path} is {oct(mode)}"


def test_a_parameter_that_does_not_fit_leaves_the_server_alone(keys, tmp_path, capsys) -> None:
    deployment = keys["deployment"]
    before = server_pid(deployment)
    argv = ["run", "deploy", "-f", str(deployment), "--runs-dir", str(tmp_path / "runs")]
    assert cli.main([*argv, "-p", "apply", "maybe"]) == EXIT_USAGE
    assert "expected true or false" in capsys.readouterr().err
    assert server_pid(deployment) == before
    os.kill(before, 0)  # still running
    assert not (tmp_path / "runs").exists()


def test_a_quoted_false_never_writes_an_unknown_host_key(box, tmp_path, capsys) -> None:
    doc = yaml.safe_load(box.deployment_path.read_text())
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text("")
    doc["hosts"][0]["known_hosts"] = str(known_hosts)
    doc["hosts"][0]["trust_on_first_use"] = "false"
    deployment = tmp_path / "d.yml"
    deployment.write_text(yaml.safe_dump(doc))
    argv = ["run", "00_preflight", "-f", str(deployment), "--runs-dir", str(tmp_path / "runs")]
    assert cli.main(argv) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "hosts[0].trust_on_first_use" in err and "expected true or false" in err
    assert known_hosts.read_text() == ""
