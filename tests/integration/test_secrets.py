"""Secrets never reach a run record: a whole `opsbook run deploy` on a fresh rehearsal host,
with a Hugging Face token in the environment and an API key a user wrote into the serve
arguments by mistake, leaves neither value (nor its base64) in any file of the run folder,
while the server still receives both."""

from __future__ import annotations

import base64
import json
import secrets
import string
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from opsbook.core.deployment import load_deployment
from opsbook.rehearsal.sandbox import Sandbox
from opsbook.remote.hosts import Host
from opsbook.runner.run import RunRecord, run_deploy
from opsbook.steps import server
from tests.integration.conftest import models_status

pytestmark = pytest.mark.integration

ALPHANUMERIC = string.ascii_letters + string.digits
ADDRESS = "127.0.0.6"


def random_text(length: int) -> str:
    return "".join(secrets.choice(ALPHANUMERIC) for _ in range(length))


@dataclass(frozen=True)
class Planted:
    """The secret values of the run and where it ran."""

    hf_token: str
    api_key: str
    deployment: Path
    box: Sandbox

    @property
    def values(self) -> dict[str, str]:
        return {"HF_TOKEN": self.hf_token, "MY_API_KEY": self.api_key}


@pytest.fixture(scope="module")
def planted(box: Sandbox, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Planted]:
    """The sandbox's deployment with two secrets: HF_TOKEN from the environment, and an API key
    both in the environment (MY_API_KEY) and written literally as the ``api-key`` serve arg."""
    hf_token = "hf_" + random_text(34)
    # No token-like prefix: only the declared values can mask it, not a pattern.
    api_key = random_text(40)
    doc = yaml.safe_load(box.deployment_path.read_text())
    doc["secrets"] = ["HF_TOKEN", "MY_API_KEY"]
    doc["server"]["args"]["api-key"] = api_key
    deployment = tmp_path_factory.mktemp("deployment") / "deployment.yml"
    deployment.write_text(yaml.safe_dump(doc, sort_keys=False))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_TOKEN", hf_token)
        patch.setenv("MY_API_KEY", api_key)
        yield Planted(hf_token, api_key, deployment, box)


@pytest.fixture(scope="module")
def deployed(planted: Planted, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunRecord]:
    """The whole runbook against the rehearsal host; the server is stopped afterwards."""
    record = run_deploy(planted.deployment, runs_dir=tmp_path_factory.mktemp("runs"))
    try:
        yield record
    finally:
        dep = load_deployment(planted.deployment)
        with Host.from_deployment(dep) as host:
            server.stop_server(host, server.resolve_paths(host, dep))


def leaked_forms(value: str) -> dict[str, bytes]:
    """The value as written, and base64 of it at each of the three byte alignments (so that it
    is found inside a longer base64 text too)."""
    forms = {"plain": value.encode()}
    for shift in range(3):
        encoded = base64.b64encode(b"\0" * shift + value.encode())
        # Drop the characters that mix the padding or the neighbours with the value's bytes.
        forms[f"base64+{shift}"] = encoded[(shift * 4 + 2) // 3 + 1 : -4]
    return forms


def test_every_stage_ran_and_the_server_became_ready(deployed: RunRecord) -> None:
    summary = json.loads((deployed.folder / "summary.json").read_text())
    results = {result["stage"]: result for result in summary["results"]}
    for stage in ("preflight", "download", "config-patch", "launch-script", "launch"):
        assert results[stage]["state"] in ("ok", "changed"), results[stage]
    assert "secrets file written" in results["launch-script"]["message"]
    assert results["diagnose"]["state"] == "ok"
    assert results["diagnose"]["message"].startswith("ready")


def test_the_smoke_test_passes_on_a_server_with_an_api_key(deployed: RunRecord) -> None:
    assert deployed.ok, deployed.message


def test_no_file_of_the_run_folder_holds_a_secret(planted: Planted, deployed: RunRecord) -> None:
    files = sorted(path for path in deployed.folder.rglob("*") if path.is_file())
    names = {path.name for path in files}
    assert {"summary.json", "run.json", "journal.jsonl"} <= names
    assert any(name.endswith(".ipynb") for name in names)
    assert any(name.endswith(".html") for name in names)
    assert any(name.endswith(".results.jsonl") for name in names)
    leaks = [
        f"{path.relative_to(deployed.folder)}: {secret} ({form})"
        for path in files
        for secret, value in planted.values.items()
        for form, needle in leaked_forms(value).items()
        if needle in path.read_bytes()
    ]
    assert leaks == []


def test_the_server_still_received_both_secrets(planted: Planted, deployed: RunRecord) -> None:
    dep = load_deployment(planted.deployment)
    with Host.from_deployment(dep) as host:
        state_dir = server.resolve_paths(host, dep).state_dir
    pid = int(json.loads((Path(state_dir) / "launch.json").read_text())["pid"])
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    assert f"HF_TOKEN={planted.hf_token}".encode() in environ
    # vLLM reads its API key from VLLM_API_KEY: the key stays off the command line, which
    # every user of the host can read.
    assert f"VLLM_API_KEY={planted.api_key}".encode() in environ
    assert planted.api_key.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes()
    assert models_status(dep.server_port, None) == 401
    assert models_status(dep.server_port, planted.api_key) == 200
