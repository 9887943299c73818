"""The rehearsal host's pure parts: its sshd config, deployment file, checks and bookkeeping."""

import contextlib
import json
import os
import socket
import stat
import subprocess
from pathlib import Path

import pytest

from opsbook.core.deployment import load_deployment
from opsbook.core.exceptions import SandboxError, SandboxFolderRefused, SandboxRequestRefused
from opsbook.rehearsal import box_files, box_state, box_user, host_procs, ports, sandbox
from opsbook.rehearsal.box_state import BoxState


def paths_in(tmp_path: Path) -> box_state.BoxPaths:
    return box_state.BoxPaths(tmp_path)


def test_sshd_config_is_key_only_loopback_with_the_simulated_path(tmp_path) -> None:
    paths = paths_in(tmp_path)
    owner = box_user.account("root")
    box_files.write_sshd_config(paths, "127.0.0.2", 2222, owner)
    lines = paths.config.read_text().splitlines()
    for expected in (
        "ListenAddress 127.0.0.2",
        "Port 2222",
        f"HostKey {tmp_path}/ssh_host_ed25519_key",
        f"PidFile {tmp_path}/sshd.pid",
        f"AuthorizedKeysFile {tmp_path}/authorized_keys",
        "AllowUsers root",
        "PasswordAuthentication no",
        "UsePAM no",
        "StrictModes no",
        "Subsystem sftp internal-sftp",
        f"SetEnv PATH={tmp_path}/bin:/usr/local/bin:/usr/bin:/bin OPSBOOK_SIM_DIR={tmp_path}/sim",
    ):
        assert expected in lines


def test_deployment_file_loads_and_points_into_the_folder(tmp_path) -> None:
    paths = paths_in(tmp_path)
    state = BoxState(address="127.0.0.1", port=40022, user="opsbook-12345678", server_port=8123)
    box_files.write_deployment(paths, state)
    dep = load_deployment(paths.deployment)
    assert dep.name == "rehearsal"
    assert dep.host.name == "opsbook-12345678@127.0.0.1:40022"
    assert dep.host.key == str(tmp_path / "id_ed25519")
    assert dep.host.known_hosts == str(tmp_path / "known_hosts")
    assert dep.model_path == str(tmp_path / "models" / "Kimi-K2.5-NVFP4")
    assert dep.python == str(tmp_path / "venv" / "bin" / "python")
    assert dep.server_port == 8123
    assert dep.serve_args == {
        "tensor-parallel-size": 8,
        "trust-remote-code": True,
        "max-model-len": 32768,
    }
    assert dep.env == {"NCCL_P2P_LEVEL": "SYS"}
    assert dep.script_path == str(tmp_path / "home" / "opsbook" / "launch.sh")
    assert "HF_TOKEN" in dep.secrets


def test_path_snippet_is_idempotent_in_bash_and_zsh(tmp_path) -> None:
    snippet = box_files.path_snippet(paths_in(tmp_path))
    for shell in ("/bin/bash", "/usr/bin/zsh"):
        if not os.access(shell, os.X_OK):
            continue
        script = f'{snippet}\n{snippet}\nprintf %s "$PATH"'
        done = subprocess.run(
            [shell, "-c", script], env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True
        )
        assert done.stdout == f"{tmp_path}/bin:/usr/bin:/bin"


def test_login_user_name_is_short_and_stable(tmp_path) -> None:
    if os.geteuid() != 0:
        pytest.skip("as a plain user the login user is the current one")
    name = box_user.login_name(paths_in(tmp_path), "zsh")
    assert name == box_user.login_name(paths_in(tmp_path), "bash")
    assert name.startswith("opsbook-") and len(name) <= 32
    assert name != box_user.login_name(paths_in(tmp_path / "other"), "zsh")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"address": "10.0.0.1"}, "loopback only"),
        ({"address": "127.999.0.1"}, "loopback only"),
        ({"address": "localhost"}, "loopback only"),
        ({"shell": "fish"}, "not offered"),
        ({"port": 70000}, "not a TCP port"),
        ({"gpus": 0}, "cannot simulate"),
        ({"gpu_profile": "a100"}, "cannot simulate"),
        ({"vllm_version": "0.33"}, "not a vLLM release number"),
        ({"vllm_version": "latest"}, "not a vLLM release number"),
    ],
)
def test_bad_requests_are_refused_before_anything_starts(tmp_path, kwargs, message) -> None:
    with pytest.raises(SandboxRequestRefused, match=message) as caught:
        sandbox.up(tmp_path / "box", **kwargs)
    assert caught.value.remedy
    assert not (tmp_path / "box").exists()


def test_folder_with_a_space_is_refused(tmp_path) -> None:
    with pytest.raises(SandboxError, match="contains a space") as caught:
        sandbox.up(tmp_path / "my box")
    assert "choose a folder" in (caught.value.remedy or "")


