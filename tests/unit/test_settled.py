"""A deploy with nothing to do (opsbook.steps.settled): the deployment's digest, the verdict
read from the host's answer, and the launch probe's note (``settle``) and its check (``status``
with ``settled``), run for real with a local interpreter against a process and a /health
server of this test's own."""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from opsbook.core.deployment import parse_deployment
from opsbook.remote import probes
from opsbook.steps import settled
from opsbook.steps.launch_answers import SettleAnswer, SettledAnswer, StatusAnswer

DEPLOYMENT = parse_deployment(
    {
        "hosts": [{"address": "127.0.0.9", "user": "u"}],
        "model": {"path": "/models/m"},
        "server": {"args": {"max-model-len": 4096}, "env": {"VLLM_API_KEY": "key-one"}},
    }
)


def test_the_digest_follows_the_deployment_and_opsbook_but_not_where_the_file_is() -> None:
    base = settled.deployment_digest(DEPLOYMENT, "code", ["key-one"])
    assert base == settled.deployment_digest(
        replace(DEPLOYMENT, source="/else"), "code", ["key-one"]
    )
    wider = replace(DEPLOYMENT, serve_args={"max-model-len": 8192})
    assert settled.deployment_digest(wider, "code", ["key-one"]) != base
    assert settled.deployment_digest(DEPLOYMENT, "other code", ["key-one"]) != base


def test_a_secret_value_is_masked_before_the_digest_the_host_hashes_it_in() -> None:
    # Another key written in the file gives the same digest here: the probe hashes the
    # values itself (deployment_key), so that no digest of a secret is journalled.
    other = replace(DEPLOYMENT, env={"VLLM_API_KEY": "key-two"})
    assert settled.deployment_digest(other, "c", ["key-two"]) == settled.deployment_digest(
        DEPLOYMENT, "c", ["key-one"]
    )


def test_the_verdict_says_what_differs_since_which_deploy() -> None:
    none = settled._from_note(None)
    assert not none.settled and none.message == settled.DIFFERS["note"]
    moved = settled._from_note(SettledAnswer("20261206T1-deploy-a", 0.0, ("model",)))
    assert not moved.settled
    assert moved.message == (
        "the checkpoint folder's files changed since the deploy 20261206T1-deploy-a "
        "(1970-01-01 00:00:00 UTC)"
    )
    same = settled._from_note(SettledAnswer("r", 0.0, ()))
    assert same.settled and same.message.startswith("ready and unchanged since the deploy r ")


class _Health(http.server.BaseHTTPRequestHandler):
    status = 200

    def do_GET(self) -> None:
        self.send_response(self.status)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@contextlib.contextmanager
def health_server(status: int) -> Iterator[int]:
    handler = type("Health", (_Health,), {"status": status})
    server = http.server.HTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def launch(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """A launch record naming a process of this test's own, and a checkpoint folder."""
    process = subprocess.Popen(["sleep", "60"])
    try:
        stat = Path(f"/proc/{process.pid}/stat").read_text()
        start = int(stat[stat.rindex(")") + 2 :].split()[19])
        state = tmp_path / "state"
        state.mkdir()
        record = {"pid": process.pid, "pgid": process.pid, "start": start, "cmdline": "sleep 60"}
        (state / "launch.json").write_text(json.dumps(record))
        model = tmp_path / "model"
        model.mkdir()
        (model / "config.json").write_text("{}")
        yield {"state_dir": str(state), "log": str(tmp_path / "log"), "model": str(model)}
    finally:
        process.kill()
        process.wait()


SECRET = "an-api-key-of-the-test"


def ask(launch: dict[str, Any], port: int, op: str, **settled_args: Any) -> Any:
    asked = {"deployment": "d", "secrets": [SECRET], "model": launch["model"], **settled_args}
    args = {
        "op": op,
        "state_dir": launch["state_dir"],
        "log": launch["log"],
        "script": "/nowhere/launch.sh",
        "port": port,
        "health": "/health",
        "settled": asked,
    }
    return probes.run_local("launch", args)


def test_a_ready_launch_is_noted_and_the_note_holds_until_something_moves(
    launch: dict[str, Any],
) -> None:
    with health_server(200) as port:
        noted = SettleAnswer.parse(ask(launch, port, "settle", run="run-1"))
        assert noted == SettleAnswer(True, "")
        note = (Path(launch["state_dir"]) / "settled.json").read_text()
        assert SECRET not in note and json.loads(note)["run"] == "run-1"
        same = StatusAnswer.parse(ask(launch, port, "status")).settled
        assert same is not None and same.run == "run-1" and same.differs == ()
        other_secret = StatusAnswer.parse(ask(launch, port, "status", secrets=["rotated"])).settled
        assert other_secret is not None and other_secret.differs == ("deployment",)
        shard = Path(launch["model"]) / "model-00001-of-00001.safetensors"
        shard.write_bytes(b"x")
        moved = StatusAnswer.parse(ask(launch, port, "status")).settled
        assert moved is not None and moved.differs == ("model",)


def test_a_launch_that_does_not_answer_health_200_is_not_noted(launch: dict[str, Any]) -> None:
    with health_server(503) as port:
        answer = SettleAnswer.parse(ask(launch, port, "settle", run="run-1"))
    assert answer == SettleAnswer(False, "/health answers 503")
    assert not (Path(launch["state_dir"]) / "settled.json").exists()


def test_without_a_note_the_status_says_so(launch: dict[str, Any]) -> None:
    with health_server(200) as port:
        found = StatusAnswer.parse(ask(launch, port, "status")).settled
    assert found == SettledAnswer(None, None, ("note",))
    assert os.path.isdir(launch["state_dir"])
