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
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from opsbook import cli
from opsbook.core.deployment import load_deployment
from opsbook.rehearsal.sandbox import Sandbox
from opsbook.remote.hosts import Host
from opsbook.runner.run import EXIT_OK, EXIT_USAGE, RunRecord, run_deploy
from opsbook.steps import server
from tests.integration.conftest import models_status

pytestmark = pytest.mark.integration

ADDRESS = "127.0.2.1"
ALPHANUMERIC = string.ascii_letters + string.digits


def random_key() -> str:
    # No token-like prefix: only the declared values can mask it, not a pattern.
    return "".join(secrets.choice(ALPHANUMERIC) for _ in range(40))


def deployment_with(box: Sandbox, folder: Path, name: str, **env: str) -> Path:
    doc: dict[str, Any] = yaml.safe_load(box.deployment_path.read_text())
    doc["server"]["env"] = {**doc["server"]["env"], **env}
    path = folder / f"{name}.yml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def server_pid(deployment: Path) -> int:
    dep = load_deployment(deployment)
    with Host.from_deployment(dep) as host:
        state_dir = server.resolve_paths(host, dep).state_dir
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
            server.stop_server(host, server.resolve_paths(host, dep))


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


CONFIGS = ("config.json", "hf_quant_config.json", "tokenizer_config.json")


@pytest.fixture
def small_disk(box: Sandbox) -> Iterator[Path]:
    """A checkpoint's config files on a 256 kB tmpfs of their own, owned by the host's user, so
    that the disk can be filled."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    import pwd
    import subprocess

    account = pwd.getpwnam(box.user)
    folder = Path(tempfile.mkdtemp(prefix="opsbook-small-disk-", dir="/tmp"))
    folder.chmod(0o755)
    options = f"size=256k,mode=0755,uid={account.pw_uid},gid={account.pw_gid}"
    subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)], check=True)
    try:
        for name in CONFIGS:
            # The originals: an earlier deploy of this module may have patched the host's.
            original = box.model_path / f"{name}.opsbook-orig"
            source = original if original.exists() else box.model_path / name
            if source.exists():
                shutil.copy(source, folder / name)
                os.chown(folder / name, account.pw_uid, account.pw_gid)
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=False)
        folder.rmdir()


def config_patch(deployment: Path, runs: Path, *params: str) -> list[str]:
    argv = ["run", "02_config_patch", "-f", str(deployment), "--runs-dir", str(runs)]
    for pair in params:
        argv += ["-p", *pair.split("=")]
    return argv


def fill(folder: Path) -> None:
    """Write until the disk is full (ENOSPC), in pages, then in bytes."""
    for size in (4096, 1):
        try:
            with (folder / f"filler-{size}").open("wb", buffering=0) as f:
                while True:
                    f.write(b"\0" * size)
        except OSError:
            pass


def test_a_restore_tells_what_the_restored_config_will_do_and_a_failed_one_fails(
    box: Sandbox, small_disk: Path, tmp_path: Path, capsys
) -> None:
    doc = yaml.safe_load(box.deployment_path.read_text())
    doc["model"]["path"] = str(small_disk)
    deployment = tmp_path / "small.yml"
    deployment.write_text(yaml.safe_dump(doc))
    runs = tmp_path / "runs"
    original = (small_disk / "config.json").read_bytes()

    assert cli.main(config_patch(deployment, runs, "apply=true")) == EXIT_OK
    assert (small_disk / "config.json").read_bytes() != original
    capsys.readouterr()

    # The originals come back, and with them the failure the patch avoided: not "ok".
    code = cli.main(config_patch(deployment, runs, "restore=true"))
    out = capsys.readouterr().out
    assert (small_disk / "config.json").read_bytes() == original
    assert code == 1 and "the restored config is predicted to fail" in out, out
    assert "no known incompatibility" not in out.split("RECAP")[-1]

    assert cli.main(config_patch(deployment, runs, "apply=true")) == EXIT_OK
    patched = (small_disk / "config.json").read_bytes()
    fill(small_disk)
    capsys.readouterr()
    code = cli.main(config_patch(deployment, runs, "restore=true"))
    out = capsys.readouterr().out
    assert code != EXIT_OK, out
    assert "could not restore" in out and "No space left" in out, out
    assert (small_disk / "config.json").read_bytes() == patched  # untouched, not half-written
    assert [p.name for p in small_disk.iterdir() if ".tmp" in p.name] == []


def test_without_its_index_a_missing_shard_is_named_by_the_series(box, tmp_path, capsys) -> None:
    from opsbook.rehearsal.checkpoint import make_checkpoint, shard_name

    folder = Path(tempfile.mkdtemp(prefix="opsbook-no-index-", dir="/tmp"))
    try:
        folder.chmod(0o755)
        model = make_checkpoint(folder / "Kimi-K2.5-NVFP4")
        (model / "model.safetensors.index.json").unlink()
        (model / shard_name(50, 119)).unlink()
        for path in [folder, *folder.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        argv = ["run", "01_download_check", "-f", str(box.deployment_path)]
        argv += ["--runs-dir", str(tmp_path / "runs"), "-p", "model_path", str(model)]
        code = cli.main(argv)
        out = capsys.readouterr().out
        assert code == 1, out
        assert "118 of 119 shards ok; 1 missing" in out, out
        assert "all 118 shards complete" not in out
    finally:
        shutil.rmtree(folder, ignore_errors=True)
