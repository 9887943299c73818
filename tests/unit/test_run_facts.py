"""facts.json folded from the stages' notes, the results and 06_qualify's receipt."""

import json
from pathlib import Path

from opsbook.core.facts_schema import load_facts
from opsbook.core.results import HostResult, State
from opsbook.runner import run_facts

HOST = "ops@a:22"


def notes(folder: Path, name: str, *lines: dict) -> None:
    (folder / f"{name}.facts.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))


def test_the_notes_of_every_stage_fold_into_one_record_per_host(tmp_path: Path) -> None:
    notes(
        tmp_path, "00_preflight", {"host": HOST, "section": "engine", "values": {"vllm": "0.15.1"}}
    )
    notes(
        tmp_path,
        "04_launch",
        {"host": HOST, "section": "launch", "values": {"script_digest": "ab"}},
        {"host": HOST, "section": "engine", "values": {"torch": "2.9.1"}},
    )
    results = [
        HostResult(HOST, "preflight", State.OK, "ok"),
        HostResult(HOST, "launch", State.CHANGED, "ready"),
    ]
    path = run_facts.write_facts(
        tmp_path, deployment="d.yml", started="2026-01-01T00:00:00+00:00", status="ok",
        hosts=[HOST], results=results,
    )  # fmt: skip
    facts = load_facts(path)
    one = facts.hosts[HOST]
    assert (one.engine.vllm, one.engine.torch, one.launch.script_digest) == (
        "0.15.1",
        "2.9.1",
        "ab",
    )
    assert one.state == "ready" and one.failures == []
    assert facts.deployment == str((Path.cwd() / "d.yml").resolve())
    assert facts.run == tmp_path.name


def test_a_failed_launch_is_not_ready_and_its_failure_is_kept(tmp_path: Path) -> None:
    results = [HostResult(HOST, "launch", State.FAILED, "died", failure_id="fp8kv-mla")]
    facts = run_facts.collect(
        tmp_path,
        deployment="d.yml",
        started="",
        status="problem found",
        hosts=[HOST],
        results=results,
    )
    assert facts.hosts[HOST].state == "failed"
    assert facts.hosts[HOST].failures == ["fp8kv-mla"]


def test_a_launch_that_left_a_server_without_noting_it_is_not_ready(tmp_path: Path) -> None:
    # A dry run's launch is ok without restarting: only a server that answered is noted.
    results = [HostResult(HOST, "launch", State.OK, "left alone")]
    facts = run_facts.collect(
        tmp_path, deployment="", started="", status="ok", hosts=[HOST], results=results
    )
    assert facts.hosts[HOST].state == "ok"


def test_the_qualification_receipt_gives_its_verdict_and_numbers(tmp_path: Path) -> None:
    from opsbook.steps import qualify_receipt
    from tests.unit.test_qualify_gate import receipt

    qualify_receipt.write_receipt(tmp_path, receipt(1873.4, ttft=120.0, host=HOST))
    qualify_receipt.write_receipt(tmp_path, receipt(50.0, host="ops@b:22", passed=False))
    facts = run_facts.collect(
        tmp_path, deployment="", started="", status="ok", hosts=[HOST, "ops@b:22"], results=[]
    )
    q = facts.hosts[HOST].qualification
    (label,) = {name.split()[0] for name in q.numbers}
    assert q.verdict == "pass"
    assert q.numbers == {f"{label} output_tok_s": 1873.4, f"{label} ttft_p99_ms": 120.0}
    assert facts.hosts["ops@b:22"].qualification.verdict == "fail"


def test_a_receipt_with_another_verdict_or_unreadable_counts_for_nothing(tmp_path: Path) -> None:
    (tmp_path / "qualify").mkdir()
    other = {"schema": "x", "receipts": [{"host": HOST, "verdict": "pass"}]}
    (tmp_path / "qualify" / "receipt.json").write_text(json.dumps(other))
    facts = run_facts.collect(
        tmp_path, deployment="", started="", status="ok", hosts=[HOST], results=[]
    )
    assert facts.hosts[HOST].qualification.verdict is None
    (tmp_path / "qualify" / "receipt.json").write_text("{not json")
    facts = run_facts.collect(
        tmp_path, deployment="", started="", status="ok", hosts=[HOST], results=[]
    )
    assert facts.hosts[HOST].qualification.verdict is None
