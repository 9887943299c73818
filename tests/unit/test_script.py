"""Launch script rendering: quoting proven by running the script with local bash and a stub
interpreter that prints the arguments it receives; secrets; flags; stable output; upload logic
against this machine as the host (:class:`opsbook.remote.testing.LocalHost`)."""

from __future__ import annotations

import shlex
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest

from opsbook.core.deployment import Deployment, parse_deployment
from opsbook.core.exceptions import DeploymentError
from opsbook.core.results import State
from opsbook.remote.testing import LocalHost
from opsbook.stages import launch_script
from opsbook.steps.script import (
    API_SERVER_MODULE,
    NEW_FILE,
    diff_html,
    highlight,
    render_script,
    resolve_remote_path,
    script_diff,
    secret_args,
    secrets_path,
    serve_flags,
    server_api_key,
    upload_script,
    upload_secrets,
    vllm_executable,
    written_by_opsbook,
)

# Prints each argument followed by NUL, then the variables the tests look at.
STUB = """#!/bin/bash
printf '%s\\0' "$@"
printf 'ENV %s=%s\\0' NCCL_P2P_LEVEL "${NCCL_P2P_LEVEL-}" WEIRD "${WEIRD-}" \
    HF_TOKEN "${HF_TOKEN-}" VLLM_API_KEY "${VLLM_API_KEY-}"
"""


def deployment(**changes: Any) -> Deployment:
    doc: dict[str, Any] = {
        "name": "unit",
        "hosts": [{"address": "gpu-01"}],
        "model": {"path": "/data/models/Kimi-K2.5-NVFP4"},
        "python": "python",
        "server": {
            "port": 8011,
            "args": {"tensor-parallel-size": 8, "trust-remote-code": True},
            "env": {"NCCL_P2P_LEVEL": "SYS"},
        },
        "secrets": ["HF_TOKEN"],
    }
    for key, value in changes.items():
        section, _, name = key.partition("__")
        if name:
            doc[section][name] = value
        else:
            doc[section] = value
    return parse_deployment(doc)


def stub_bin(tmp_path: Path) -> Path:
    folder = tmp_path / "bin"
    folder.mkdir(exist_ok=True)
    for name in ("python", "vllm"):
        (folder / name).write_text(STUB)
        (folder / name).chmod(0o755)
    return folder


def run_script(
    tmp_path: Path, text: str, name: str = "launch.sh"
) -> tuple[list[str], dict[str, str], subprocess.CompletedProcess[bytes]]:
    """Run the script with the stubs on PATH; the stub's argv, its variables, the process."""
    script = tmp_path / name
    script.write_text(text)
    env = {"PATH": f"{stub_bin(tmp_path)}:/usr/bin:/bin", "HOME": str(tmp_path)}
    done = subprocess.run(
        ["bash", str(script)], env=env, capture_output=True, cwd=tmp_path, timeout=30
    )
    items = done.stdout.decode().split("\0")[:-1]
    argv = [i for i in items if not i.startswith("ENV ")]
    variables = dict(i[4:].split("=", 1) for i in items if i.startswith("ENV "))
    return argv, variables, done


HOSTILE = [
    "$(touch {marker})",
    "`touch {marker}`",
    "a;touch {marker} && b || c | d &",
    'it\'s "quoted" \\ and $HOME and *',
    "two\nlines",
    "",
]