def test_parents_closed_to_other_users_are_named_with_the_remedy(tmp_path) -> None:
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o700)
    with pytest.raises(SandboxError, match="cannot reach") as caught:
        box_user.check_traversable(closed / "box")
    assert str(closed) in caught.value.message
    assert f"chmod o+x {closed}" in (caught.value.remedy or "")


def test_taken_port_is_refused_and_zero_prefers_the_previous_port() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        with pytest.raises(SandboxError, match=f"port {taken} on 127.0.0.1 is taken"):
            ports.choose_port("127.0.0.1", taken)
        assert ports.choose_port("127.0.0.1", 0, previous=taken) != taken
    free = ports.free_port("127.0.0.1")
    assert ports.choose_port("127.0.0.1", 0, previous=free) == free


def test_a_port_is_chosen_free_at_every_address_and_handed_out_once() -> None:
    # Another rehearsal host's sshd holds its port at its own address only, and a model server
    # listens at every address: a port free at one address alone would clash with it.
    with contextlib.ExitStack() as stack:
        held = set()
        for _ in range(2000):  # 7% of the ephemeral range: a port free at one address is often held
            holder = stack.enter_context(socket.socket())
            holder.bind(("127.0.6.60", 0))
            holder.listen()
            held.add(holder.getsockname()[1])
        chosen = [ports.free_port("127.0.6.61") for _ in range(200)]
    assert not held & set(chosen)
    assert len(set(chosen)) == len(chosen)


def test_a_running_sandbox_is_reused_only_for_a_compatible_request() -> None:
    state = BoxState(address="127.0.0.1", port=40022, shell="zsh")
    assert sandbox._compatible(state, "127.0.0.1", 0, "zsh")
    assert sandbox._compatible(state, "127.0.0.1", 40022, "zsh")
    assert not sandbox._compatible(state, "127.0.0.1", 40023, "zsh")
    assert not sandbox._compatible(state, "127.0.0.2", 0, "zsh")
    assert not sandbox._compatible(state, "127.0.0.1", 0, "bash")


def test_the_state_file_reads_back_as_written_and_an_older_one_as_the_simulator(
    tmp_path,
) -> None:
    paths = paths_in(tmp_path)
    assert box_state.read_state(paths) is None
    state = BoxState("up", str(tmp_path), "127.0.0.1", 40022, "zsh", "u", True, 4242, 8123, 8,
                     "b200", "0.15.1", "real")  # fmt: skip
    box_state.write_state(paths, state)
    assert box_state.read_state(paths) == state
    assert list(json.loads(paths.state.read_text())) == [
        "status", "dir", "address", "port", "shell", "user", "created_user", "sshd_pid",
        "server_port", "gpus", "gpu_profile", "vllm_version", "vllm",
    ]  # fmt: skip
    older = {"status": "down", "address": "127.0.0.1", "port": 40022, "sshd_pid": None}
    paths.state.write_text(json.dumps(older))
    assert box_state.read_state(paths) == BoxState(status="down", address="127.0.0.1", port=40022)
    paths.state.write_text("[]")
    with pytest.raises(SandboxError, match="not a JSON object"):
        box_state.read_state(paths)


def test_only_an_sshd_of_this_folder_counts_as_ours(tmp_path) -> None:
    paths = paths_in(tmp_path)
    assert not host_procs.is_our_sshd(os.getpid(), paths)
    assert not host_procs.is_our_sshd(0, paths)
    assert not host_procs.is_our_sshd(2**22 + 1, paths)


def test_down_and_status_of_an_empty_folder(tmp_path) -> None:
    assert sandbox.down(tmp_path).ok
    result = sandbox.status(tmp_path)
    assert not result.ok and "no rehearsal host runs" in result.message


def test_a_corrupt_state_file_is_an_error_with_a_remedy(tmp_path) -> None:
    (tmp_path / "state.json").write_text("{not json")
    with pytest.raises(SandboxError, match="cannot read") as caught:
        sandbox.status(tmp_path)
    assert "state.json" in (caught.value.remedy or "")


def test_process_ancestry_spares_the_caller() -> None:
    chain = host_procs.ancestors(os.getpid())
    assert os.getpid() in chain and os.getppid() in chain


def test_cli_knobs_name_the_gpus_and_the_release() -> None:
    from opsbook.cli import build_parser

    args = build_parser().parse_args(
        ["sandbox", "up", "--gpus", "b200", "--vllm-version", "0.33.0"]
    )
    assert sandbox.GPU_CHOICES[args.gpus] == "b200" and args.vllm_version == "0.33.0"
    default = build_parser().parse_args(["sandbox", "up"])
    assert (sandbox.GPU_CHOICES[default.gpus], default.vllm_version) == ("rtxpro6000", "0.15.1")
    assert set(sandbox.GPU_CHOICES.values()) <= set(sandbox.simgpu.PROFILES)


