"""06_qualify over real SSH against the simulated vLLM of a rehearsal host of this module's own:
a first run passes on its own checks and becomes the last good; the same speed again passes,
20% slower is a regression (its charts drawing the last good run beside it, its evaluation file
scored and paired, its tool calls valid); each serving fault fails the verdict with its own
finding; a server whose engine stops mid-cell is hung at the stall, not at the request timeout; a
busy server is skipped with exit code 6; a run through the CLI files its receipt, its verdict in
run.json, its /metrics summaries, its charts and its textfile.

Tokens are paced (``OPSBOOK_SIM_TOKEN_SECONDS``), so speed is the simulator's and not this
machine's; ``--max-model-len 512`` leaves the quick profile's 128-token row (the 1024-token
row is skipped as too long, and said so).
"""

from __future__ import annotations

import dataclasses
import json
import posixpath
import threading
import time
import urllib.request
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from opsbook.core.deployment import Deployment, load_deployment
from opsbook.core.results import EXIT_BUSY, SERVER_BUSY, State
from opsbook.rehearsal.sandbox import Sandbox
from opsbook.rehearsal.sim.vllm._simserver import WORDS
from opsbook.rehearsal.sim.vllm._simserving import NATURAL_LENGTH, token_ids
from opsbook.remote.hosts import Host
from opsbook.runner import run as runner
from opsbook.stages import qualify
from opsbook.stages.base import Report
from opsbook.steps import metrics, patch, plots, server
from opsbook.steps import qualify_correctness as correctness
from opsbook.steps import qualify_gate as gate
from opsbook.steps import qualify_tools as tool_calls
from opsbook.steps.script import render_script, upload_script
from tests.integration.conftest import opsbook, rehearsal_host

pytestmark = pytest.mark.integration

ADDRESS = "127.0.6.33"
TOKEN_SECONDS = "0.004"
# The speed test's tokens: slow enough that a request's own overhead on a loaded test machine
# (the client's threads, HTTP) is a small share of its time, so the same speed reads the same.
MEASURED_TOKEN_SECONDS = "0.01"
READY_TIMEOUT = 60.0
SVG = "{http://www.w3.org/2000/svg}"


@pytest.fixture(scope="module")
def box() -> Iterator[Sandbox]:
    with rehearsal_host("qualify", address=ADDRESS) as rehearsal:
        settings = rehearsal.venv / "opsbook-vllm-sim.json"
        stored = json.loads(settings.read_text()) if settings.exists() else {}
        settings.write_text(json.dumps({**stored, "startup_seconds": 1, "fault": None}))
        settings.chmod(0o644)
        dep = load_deployment(rehearsal.deployment_path)
        host = Host.from_deployment(dep)
        try:
            texts = patch.read_configs(host, dep.model_path)
            plan = patch.plan_patch(texts, patch.fp8_kv_cache_edits(texts))
            assert patch.apply_patch(host, dep.model_path, plan, apply=True).ok
        finally:
            host.close()
        yield rehearsal


@dataclasses.dataclass
class Rig:
    dep: Deployment
    host: Host
    paths: server.LaunchPaths

    def serve(self, **env: str) -> Deployment:
        """(Re)start the server with the simulator's serving settings in its env."""
        server.stop_server(self.host, self.paths, grace=2)
        self.dep = dataclasses.replace(
            self.dep,
            env={"OPSBOOK_SIM_TOKEN_SECONDS": TOKEN_SECONDS, **env},
            serve_args={
                **self.dep.serve_args,
                "max-model-len": 512,
                # The simulator's tool calls, checked in every run here (3 short requests).
                "enable-auto-tool-choice": True,
                "tool-call-parser": "hermes",
            },
        )
        assert upload_script(self.host, self.dep, render_script(self.dep)).ok
        assert server.start_server(self.host, self.paths, self.dep.server_port).ok
        ready = server.wait_until_ready(
            self.host, self.paths, self.dep.server_port, timeout=READY_TIMEOUT, interval=0.25
        )
        assert ready.ok, str(ready)
        return self.dep

    def qualify(self, folder: Path, eval_file: str = "") -> Report:
        folder.mkdir(parents=True)
        options = qualify.Options(record_folder=str(folder), eval_file=eval_file)
        return qualify.run(self.host, self.dep, options)


@pytest.fixture
def rig(box: Sandbox) -> Iterator[Rig]:
    dep = load_deployment(box.deployment_path)
    host = Host.from_deployment(dep)
    rig = Rig(dep, host, server.resolve_paths(host, dep))
    try:
        yield rig
    finally:
        server.stop_server(host, rig.paths, grace=2)
        host.close()


def codes(report: Report) -> set[str]:
    return {f.code for f in report.verdict.findings if f.is_problem}


