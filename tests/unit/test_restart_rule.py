"""The launch restarts only what changed, and its dry run says what an apply will do.

The matrix runs the launch stage on :class:`opsbook.remote.testing.LocalHost` (the real launch
and facts probes on this machine) with a small OpenAI-shaped server as "vLLM": for each state a
dry run first, then an apply, and the apply must do what the dry run said (ok: the same PID and
log; would change: a new PID), for the same reason. As in a deploy, the dry run is told what
its earlier stages would change (02 would patch the config, 03 would write the script: the
``pending`` a deploy's dry run fills from their results), and the apply runs after those
stages made the change."""

from __future__ import annotations

import dataclasses
import itertools
import json
import socket
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from opsbook import cli
from opsbook.core.deployment import Deployment, parse_deployment
from opsbook.core.exceptions import RunError
from opsbook.core.results import HostResult, State
from opsbook.remote.testing import LocalHost
from opsbook.runner.run import find_notebook, run_deploy, typed_parameters
from opsbook.stages import launch_server
from opsbook.stages.base import Report
from opsbook.steps import restart_rule
from opsbook.steps.triage import ServerState

# "vLLM" for the matrix: answers /health, /v1/models and a completion, logs as uvicorn does.
SERVER = textwrap.dedent(
    """
    import http.server, json, sys

    class Handler(http.server.BaseHTTPRequestHandler):
        def answer(self, body):
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            self.answer({"data": [{"id": "m"}]} if self.path == "/v1/models" else {})

        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.answer({"choices": [{"text": " fine"}]})

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Handler)
    print(f"INFO:     Uvicorn running on http://127.0.0.1:{sys.argv[1]}", flush=True)
    server.serve_forever()
    """
)
OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclasses.dataclass
class Box:
    """A host folder with a launch script, a model folder and a deployment of them."""

    home: Path
    host: LocalHost
    deployment: Deployment

    @property
    def script(self) -> Path:
        return self.home / "launch.sh"

    @property
    def log(self) -> Path:
        return self.home / "vllm.log"

    def write_script(self, extra: str = "") -> None:
        port = self.deployment.server_port
        body = f"#!/bin/bash\n{extra}exec {sys.executable} {self.home / 'server.py'} {port}\n"
        self.script.write_text(body)
        self.script.chmod(0o755)

    def launch(
        self, *, apply: bool, restart: str = "changed", pending: dict[str, list[str]] | None = None
    ) -> Report:
        options = launch_server.Options(
            apply=apply, ready_timeout=30, stop_grace=2, restart=restart, pending=pending or {}
        )
        return launch_server.run(self.host, self.deployment, options)

    def pid(self) -> int | None:
        record = self.home / "state" / "launch.json"
        return int(json.loads(record.read_text())["pid"]) if record.exists() else None

    def stop(self) -> None:
        launch_server.stop(self.host, self.deployment, launch_server.Options(stop_grace=2))


@pytest.fixture
def box(tmp_path: Path) -> Any:
    (tmp_path / "server.py").write_text(SERVER)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "m"}\n')
    doc = {
        "hosts": ["localhost"],
        "model": {"path": str(model)},
        "python": "/usr/bin/python3",
        "server": {"port": free_port()},
        "paths": {
            "script": str(tmp_path / "launch.sh"),
            "log": str(tmp_path / "vllm.log"),
            "state": str(tmp_path / "state"),
        },
    }
    made = Box(tmp_path, LocalHost(tmp_path), parse_deployment(doc))
    made.write_script()
    yield made
    made.stop()


def crash(box: Box) -> None:
    """A launch that died of a known failure: the record is there, the process is not."""
    box.write_script(f"echo '{OOM}'; exit 1\n")
    assert box.launch(apply=True).state is State.FAILED
    box.write_script()


# Each change writes what no earlier one wrote: a text written back as the server started
# with it is no change (the launch compares digests).
CHANGES = itertools.count(1)


def change_script(box: Box) -> None:
    box.write_script(f"# a comment is a change too ({next(CHANGES)})\n")


def change_config(box: Box) -> None:
    patched = next(CHANGES)
    (box.home / "model" / "config.json").write_text(
        f'{{"model_type": "m", "patched": {patched}}}\n'
    )


def change_env(box: Box) -> None:
    env = box.home / "launch.sh.env"
    env.write_text("export HF_TOKEN=x\n")
    env.chmod(0o600)


def nothing(box: Box) -> None:
    pass


