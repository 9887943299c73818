"""Last good: a passing qualification, or a ready deploy the operator marked good; never a
failed gate; marks kept beside the run folders."""

import json
from pathlib import Path

import pytest

from opsbook.core.channel import JOURNAL_ENV, OUTCOME_ENV, RUNS_DIR_ENV
from opsbook.core.exceptions import RunError
from opsbook.core.facts_schema import (
    EngineFacts,
    HostFingerprint,
    HostRunFacts,
    Qualification,
    RunFacts,
)
from opsbook.steps import last_good

HOST = "ops@a:22"


def filed(
    runs: Path,
    name: str,
    *,
    deployment: Path,
    state: str | None = "ready",
    verdict: str | None = None,
    driver: str = "595.58.03",
    vllm: str = "0.15.1",
) -> str:
    facts = HostRunFacts(
        fingerprint=HostFingerprint(driver=driver),
        engine=EngineFacts(vllm=vllm),
        qualification=Qualification(verdict=verdict),
        state=state,
    )
    doc = RunFacts(run=name, deployment=str(deployment.resolve()), hosts={HOST: facts})
    (runs / name).mkdir(parents=True)
    (runs / name / "facts.json").write_text(doc.to_json())
    return name


@pytest.fixture
def dep(tmp_path: Path) -> Path:
    path = tmp_path / "d.yml"
    path.write_text("")
    return path


def test_a_passing_qualification_is_last_good_without_a_mark(tmp_path, dep) -> None:
    runs = tmp_path / "runs"
    filed(runs, "20260101T000000Z-deploy", deployment=dep, verdict="pass")
    filed(runs, "20260102T000000Z-deploy", deployment=dep, verdict="fail", vllm="0.33.0")
    filed(runs, "20260103T000000Z-deploy", deployment=dep, vllm="0.33.0")  # ready, unmarked
    good = last_good.last_good_for(runs, dep, HOST)
    assert good is not None
    assert (good.run, good.why) == ("20260101T000000Z-deploy", last_good.QUALIFIED)


def test_a_ready_deploy_marked_good_moves_last_good_and_the_mark_is_beside_the_runs(
    tmp_path, dep
) -> None:
    runs = tmp_path / "runs"
    filed(runs, "20260101T000000Z-deploy", deployment=dep, verdict="pass")
    newer = filed(runs, "20260103T000000Z-deploy", deployment=dep, vllm="0.33.0")
    assert last_good.mark_good(runs, newer) == [HOST]
    good = last_good.last_good_for(runs, dep, HOST)
    assert good is not None and (good.run, good.why) == (newer, last_good.MARKED)
    [line] = (runs / last_good.MARKS_FILE).read_text().splitlines()
    assert json.loads(line)["run"] == newer
    assert (runs / last_good.MARKS_FILE).stat().st_mode & 0o777 == 0o600


def test_a_failed_qualification_or_a_server_not_ready_cannot_be_marked(tmp_path, dep) -> None:
    runs = tmp_path / "runs"
    failed = filed(runs, "20260102T000000Z-deploy", deployment=dep, verdict="fail")
    with pytest.raises(RunError, match="failed its qualification") as e:
        last_good.mark_good(runs, failed)
    assert "06_qualify" in e.value.remedy
    not_ready = filed(runs, "20260103T000000Z-deploy", deployment=dep, state="failed")
    with pytest.raises(RunError, match="left no server ready"):
        last_good.mark_good(runs, not_ready)
    with pytest.raises(RunError, match="has no facts.json"):
        last_good.mark_good(runs, "20260104T000000Z-deploy")
    with pytest.raises(RunError, match="has no host ops@b:22"):
        last_good.mark_good(runs, not_ready, ["ops@b:22"])
    assert last_good.last_good_for(runs, dep, HOST) is None


def test_last_good_is_kept_per_host_fingerprint(tmp_path, dep) -> None:
    runs = tmp_path / "runs"
    filed(runs, "20260101T000000Z-deploy", deployment=dep, verdict="pass")
    filed(runs, "20260102T000000Z-deploy", deployment=dep, verdict="pass", driver="600.1")
    filed(runs, "20260103T000000Z-deploy", deployment=dep, verdict="pass", driver="600.1")
    found = sorted((g.facts.fingerprint.driver, g.run) for g in last_good.last_good(runs))
    assert found == [("595.58.03", "20260101T000000Z-deploy"), ("600.1", "20260103T000000Z-deploy")]