def receipt_of(folder: Path) -> dict:
    doc = json.loads((folder / "qualify" / "receipt.json").read_text())
    assert doc["schema"] == "opsbook.qualify.receipt/1"
    (receipt,) = doc["receipts"]
    return receipt


def eval_file(rig: Rig) -> str:
    """A file of 8 questions on the host: the simulator answers 6 right (their expected answer
    is its own greedy reply: 12 tokens without ignore_eos, each a word of its vocabulary, from
    the prompt's hash) and 2 wrong (it writes no number)."""
    lines = []
    for n in range(8):
        prompt = f"Evaluation item {n}:"
        reply = "".join(" " + WORDS[i % len(WORDS)] for i in token_ids(prompt, NATURAL_LENGTH))
        lines.append(json.dumps({"prompt": prompt, "answer": reply if n < 6 else "#### 42"}))
    path = posixpath.join(rig.host.home_folder(), "eval.jsonl")
    rig.host.upload(path, "\n".join(lines) + "\n")
    return path


def test_a_first_run_passes_the_same_speed_again_passes_and_20_percent_slower_fails(
    rig: Rig, tmp_path: Path
) -> None:
    rig.serve(OPSBOOK_SIM_TOKEN_SECONDS=MEASURED_TOKEN_SECONDS)
    questions = eval_file(rig)
    first = rig.qualify(tmp_path / "run-1", eval_file=questions)
    assert first.state is State.OK, str(first.verdict)
    assert "first run on this hardware" in first.verdict.message
    receipt = receipt_of(tmp_path / "run-1")
    assert receipt["passed"] and receipt["driver"] == "built-in client"
    assert [(c["cell"]["prompt_tokens"], c["cell"]["concurrency"]) for c in receipt["cells"]] == [
        (128, 1),
        (128, 4),
    ]
    assert {s["cell"]["prompt_tokens"] for s in receipt["skipped_cells"]} == {1024}
    assert "max model length 512" in receipt["skipped_cells"][0]["reason"]
    assert receipt["startup"]["kv_cache_tokens"] > 0
    assert receipt["fingerprint"]["gpu_count"] == 8
    assert all(len(h) == 64 for h in receipt["greedy_sha256"].values())
    # Server-side counters, warm-up taken out: 64 tokens a request exactly.
    for cell in receipt["cells"]:
        assert cell["server_generation_tokens"] == 64 * cell["completed"]
    assert receipt["tool_calls"] == {
        "parser": "hermes",
        "asked": 3,
        "valid": 3,
        "rate": 1.0,
        "problems": [],
    }
    scored = receipt["evaluation"]
    assert (scored["items"], scored["correct"], scored["failed"]) == (8, 6, 0)
    assert (scored["low"], scored["high"]) == (0.4093, 0.9285)  # Wilson, 6 of 8
    assert sorted(scored["outcomes"].values()) == [0, 0, 1, 1, 1, 1, 1, 1]

    again = rig.qualify(tmp_path / "run-2", eval_file=questions)
    assert again.state is State.OK, str(again.verdict)
    assert "against the last good run" in again.verdict.message
    assert receipt_of(tmp_path / "run-2")["compared_with"] == str(tmp_path / "run-1")
    (paired,) = [f for f in again.verdict.findings if f.subject.startswith("evaluation")]
    assert "8 item(s) paired with the last good run: 0 right then and wrong now, 0 the other" in (
        paired.message
    )
    # Its charts draw the last good run's cells (dashed) beside its own.
    (tok_s, ttft) = [s for s in again.shows if isinstance(s, plots.Chart)]
    assert str(tok_s).endswith("against the last good run")
    drawn = {
        (c.get("data-series"), c.get("data-x")): float(c.get("data-value", "nan"))
        for c in ET.fromstring(tok_s.svg).iter(f"{SVG}circle")
        if c.get("class") == "last-good"
    }
    assert drawn == {
        ("prompt 128", str(c["cell"]["concurrency"])): c["output_tok_s"] for c in receipt["cells"]
    }
    assert "p99 TTFT" in str(ttft)

    rig.serve(OPSBOOK_SIM_TOKEN_SECONDS=MEASURED_TOKEN_SECONDS, OPSBOOK_SIM_SLOWDOWN="1.25")
    slower = rig.qualify(tmp_path / "run-3")
    assert slower.state is State.FAILED
    assert gate.CODE_DECODE in codes(slower), str(slower.verdict)
    assert not receipt_of(tmp_path / "run-3")["passed"]


@pytest.mark.parametrize(
    ("fault", "code"),
    [
        ("bang", correctness.CODE_DEGENERATE),
        ("batch-dependent", correctness.CODE_NONDETERMINISTIC),
        ("crash-after:6", gate.CODE_DIED),
        ("crash-under:4", gate.CODE_FAILED),
        ("bad-tool-args", tool_calls.CODE_TOOL_CALLS),
    ],
)
def test_each_serving_fault_fails_the_verdict_with_its_own_finding(
    rig: Rig, tmp_path: Path, fault: str, code: str
) -> None:
    rig.serve(OPSBOOK_SIM_SERVING_FAULT=fault)
    report = rig.qualify(tmp_path / "run")
    assert report.state is State.FAILED
    assert code in codes(report), str(report.verdict)
    assert not receipt_of(tmp_path / "run")["passed"]


