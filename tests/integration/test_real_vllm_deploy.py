"""The real-vLLM tier's done-when, as a user types it: ``opsbook sandbox up --dir D --vllm real``
then ``opsbook run deploy -f D/deployment.yml -p apply True -p qualify quick``; the real vLLM
server reaches ready and answers a completion, over SSH (its own rehearsal host at 127.0.0.21),
and 06_qualify files a receipt from the host's own ``vllm bench serve`` against it (the same
server start)."""

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
        "-p",
        "qualify",
        "quick",
        "--runs-dir",
        str(runs),
        timeout=1800,
    )
    deploy_seconds = time.monotonic() - began
    print(f"\n[real vLLM] sandbox up {up_seconds:.1f} s, deploy {deploy_seconds:.1f} s")
    summary = json.loads(next(runs.glob("*/summary.json")).read_text())
    results = [channel.decode(json.dumps(entry)) for entry in summary["results"]]
    stages = {r.stage: r for r in results}
    for r in results:
        print(f"[real vLLM] {r.stage}: {r.duration:.1f} s, {r.state.value}, {r.message}")
    assert all(r.ok for r in results if r.stage != "qualify"), results
    # tiny-llama's weights are random: its greedy answers are undecodable bytes, which the
    # degenerate-output check names, and nothing else fails; so the deploy exits 1.
    qualified = stages["qualify"]
    assert {f.code for f in qualified.findings if f.is_problem} == {"qualify-degenerate-output"}
    assert deploy.returncode == 1, deploy.stdout + deploy.stderr
    assert_a_receipt_from_vllm_bench_serve(next(runs.glob("*/")))
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


def assert_a_receipt_from_vllm_bench_serve(folder: Path) -> None:
    """The receipt of the real server: its cells from ``vllm bench serve``'s own JSON (kept
    beside it), the server's counters without the warm-up, the greedy token ids' hashes."""
    doc = json.loads((folder / "qualify" / "receipt.json").read_text())
    assert doc["schema"] == "opsbook.qualify.receipt/1"
    (receipt,) = doc["receipts"]
    assert receipt["driver"] == "vllm bench serve" and receipt["software"]["vllm"] == "0.32.0+cpu"
    assert receipt["startup"]["kv_cache_tokens"] > 0
    # --max-model-len 512: the quick profile's 1024-token row does not fit, and says so.
    assert [c["cell"]["prompt_tokens"] for c in receipt["skipped_cells"]] == [1024, 1024]
    for cell in receipt["cells"]:
        assert cell["cell"]["prompt_tokens"] == 128 and cell["failed"] == 0
        assert cell["completed"] == 24 and cell["output_tok_s"] > 0
        assert cell["server_generation_tokens"] == 24 * 64  # 2 warm-up requests left out
        assert cell["ttft_ms"]["p99"] >= cell["ttft_ms"]["p50"] > 0
    raws = sorted((folder / "qualify").glob("*/bench-*.json"))
    assert [p.name for p in raws] == ["bench-128x1.json", "bench-128x4.json"]
    for raw in raws:
        saved = json.loads(raw.read_text())
        assert {"completed", "failed", "duration", "output_throughput"} <= saved.keys()
        assert {"p50_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "p99_itl_ms"} <= saved.keys()
        assert saved["completed"] == 24 and saved["max_concurrency"] in (1, 4)
    hashes = receipt["greedy_sha256"]
    assert len(hashes) == 4 and all(len(h) == 64 and int(h, 16) >= 0 for h in hashes.values())
    assert receipt["deterministic"] is True