def test_every_value_reaches_the_program_literally_and_nothing_runs(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    hostile = [h.format(marker=marker) for h in HOSTILE]
    model = f'/data/My Models/it\'s "K2.5" $(touch {marker})'
    args = {f"arg-{i}": value for i, value in enumerate(hostile)}
    dep = deployment(model={"path": model}, server__args=args)
    argv, _, done = run_script(tmp_path, render_script(dep, entrypoint="module"))
    assert done.returncode == 0, done.stderr
    expected = ["-m", API_SERVER_MODULE, "--model", model]
    for i, value in enumerate(hostile):
        expected += [f"--arg-{i}", value]
    assert argv == [*expected, "--port", "8011"]
    assert not marker.exists()


def test_serve_entrypoint_passes_the_model_as_positional(tmp_path: Path) -> None:
    model = "/data/a model/$(id)"
    argv, _, done = run_script(tmp_path, render_script(deployment(model={"path": model})))
    assert done.returncode == 0, done.stderr
    assert argv == [
        "serve",
        model,
        "--tensor-parallel-size",
        "8",
        "--trust-remote-code",
        "--port",
        "8011",
    ]


def test_value_types_render_as_documented(tmp_path: Path) -> None:
    args = {
        "max-model-len": 32768,
        "gpu-memory-utilization": 0.9,
        "enforce-eager": True,
        "disable-custom-all-reduce": False,
        "served-model-name": ["kimi", "k2 5"],
        "api-key": None,
        "allowed-origins": [],
        "compilation-config": {"pass_config": {"fuse_allreduce_rms": True}, "level": 3},
        "compilation-config.pass_config.fuse_allreduce_rms": True,
        "lora-modules": [{"name": "a", "path": "/x y"}],
    }
    assert serve_flags(args) == [
        ["--max-model-len", "32768"],
        ["--gpu-memory-utilization", "0.9"],
        ["--enforce-eager"],
        ["--served-model-name", "kimi", "k2 5"],
        ["--compilation-config", '{"pass_config":{"fuse_allreduce_rms":true},"level":3}'],
        ["--compilation-config.pass_config.fuse_allreduce_rms"],
        ["--lora-modules", '{"name":"a","path":"/x y"}'],
    ]
    argv, _, _ = run_script(tmp_path, render_script(deployment(server__args=args)))
    assert argv[argv.index("--served-model-name") + 1 : argv.index("--compilation-config")] == [
        "kimi",
        "k2 5",
    ]


def test_environment_is_exported_with_values_intact(tmp_path: Path) -> None:
    weird = "a b $(touch x) 'q' \"dq\" ; &&"
    dep = deployment(server__env={"NCCL_P2P_LEVEL": "SYS", "WEIRD": weird})
    text = render_script(dep)
    assert "export NCCL_P2P_LEVEL=SYS\n" in text
    _, variables, done = run_script(tmp_path, text)
    assert done.returncode == 0
    assert variables["NCCL_P2P_LEVEL"] == "SYS" and variables["WEIRD"] == weird
    assert not (tmp_path / "x").exists()


def test_secret_values_stay_out_of_the_script_and_come_from_the_env_file(tmp_path: Path) -> None:
    dep = deployment(server__env={"NCCL_P2P_LEVEL": "SYS", "HF_TOKEN": "hf_in_yaml_secret"})
    text = render_script(dep)
    assert "hf_in_yaml_secret" not in text and "export HF_TOKEN" not in text
    _, variables, _ = run_script(tmp_path, text)
    assert variables["HF_TOKEN"] == ""

    env_file = tmp_path / secrets_path("launch.sh")
    env_file.write_text(f"export HF_TOKEN={shlex.quote('hf_$ecret value')}\n")
    env_file.chmod(0o600)
    _, variables, done = run_script(tmp_path, text)
    assert done.returncode == 0 and variables["HF_TOKEN"] == "hf_$ecret value"


def test_a_secrets_file_others_can_read_stops_the_launch(tmp_path: Path) -> None:
    env_file = tmp_path / "launch.sh.env"
    env_file.write_text("export HF_TOKEN=x\n")
    env_file.chmod(0o644)
    argv, _, done = run_script(tmp_path, render_script(deployment()))
    assert done.returncode == 1 and argv == []
    assert b"readable by other users" in done.stderr and b"chmod 600" in done.stderr


@pytest.mark.parametrize(
    "flag", ["Max-Model-Len", "max_model_len", "bad flag", "a;b", "$(x)", "-tp", "x=1", ""]
)
def test_invalid_flag_names_are_refused_by_name(flag: str) -> None:
    with pytest.raises(DeploymentError) as e:
        render_script(deployment(server__args={flag: 1}))
    assert repr(flag) in str(e.value) and e.value.remedy


def test_underscore_flags_get_the_dashed_suggestion() -> None:
    with pytest.raises(DeploymentError) as e:
        serve_flags({"max_model_len": 1})
    assert "'max-model-len'" in (e.value.remedy or "")


@pytest.mark.parametrize("flag", ["model", "port", "--port"])
def test_model_and_port_must_come_from_the_deployment(flag: str) -> None:
    with pytest.raises(DeploymentError, match="set by the deployment"):
        serve_flags({flag: "x"})


def test_unknown_entrypoint_is_refused() -> None:
    with pytest.raises(DeploymentError, match="entrypoint"):
        render_script(deployment(), entrypoint="docker")


def test_vllm_executable_sits_next_to_python() -> None:
    assert vllm_executable("/opt/vllm/.venv/bin/python") == "/opt/vllm/.venv/bin/vllm"
    assert vllm_executable("python3") == "vllm"


def test_home_relative_python_and_model_expand_on_the_host(tmp_path: Path) -> None:
    stub_bin(tmp_path)
    dep = deployment(python="~/bin/python", model={"path": "~/models/k 2"})
    text = render_script(dep, entrypoint="module")
    assert '"$HOME"/bin/python' in text
    argv, _, done = run_script(tmp_path, text)
    assert done.returncode == 0, done.stderr
    assert argv[:4] == ["-m", API_SERVER_MODULE, "--model", f"{tmp_path}/models/k 2"]


def test_rendering_is_stable_and_passes_bash_syntax_check(tmp_path: Path) -> None:
    dep = deployment()
    for entrypoint in ("serve", "module"):
        text = render_script(dep, entrypoint=entrypoint)
        assert text == render_script(deployment(), entrypoint=entrypoint)
        assert text.startswith("#!/bin/bash\n") and "set -euo pipefail\n" in text
        assert "written by opsbook" in text and "cd " not in text
        assert text.endswith("--port 8011\n")
        (tmp_path / "s.sh").write_text(text)
        assert subprocess.run(["bash", "-n", str(tmp_path / "s.sh")]).returncode == 0


def test_one_argument_per_line() -> None:
    text = render_script(deployment(), entrypoint="module")
    exec_part = text[text.index("exec ") :]
    assert exec_part.splitlines() == [
        f"exec python -m {API_SERVER_MODULE} \\",
        "  --model /data/models/Kimi-K2.5-NVFP4 \\",
        "  --tensor-parallel-size 8 \\",
        "  --trust-remote-code \\",
        "  --port 8011",
    ]


def test_script_diff() -> None:
    assert script_diff(None, "a\n", "/x") == NEW_FILE
    assert script_diff("a\n", "a\n", "/x") == ""
    diff = script_diff("a\nb\n", "a\nc", "/x")
    assert "-b\n" in diff and "+c\n" in diff and diff.startswith("--- /x (on the host)")


def test_notebook_display_objects() -> None:
    shown = highlight("exec python -m x --model '/a b'\n")
    assert "<span" in shown._repr_html_() and str(shown).startswith("exec python")
    assert "<span" in diff_html(script_diff("a\n", "b\n", "/x"))._repr_html_()
    assert "new file" in diff_html(NEW_FILE)._repr_html_()
    assert "no change" in str(diff_html(""))


def commands(host: LocalHost) -> list[str]:
    """The commands sent to the host, in order."""
    return [what for kind, what in host.calls if kind == "run"]


def test_relative_and_home_paths_resolve_against_the_remote_home(tmp_path: Path) -> None:
    host = LocalHost(home=tmp_path)
    assert resolve_remote_path(host, "opsbook/launch.sh") == f"{tmp_path}/opsbook/launch.sh"
    assert resolve_remote_path(host, "~/a b/launch.sh") == f"{tmp_path}/a b/launch.sh"
    calls = len(host.calls)
    assert resolve_remote_path(host, "/srv/x/../launch.sh") == "/srv/launch.sh"
    assert len(host.calls) == calls


def test_upload_reports_new_unchanged_and_changed(tmp_path: Path) -> None:
    host = LocalHost(home=tmp_path)
    dep = deployment(paths={"script": 'it\'s a "dir"/launch.sh'})
    first = upload_script(host, dep, render_script(dep))
    path = tmp_path / 'it\'s a "dir"' / "launch.sh"
    assert first.ok and first.path == str(path)
    assert first.diff == NEW_FILE and first.written
    assert stat.S_IMODE(path.stat().st_mode) == 0o755

    second = upload_script(host, dep, render_script(dep))
    assert second.unchanged and second.diff == "" and not second.written

    changed = deployment(
        paths={"script": 'it\'s a "dir"/launch.sh'}, server__args={"tensor-parallel-size": 4}
    )
    third = upload_script(host, changed, render_script(changed))
    assert third.ok and not third.unchanged
    assert "-  --tensor-parallel-size 8 \\\n" in third.diff
    assert "+  --tensor-parallel-size 4 \\\n" in third.diff


def test_the_launch_script_stage_reads_the_hosts_script_once(tmp_path: Path) -> None:
    host = LocalHost(home=tmp_path)
    dep = deployment()
    upload_script(host, dep, render_script(dep))
    changed = deployment(server__args={"tensor-parallel-size": 4})
    host.calls.clear()
    report = launch_script.run(host, changed, launch_script.Options(apply=True))
    reads = [what for kind, what in host.calls if kind == "read"]
    assert report.state is State.CHANGED and reads == [f"{tmp_path}/opsbook/launch.sh"]
    assert "--tensor-parallel-size 4" in (tmp_path / "opsbook" / "launch.sh").read_text()


def test_upload_reads_the_script_itself_when_the_callers_copy_is_of_no_file(
    tmp_path: Path,
) -> None:
    # The caller saw no file, but one is there now: it is read and checked before replacing.
    host = LocalHost(home=tmp_path)
    dep = deployment()
    (tmp_path / "opsbook").mkdir()
    (tmp_path / "opsbook" / "launch.sh").write_text("#!/bin/bash\nmy own\n")
    result = upload_script(host, dep, render_script(dep), previous=None)
    assert not result.ok and "is not opsbook's launch script" in result.message
    assert (tmp_path / "opsbook" / "launch.sh").read_text() == "#!/bin/bash\nmy own\n"


def test_upload_reports_a_syntax_error_as_a_finding(tmp_path: Path) -> None:
    host = LocalHost(home=tmp_path)
    result = upload_script(host, deployment(), "#!/bin/bash\nif then\n")
    assert not result.ok and not result.syntax_ok
    assert result.findings[0].severity == "error" and "syntax error" in result.findings[0].message


def test_upload_secrets_writes_a_private_env_file_the_script_reads(tmp_path: Path) -> None:
    host = LocalHost(home=tmp_path)
    dep = deployment(paths={"script": "opsbook/launch.sh"})
    secret = "hf_$(touch pwned) 'x'"
    written = upload_secrets(host, dep, environ={"HF_TOKEN": secret, "OTHER": "not a secret"})
    env_file = tmp_path / "opsbook" / "launch.sh.env"
    assert written.ok and (written.path, written.names) == (str(env_file), ["HF_TOKEN"])
    assert stat.S_IMODE(env_file.stat().st_mode) == 0o600
    assert not any(secret in command for command in commands(host))

    upload_script(host, dep, render_script(dep), environ={"HF_TOKEN": secret})
    stub_bin(tmp_path)
    env = {"PATH": f"{tmp_path}/bin:/usr/bin:/bin", "HOME": str(tmp_path)}
    done = subprocess.run(
        ["bash", str(env_file)[: -len(".env")]], env=env, capture_output=True, cwd=tmp_path
    )
    assert f"ENV HF_TOKEN={secret}\0".encode() in done.stdout
    assert not (tmp_path / "pwned").exists()


SECRET_ARGS = {
    "tensor-parallel-size": 8,
    "api-key": "key-$(touch pwned) 'q'",
    "max-num-batched-tokens": 8192,
    "db-password": ["first pass", "second pass"],
    "hf-token": True,
}


def test_secret_serve_args_stay_out_of_the_script_and_reach_the_server(tmp_path: Path) -> None:
    host = LocalHost(home=tmp_path)
    dep = deployment(server__args=SECRET_ARGS, paths={"script": "launch.sh"})
    text = render_script(dep)
    for value in ("key-", "first pass", "second pass"):
        assert value not in text
    assert [(a.flag, a.variable, a.on_command_line) for a in secret_args(dep)] == [
        ("api-key", "VLLM_API_KEY", False),
        ("db-password", "OPSBOOK_SECRET_DB_PASSWORD_1", True),
        ("db-password", "OPSBOOK_SECRET_DB_PASSWORD_2", True),
    ]

    written = upload_script(host, dep, text, environ={})
    assert written.secrets == [
        "OPSBOOK_SECRET_DB_PASSWORD_1",
        "OPSBOOK_SECRET_DB_PASSWORD_2",
        "VLLM_API_KEY",
    ]
    assert "secrets file written" in written.message
    argv, variables, done = run_script(tmp_path, text)
    assert done.returncode == 0, done.stderr
    # vLLM reads VLLM_API_KEY itself: the key is not on the command line that `ps` shows.
    assert variables["VLLM_API_KEY"] == SECRET_ARGS["api-key"]
    assert "--api-key" not in argv
    assert argv[argv.index("--db-password") + 1 : argv.index("--hf-token")] == [
        "first pass",
        "second pass",
    ]
    assert argv[argv.index("--max-num-batched-tokens") + 1] == "8192"
    assert not (tmp_path / "pwned").exists()


def test_a_secret_serve_arg_without_its_secrets_file_stops_the_launch(tmp_path: Path) -> None:
    argv, _, done = run_script(tmp_path, render_script(deployment(server__args=SECRET_ARGS)))
    assert done.returncode == 1 and argv == []
    assert b"VLLM_API_KEY (serve argument --api-key) is not set by" in done.stderr


def test_upload_script_writes_the_secrets_file_only_when_there_is_a_secret(tmp_path: Path) -> None:
    host = LocalHost(home=tmp_path)
    dep = deployment(paths={"script": "launch.sh"})
    plain = upload_script(host, dep, render_script(dep), environ={})
    assert plain.secrets == [] and not (tmp_path / "launch.sh.env").exists()

    token = "hf_" + "x" * 34
    delivered = upload_script(host, dep, render_script(dep), environ={"HF_TOKEN": token})
    assert delivered.secrets == ["HF_TOKEN"]
    env_file = tmp_path / "launch.sh.env"
    assert stat.S_IMODE(env_file.stat().st_mode) == 0o600
    assert not any(token in command for command in commands(host))
    _, variables, _ = run_script(tmp_path, render_script(dep))
    assert variables["HF_TOKEN"] == token


def test_server_api_key_is_the_serve_arg_or_the_variable() -> None:
    assert server_api_key(deployment(server__args=SECRET_ARGS)) == SECRET_ARGS["api-key"]
    assert server_api_key(deployment(), {"VLLM_API_KEY": "from-env"}) == "from-env"
    assert server_api_key(deployment(), {}) is None


def test_highlight_masks_secrets_and_token_shaped_text() -> None:
    text = "export WANDB_API_KEY=abcdefgh123\nexec vllm serve m --seed plain-secret-value\n"
    shown = highlight(text, ["plain-secret-value"])
    assert "abcdefgh123" not in str(shown) + shown._repr_html_()
    assert "plain-secret-value" not in str(shown) + shown._repr_html_()
    assert "--seed ***" in str(shown)


def test_a_secret_named_server_env_entry_stays_out_of_the_script(tmp_path: Path) -> None:
    env = {"NCCL_P2P_LEVEL": "SYS", "VLLM_API_KEY": "env-key-5678", "DB_PASSWORD": "pw-1234"}
    dep = deployment(server__env=env, paths={"script": "launch.sh"})
    text = render_script(dep)
    assert "env-key-5678" not in text and "pw-1234" not in text
    assert "export NCCL_P2P_LEVEL=SYS" in text
    assert {"env-key-5678", "pw-1234"} <= set(dep.secret_values(environ={}))
    host = LocalHost(home=tmp_path)
    upload_script(host, dep, text, environ={})
    env_file = (tmp_path / "launch.sh.env").read_text()
    assert "VLLM_API_KEY=env-key-5678" in env_file and "DB_PASSWORD=pw-1234" in env_file
    assert not any("env-key-5678" in command for command in commands(host))


def test_a_stale_secrets_file_is_removed_when_the_deployment_has_no_secret(
    tmp_path: Path,
) -> None:
    host = LocalHost(home=tmp_path)
    dep = deployment(paths={"script": "launch.sh"})
    upload_script(host, dep, render_script(dep), environ={"HF_TOKEN": "hf-old-value"})
    env_file = tmp_path / "launch.sh.env"
    assert "hf-old-value" in env_file.read_text()
    upload_script(host, dep, render_script(dep), environ={"HF_TOKEN": "hf-new-value"})
    assert "hf-old-value" not in env_file.read_text()
    upload_script(host, dep, render_script(dep), environ={})
    assert not env_file.exists()


def test_a_file_opsbook_did_not_write_is_left_as_it_is(tmp_path: Path) -> None:
    host = LocalHost(home=tmp_path)
    dep = deployment(paths={"script": "start.sh"})
    own = tmp_path / "start.sh"
    own.write_text("#!/bin/bash\n# my own start script\nexec vllm serve /m\n")
    own.chmod(0o700)
    beside = tmp_path / "start.sh.env"
    beside.write_text("MY_SETTING=1\n")
    refused = upload_script(host, dep, render_script(dep), environ={})
    assert not refused.ok and "opsbook did not write it" in refused.findings[0].message
    assert refused.findings[0].remedy
    assert own.read_text() == "#!/bin/bash\n# my own start script\nexec vllm serve /m\n"
    assert stat.S_IMODE(own.stat().st_mode) == 0o700
    assert beside.read_text() == "MY_SETTING=1\n"
    assert not any(c.startswith("rm ") or "bash -n" in c for c in commands(host))


def test_opsbook_replaces_its_own_script_and_removes_its_stale_secrets_file(
    tmp_path: Path,
) -> None:
    host = LocalHost(home=tmp_path)
    dep = deployment(paths={"script": "launch.sh"})
    token = "hf_" + "y" * 34
    upload_script(host, dep, render_script(dep), environ={"HF_TOKEN": token})
    assert (tmp_path / "launch.sh.env").exists()
    assert written_by_opsbook((tmp_path / "launch.sh").read_text())
    again = upload_script(host, dep, render_script(dep), environ={})
    assert again.ok and not (tmp_path / "launch.sh.env").exists()