def test_a_server_that_stops_making_tokens_mid_cell_is_hung_at_the_stall_not_the_timeout(
    rig: Rig, tmp_path: Path
) -> None:
    # The engine-hang fault: once ready the engine core never answers; /health stays 200 and
    # every request stays running without a token. The product's own stall (15 s) ends the
    # cell, far before the client's 120 s request timeout.
    rig.serve(OPSBOOK_SIM_FAULT="engine-hang")
    started = time.monotonic()
    report = rig.qualify(tmp_path / "run")
    took = time.monotonic() - started
    assert report.state is State.FAILED
    assert codes(report) == {gate.CODE_HUNG}, str(report.verdict)
    (hung,) = [f for f in report.verdict.findings if f.code == gate.CODE_HUNG]
    assert hung.subject == "cell 128 x 1"
    assert "hung: 1 request(s) running and 0 waiting, and the generation counter stayed at 0" in (
        hung.message
    )
    assert took < metrics.STALL_SECONDS + 40, took
    receipt = receipt_of(tmp_path / "run")
    (cell,) = receipt["cells"]
    assert cell["hung"]["seconds"] >= metrics.STALL_SECONDS and cell["hung"]["running"] == 1.0
    assert {
        (s["cell"]["prompt_tokens"], s["cell"]["concurrency"], s["reason"])
        for s in receipt["skipped_cells"]
    } >= {(128, 4, "not run: the server hung in cell 128 x 1")}
    assert server.http_get(rig.host, rig.dep.server_port, "/health").status == 200


def hold(request: urllib.request.Request) -> None:
    """One long request, kept running until it ends or its server stops."""
    try:
        urllib.request.urlopen(request, timeout=60).read()
    except OSError:
        pass


def test_a_busy_server_is_skipped_with_its_exit_code(
    rig: Rig, box: Sandbox, tmp_path: Path
) -> None:
    rig.serve(OPSBOOK_SIM_TOKEN_SECONDS="0.2")
    body = json.dumps({"prompt": "hold", "max_tokens": 200, "ignore_eos": True}).encode()
    url = f"http://127.0.0.1:{rig.dep.server_port}/v1/completions"
    request = urllib.request.Request(url, body, {"Content-Type": "application/json"})
    held = threading.Thread(target=hold, args=(request,), daemon=True)
    held.start()
    try:
        time.sleep(0.5)
        record = runner.run_notebook("06_qualify", box.deployment_path, runs_dir=tmp_path)
    finally:
        # The held request (40 s of tokens) ends with its server, not at its last token.
        server.stop_server(rig.host, rig.paths, grace=2)
        held.join(30)
    assert record.exit_code == EXIT_BUSY, record.message
    (result,) = record.results
    assert result.state is State.SKIPPED and result.failure_id == SERVER_BUSY
    assert "busy: 1 request(s) running" in result.message


def test_a_qualification_run_files_its_receipt_its_metrics_and_a_textfile(
    rig: Rig, box: Sandbox, tmp_path: Path
) -> None:
    rig.serve()
    textfiles = tmp_path / "textfile"
    textfiles.mkdir()
    done = opsbook("run", "06_qualify", "-f", str(box.deployment_path), "--textfile",
                   str(textfiles), "--runs-dir", str(tmp_path / "runs"))  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    (folder,) = (tmp_path / "runs").iterdir()
    assert receipt_of(folder)["passed"]
    run = json.loads((folder / "run.json").read_text())
    assert {m["moment"] for m in run["metrics"]} == {"before", "end"}
    verdict = run["qualification"][rig.host.name]
    assert verdict["verdict"] == "passed" and verdict["receipt"] == "qualify/receipt.json"
    # The charts are in the executed notebook (what the HTML record is made from).
    (executed,) = folder.glob("*.ipynb")
    svgs = [
        "".join(output["data"]["image/svg+xml"])
        for cell in json.loads(executed.read_text())["cells"]
        for output in cell.get("outputs", [])
        if "image/svg+xml" in output.get("data", {})
    ]
    assert any("output tok/s by concurrency" in svg and 'class="now"' in svg for svg in svgs)
    name = load_deployment(box.deployment_path).name
    written = textfiles / f"opsbook_{name}_qualify.prom"
    assert f"textfile: {written}" in done.stdout
    passed = {
        sample.labels["host"]: sample.value
        for family in text_string_to_metric_families(written.read_text())
        for sample in family.samples
        if sample.name == "opsbook_qualify_passed"
    }
    assert passed == {rig.host.name: 1.0}