@dataclasses.dataclass(frozen=True)
class Case:
    """A state of the host, what the dry run says of it, and what the deploy's earlier stages
    would change (their dry run's would change, their apply's change before the launch)."""

    name: str
    make: Callable[[Box], None]
    predicted: State
    words: str
    restart: str = "changed"
    earlier: tuple[str, ...] = ()  # the stages that would change: config-patch, launch-script


# What each earlier stage's apply does to the host before the launch's apply.
EARLIER_APPLY = {"config-patch": change_config, "launch-script": change_script}

# Each case but the first two starts from a server the previous apply left ready.
MATRIX = [
    Case("never started", nothing, State.WOULD_CHANGE, "(now never started)"),
    Case("ready and unchanged", nothing, State.OK, "unchanged since"),
    Case("ready, changed script", change_script, State.WOULD_CHANGE, "launch script changed"),
    Case("ready, changed config", change_config, State.WOULD_CHANGE, "patched configs changed"),
    Case("ready, changed env", change_env, State.WOULD_CHANGE, "env file changed"),
    Case(
        "ready, 02 would change the config",
        nothing,
        State.WOULD_CHANGE,
        "patched configs changed",
        earlier=("config-patch",),
    ),
    Case(
        "ready, 03 would change the script",
        nothing,
        State.WOULD_CHANGE,
        "launch script changed",
        earlier=("launch-script",),
    ),
    Case(
        "ready, 02 and 03 would change config and script",
        nothing,
        State.WOULD_CHANGE,
        "launch script and patched configs changed",
        earlier=("config-patch", "launch-script"),
    ),
    Case("ready, restart=always", nothing, State.WOULD_CHANGE, "restart=always", "always"),
    Case("ready again, unchanged", nothing, State.OK, "engine unchanged since"),
    Case(
        "crashed, 03 would change the script",
        crash,
        State.WOULD_CHANGE,
        "(now crashed)",
        earlier=("launch-script",),
    ),
    Case("crashed", crash, State.WOULD_CHANGE, "(now crashed)"),
]


def verb_and_reason(report: Report) -> tuple[str, str]:
    """What a launch does (ok: leaves the server alone; restart) and why, read from a dry
    run's or an apply's message: the same words for the same decision."""
    message = report.verdict.message
    if report.state is State.OK:
        return "ok", message
    if report.state is State.WOULD_CHANGE:
        if message.startswith("would (re)start the server (now "):
            return "restart", ""  # a server that is not ready needs no reason
        assert message.startswith("would restart the server: "), message
        return "restart", message.removeprefix("would restart the server: ").split("; apply")[0]
    assert report.state is State.CHANGED and message.startswith("smoke test passed"), message
    return "restart", message.split("; restarted: ", 1)[1] if "; restarted: " in message else ""


def test_the_dry_run_of_a_deploy_says_what_its_apply_does_in_every_state(box: Box) -> None:
    name = box.host.name
    for case in MATRIX:
        case.make(box)
        pid, log = box.pid(), box.log.read_bytes() if box.log.exists() else b""
        # As a deploy's dry run fills it from its earlier stages' results.
        would = [HostResult(name, stage, State.WOULD_CHANGE, "would") for stage in case.earlier]
        pending = launch_server.pending_changes(would, [name])
        dry = box.launch(apply=False, restart=case.restart, pending=pending)
        said = (dry.state, case.words in dry.verdict.message)
        assert said == (case.predicted, True), (case.name, dry.verdict)
        assert box.pid() == pid, case.name  # a dry run touches nothing
        for stage in case.earlier:  # the apply's earlier stages make their change
            EARLIER_APPLY[stage](box)
        done = box.launch(apply=True, restart=case.restart)
        assert verb_and_reason(done) == verb_and_reason(dry), (case.name, dry.verdict, done.verdict)
        if case.predicted is State.OK:
            assert done.state is State.OK, (case.name, done.verdict)
            assert (box.pid(), box.log.read_bytes()) == (pid, log), case.name
            assert done.verdict.message.startswith("already running and ready; script, env, ")
        else:
            assert done.state is State.CHANGED, (case.name, done.verdict)
            assert box.pid() != pid, case.name
            if "now" not in case.words:  # a ready server's restart names why
                assert f"; restarted: {case.words}" in done.verdict.message, case.name
            assert box.launch(apply=False).state is State.OK, case.name  # then it is at rest
    # Each case's dry run was told only what its own earlier stages would change.
    assert launch_server.pending_changes([], [name]) == {}


