"""The real-vLLM tier's done-when, as a user types it: ``opsbook sandbox up --dir D --vllm real``
then ``opsbook run deploy -f D/deployment.yml -p apply True``; the real vLLM server reaches
ready and answers a completion, over SSH (its own rehearsal host at 127.0.0.21)."""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from opsbook.core import channel
from opsbook.core.deployment import load_deployment
from opsbook.rehearsal import real_vllm
from opsbook.rehearsal import sandbox as sandboxes
from opsbook.remote.hosts import Host
from opsbook.steps import server
from tests.integration.conftest import opsbook

pytestmark = [pytest.mark.integration, pytest.mark.realvllm]

ADDRESS = "127.0.0.21"


@pytest.fixture
def folder() -> Iterator[Path]:
    real_vllm.ensure_tier()
    where = Path(tempfile.mkdtemp(prefix="opsbook-realdeploy-", dir="/tmp"))
    # The sandbox's login user must enter it to reach the box below.
    where.chmod(0o755)
    try:
        yield where
    finally:
        deployment = where / "box" / "deployment.yml"
        if deployment.exists():
            dep = load_deployment(deployment)
            with Host.from_deployment(dep) as host:
                server.stop_server(host, server.resolve_paths(host, dep), grace=10)
        sandboxes.down(where / "box")
        shutil.rmtree(where, ignore_errors=True)


def test_sandbox_up_real_then_deploy_serves_a_completion(folder: Path) -> None:
    box = folder / "box"
    began = time.monotonic()
    up = opsbook(
        "sandbox", "up", "--dir", str(box), "--vllm", "real", "--address", ADDRESS, timeout=1800
    )
    assert up.returncode == 0, up.stderr
    up_seconds = time.monotonic() - began
    dep = load_deployment(box / "deployment.yml")
    assert dep.python == str(real_vllm.ensure_tier().python)
    assert Path(dep.model_path).name == "tiny-llama"

    began = time.monotonic()
    runs = folder / "runs"
    deploy = opsbook(
        "run",
        "deploy",
        "-f",
        str(box / "deployment.yml"),
        "-p",
        "apply",
        "True",
        "--runs-dir",
        str(runs),
        timeout=1800,
    )
    deploy_seconds = time.monotonic() - began
    print(f"\n[real vLLM] sandbox up {up_seconds:.1f} s, deploy {deploy_seconds:.1f} s")
    assert deploy.returncode == 0, deploy.stdout + deploy.stderr
    summary = json.loads(next(runs.glob("*/summary.json")).read_text())
    results = [channel.decode(json.dumps(entry)) for entry in summary["results"]]
    stages = {r.stage: r for r in results}
    for r in results:
        print(f"[real vLLM] {r.stage}: {r.duration:.1f} s, {r.state.value}, {r.message}")
    assert all(r.ok for r in results), results
    assert "vLLM 0.32.0+cpu" in stages["preflight"].message
    launched = stages["launch"].message
    assert "smoke test passed" in launched, launched
    assert stages["diagnose"].message.startswith("ready"), stages["diagnose"]
    # /metrics summarized in the record: at 04's ready (after its smoke completion) and at the
    # end of the diagnosis, with the names of 0.32.0.
    recorded = {(m["stage"], m["moment"]): m["summary"] for m in summary["metrics"]}
    at_ready, at_end = recorded[("launch", "ready")], recorded[("diagnose", "end")]
    assert at_ready["release"] == "0.32.0" and at_ready["running"] == 0.0
    assert at_ready["generation_tokens"] >= 1 and at_ready["ttft_p50_s"] is not None
    assert at_ready["kv_cache_usage"] is not None and at_ready["preemptions"] == 0.0
    assert at_end["server_state"] == "ready" and at_end["waiting"] == 0.0
    assert 0 < time.time() - at_end["ready_at"] < deploy_seconds + 60

    # The server the deploy left running answers again, from the host itself, over SSH.
    with Host.from_deployment(dep) as host:
        body = {
            "model": dep.model_path,
            "prompt": "Hello",
            "max_tokens": 4,
            "temperature": 0,
            "ignore_eos": True,
        }
        answer = server.http_get(host, dep.server_port, "/v1/completions", json_body=body)
        assert answer.status == 200, answer
        # Random weights may pick tokens that decode to nothing: count them instead.
        assert json.loads(answer.body)["usage"]["completion_tokens"] == 4
        version = server.http_get(host, dep.server_port, "/version")
        assert json.loads(version.body)["version"] == "0.32.0"