def test_since_last_good_names_only_facts_known_on_both_sides(tmp_path, dep) -> None:
    runs = tmp_path / "runs"
    filed(runs, "20260101T000000Z-deploy", deployment=dep, verdict="pass")
    filed(runs, "20260102T000000Z-deploy", deployment=dep, state=None, driver="600.1")
    [found] = last_good.since_last_good(runs, dep, [HOST])
    assert found.diff is not None
    assert [c.line() for c in found.diff.changes] == ["fingerprint.driver 595.58.03 -> 600.1"]
    [line] = last_good.describe_since([found])
    assert line.startswith(f"{HOST}: since last good (20260101T000000Z-deploy, qualified)")
    [none] = last_good.since_last_good(tmp_path / "empty", dep, [HOST])
    assert "no last good run" in last_good.describe_since([none])[0]


def test_the_runs_folder_of_a_run_is_above_the_folder_of_its_journal(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv(RUNS_DIR_ENV, raising=False)
    monkeypatch.delenv(JOURNAL_ENV, raising=False)
    assert last_good.runs_dir_of_run() is None
    # A deploy in batches: the outcome files in batch folders, the journal at the top.
    monkeypatch.setenv(OUTCOME_ENV, str(tmp_path / "runs" / "r1" / "batch-02" / "x.results.jsonl"))
    monkeypatch.setenv(JOURNAL_ENV, str(tmp_path / "runs" / "r1" / "journal.jsonl"))
    assert last_good.runs_dir_of_run() == tmp_path / "runs"
    monkeypatch.setenv(RUNS_DIR_ENV, str(tmp_path / "lab"))
    assert last_good.runs_dir_of_run() == tmp_path / "lab"


def test_the_gate_and_records_name_the_same_last_good_run_of_a_host(tmp_path, dep) -> None:
    # 06's gate reads receipts, `records last-good` the runs' facts: one rule (judged_good)
    # and one grouping (newest_good) give the same run; another host's receipt on the same
    # hardware is not this host's last good.
    import dataclasses

    from opsbook.runner import run_facts
    from opsbook.steps import qualify_gate
    from opsbook.steps import qualify_receipt as receipts

    runs = tmp_path / "runs"

    def qualified(name: str, host: str, passed: bool, when: str) -> receipts.Receipt:
        made = receipts.Receipt(
            host=host, started_at=when, profile="quick", driver="client",
            fingerprint=receipts.Fingerprint("RTX", 8), software=receipts.Software(model="m"),
            startup=receipts.Startup(), passed=passed,
        )  # fmt: skip
        (runs / name).mkdir(parents=True)
        receipts.write_receipt(runs / name, made)
        facts = run_facts.collect(runs / name, deployment=str(dep), started=when, status="ok",
                                  hosts=[host], results=[])  # fmt: skip
        (runs / name / "facts.json").write_text(facts.to_json())
        return dataclasses.replace(made, run_folder=str(runs / name))

    earlier = [
        qualified("20260101T000000Z-06_qualify", HOST, True, "2026-01-01"),
        qualified("20260102T000000Z-06_qualify", HOST, False, "2026-01-02"),
        qualified("20260103T000000Z-06_qualify", "ops@b:22", True, "2026-01-03"),
    ]
    now = dataclasses.replace(earlier[0], started_at="2026-01-04", run_folder="")
    good, alike = qualify_gate.last_good(now, earlier)
    assert good is earlier[0] and alike == [earlier[0]]
    [recorded] = [g for g in last_good.last_good(runs) if g.host == HOST]
    assert Path(good.run_folder).name == recorded.run == "20260101T000000Z-06_qualify"


def test_one_rule_says_what_is_good() -> None:
    assert last_good.judged_good("pass", False, False) == last_good.QUALIFIED
    assert last_good.judged_good(None, True, True) == last_good.MARKED
    assert last_good.judged_good("fail", True, True) == ""  # a mark never overrules a gate
    assert last_good.judged_good(None, True, False) == ""