@pytest.mark.parametrize("argv", [["--gpus", "a100"], ["--vllm-version", "0.33"]])
def test_cli_refuses_unknown_gpus_and_bad_releases_with_exit_2(argv, capsys) -> None:
    from opsbook.cli import main

    with pytest.raises(SystemExit) as caught:
        main(["sandbox", "up", *argv])
    assert caught.value.code == 2
    err = capsys.readouterr().err
    assert "opsbook sandbox: error: argument --" in err and argv[1] in err


def test_up_refuses_a_folder_holding_someone_elses_files(tmp_path) -> None:
    folder = tmp_path / "mine"
    folder.mkdir(mode=0o700)
    folder.chmod(0o700)
    (folder / "notes.txt").write_text("the operator's")
    with pytest.raises(SandboxFolderRefused) as refused:
        sandbox.up(folder, checkpoint=False)
    assert "already holds files that opsbook did not make" in refused.value.message
    assert "does not exist yet" in (refused.value.remedy or "")
    assert sorted(p.name for p in folder.iterdir()) == ["notes.txt"]
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700


def test_an_existing_empty_folder_keeps_its_mode_and_owner(tmp_path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    before = shared.stat()
    assert sandbox.claim_folder(shared) is False
    after = shared.stat()
    assert (after.st_mode, after.st_uid, after.st_gid) == (
        before.st_mode,
        before.st_uid,
        before.st_gid,
    )
    # Its marker makes it the sandbox's for the next `up`, even once it holds files.
    (shared / "state.json").write_text("{}")
    assert sandbox.claim_folder(shared) is False


def test_a_closed_empty_folder_is_refused_as_root_not_opened(tmp_path) -> None:
    if os.geteuid() != 0:
        pytest.skip("only root's sandbox user is another user")
    closed = tmp_path / "closed"
    closed.mkdir()
    closed.chmod(0o700)
    with pytest.raises(SandboxFolderRefused) as refused:
        sandbox.claim_folder(closed)
    assert "mode 700" in refused.value.message
    assert stat.S_IMODE(closed.stat().st_mode) == 0o700
    assert list(closed.iterdir()) == []


def test_a_missing_folder_is_created_enterable(tmp_path) -> None:
    folder = tmp_path / "new" / "box"
    old_umask = os.umask(0o077)
    try:
        assert sandbox.claim_folder(folder) is True
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE(folder.stat().st_mode) == 0o755
    assert (folder / sandbox.FOLDER_MARKER).exists()


# -- bounds and Ctrl-C (issue 32, item 7) -----------------------------------------------------


@pytest.mark.parametrize("hosts", ["65", "1000", "100000000"])
def test_a_fleet_beyond_the_bound_is_refused_before_anything_starts(
    tmp_path, capsys, hosts: str
) -> None:
    from opsbook.cli import main

    folder = tmp_path / "fleet"
    assert main(["sandbox", "up", "--hosts", hosts, "--dir", str(folder)]) == 2
    err = capsys.readouterr().err
    assert f"at most {sandbox.MAX_FLEET_HOSTS} hosts, not {hosts}" in err
    assert "a Linux user, an sshd" in err and "remedy:" in err
    assert not folder.exists()


def test_a_fleet_at_the_bound_is_allowed() -> None:
    sandbox.check_fleet_size(sandbox.MAX_FLEET_HOSTS)
    with pytest.raises(SandboxRequestRefused):
        sandbox.check_fleet_size(sandbox.MAX_FLEET_HOSTS + 1)


def test_ctrl_c_while_starting_stops_what_started_and_says_so(tmp_path, monkeypatch) -> None:
    import signal

    stopped: list[str] = []
    real_stop = sandbox._stop

    def interrupted(paths: object, state: object, checkpoint: bool) -> object:
        raise KeyboardInterrupt

    def stop(paths: box_state.BoxPaths, state: BoxState) -> object:
        # The cleanup runs with Ctrl-C ignored: a second one does not cut it short.
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
        stopped.append(state.user)
        return real_stop(paths, state)

    monkeypatch.setattr(sandbox, "_provision", interrupted)
    monkeypatch.setattr(sandbox, "_stop", stop)
    monkeypatch.setattr(sandbox, "ensure_user", lambda *a: False)
    monkeypatch.setattr(sandbox, "check_traversable", lambda *a: None)
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(SandboxError) as failed:
        sandbox.up(tmp_path / "box", address="127.0.2.9", checkpoint=False)
    assert "interrupted (Ctrl-C) while starting" in failed.value.message
    assert "no sshd of ours was running" in failed.value.message
    assert len(stopped) == 1
    assert signal.getsignal(signal.SIGINT) == before
    state = box_state.read_state(paths_in(tmp_path / "box"))
    assert state is not None and state.status == "down"