def test_a_deploy_s_dry_run_says_which_earlier_stage_the_restart_waits_for() -> None:
    found = ServerState("ready", "the process runs and /health answers 200", None)
    found.started_at = 1_700_000_000.0
    found.inputs = dict.fromkeys(restart_rule.INPUT_NAMES, "same")
    decision = restart_rule.decide(found, pending=["configs"])
    assert decision.restart and decision.reason == (
        "patched configs changed since 2023-11-14 22:13:20 UTC"
    )
    assert decision.dry_run_message() == (
        "would restart the server: patched configs changed since 2023-11-14 22:13:20 UTC; "
        "apply=True does it (as 02_config_patch would patch the configs first)"
    )
    # Once 02 patched them, the apply's launch finds them changed: the same reason.
    found.inputs["configs"] = "changed"
    assert restart_rule.decide(found).reason == decision.reason
    # An input not noted at the start stays unknown, pending or not.
    found.inputs["configs"] = "unrecorded"
    unknown = restart_rule.decide(found, pending=["configs"])
    assert unknown.reason == restart_rule.decide(found).reason and not unknown.pending


def test_pending_changes_are_what_02_and_03_would_change_on_each_host() -> None:
    results = [
        HostResult("a", "config-patch", State.WOULD_CHANGE, "would patch"),
        HostResult("b", "config-patch", State.OK, "nothing planned"),
        HostResult("a", "launch-script", State.WOULD_CHANGE, "would write"),
        HostResult("b", "launch-script", State.WOULD_CHANGE, "would write"),
        HostResult("c", "launch-script", State.WOULD_CHANGE, "would write"),
        HostResult("b", "preflight", State.WOULD_CHANGE, "not a server input"),
    ]
    assert launch_server.pending_changes(results, ["a", "b"]) == {
        "a": ["configs", "script"],
        "b": ["script"],
    }
    with pytest.raises(RunError, match="pending names no input a server runs: weights"):
        launch_server.Options(pending={"a": ["weights"]})


def test_a_launch_record_without_noted_inputs_is_restarted_and_says_why() -> None:
    found = ServerState("ready", "the process runs and /health answers 200", None)
    found.inputs = {"script": "same", "env": "unrecorded", "configs": "unrecorded"}
    decision = restart_rule.decide(found)
    assert decision.restart
    assert decision.reason.startswith("the env file, patched configs and engine it runs were not")
    assert "would restart the server: the env file" in decision.dry_run_message()


def test_a_server_that_is_not_ready_is_restarted_whatever_its_inputs() -> None:
    found = ServerState("loading", "phase load_weights", None, inputs=dict.fromkeys("abc", "same"))
    decision = restart_rule.decide(found)
    assert decision.restart and decision.dry_run_message() == (
        "would (re)start the server (now loading); apply=True does it"
    )
    assert decision.applied_message("smoke test passed") == "smoke test passed"


def test_the_inputs_name_the_script_its_env_file_the_patched_configs_and_the_engine() -> None:
    doc = {"hosts": ["a"], "model": {"path": "/m"}, "python": "/v/bin/python"}
    paths = launch_server.server.LaunchPaths("/h/launch.sh", "/h/vllm.log", "/h/state")
    inputs = restart_rule.run_inputs(parse_deployment(doc), paths)
    assert inputs == {
        "script": {"files": ["/h/launch.sh"]},
        "env": {"files": ["/h/launch.sh.env"]},
        "configs": {"files": ["/m/config.json", "/m/hf_quant_config.json"]},
        "engine": {"python": "/v/bin/python"},
    }


# -- the option -------------------------------------------------------------------------------


def test_a_restart_value_outside_the_allowed_ones_is_refused_naming_them() -> None:
    with pytest.raises(RunError, match="restart 'sometimes' is not one of .*: changed or always"):
        launch_server.Options(restart="sometimes")
    with pytest.raises(RunError, match="changed or always"):
        typed_parameters(find_notebook("04_launch"), [("restart", "sometimes")])
    # A deploy checks it before it reads the deployment file, let alone a host.
    with pytest.raises(RunError, match="changed or always"):
        run_deploy("/nonexistent/deployment.yml", restart="sometimes")


@pytest.mark.parametrize("notebook", ["04_launch", "deploy"])
def test_a_bad_restart_value_exits_2_before_anything_runs(
    notebook: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = tmp_path / "runs"
    argv = ["run", notebook, "-f", str(tmp_path / "d.yml"), "-p", "restart", "never"]
    assert cli.main([*argv, "--runs-dir", str(runs)]) == 2
    assert "changed or always" in capsys.readouterr().err
    assert not runs.exists()
