"""Drift in preflight: what moved on a host since its last good run, as warnings with remedies."""

import json
from pathlib import Path

from opsbook.core.channel import JOURNAL_ENV, RUNS_DIR_ENV
from opsbook.core.deployment import parse_deployment
from opsbook.core.exceptions import ProbeError
from opsbook.core.facts_schema import (
    EngineFacts,
    HostFingerprint,
    HostRunFacts,
    ModelFacts,
    Qualification,
    RunFacts,
)
from opsbook.core.results import Result
from opsbook.remote.testing import FakeHost
from opsbook.steps import drift
from opsbook.steps.host_facts import HostFacts, OsInfo, PythonInfo
from opsbook.steps.last_good import GoodRun, deployment_key
from opsbook.steps.smi_parse import Gpu, Topology

GOOD = HostRunFacts(
    fingerprint=HostFingerprint(gpus=["B200"] * 8, driver="575.57.08", kernel="6.8.0"),
    engine=EngineFacts(vllm="0.15.1", torch="2.9.1"),
    model=ModelFacts(manifest_digest="aa"),
)


def good_run(facts: HostRunFacts = GOOD) -> GoodRun:
    return GoodRun("20260101T000000Z-deploy", "/d.yml", "ops@a:22", "qualified", facts)


def test_each_fact_that_moved_is_a_warning_naming_then_and_now_and_the_good_run() -> None:
    live = HostRunFacts(
        fingerprint=HostFingerprint(gpus=["B200"] * 8, driver="580.95.05", kernel="6.8.0"),
        engine=EngineFacts(vllm="0.33.0"),  # torch not read live: unknown, not moved
        model=ModelFacts(manifest_digest="bb"),
    )
    found = drift.drift_findings(live, good_run())
    assert [(f.severity, f.subject) for f in found] == [
        ("warning", "driver"),
        ("warning", "vLLM"),
        ("warning", "model manifest"),
    ]
    assert "01_download_check" in found[2].remedy
    driver = found[0]
    assert driver.message == "driver moved since last good: 575.57.08 -> 580.95.05"
    assert driver.source == "run 20260101T000000Z-deploy (qualified)"
    assert "apt-mark hold" in driver.remedy and "06_qualify" in driver.remedy
    assert driver.code == drift.DRIFT_CODE


def test_nothing_moved_is_said_once_and_no_last_good_says_nothing() -> None:
    [same] = drift.drift_findings(GOOD, good_run())
    assert same.severity == "info" and "nothing moved since last good" in same.message
    assert drift.drift_findings(GOOD, None) == []


def test_the_verdict_names_what_moved_and_the_notebook_gets_a_table() -> None:
    live = GOOD.model_copy(
        update={"fingerprint": GOOD.fingerprint.model_copy(update={"kernel": "6.11"})}
    )
    found = drift.drift_findings(live, good_run())
    verdict = drift.noted(Result(True, "ops@a: 8 GPUs"), found)
    assert verdict.message == "ops@a: 8 GPUs; moved since last good: kernel"
    [table] = drift.tables(found)
    assert table.rows[0][:2] == ["kernel", "6.8.0 -> 6.11"]
    assert drift.tables([]) == []


def live_facts(driver: str) -> HostFacts:
    return HostFacts(
        host="ops@a",
        gpus=[Gpu(i, "B200", "10.0") for i in range(8)],
        processes=[],
        topology=Topology(),
        driver=driver,
        cuda="13.0",
        os=OsInfo(kernel="6.8.0"),
        python=PythonInfo("python3", "/usr/bin/python3", "3.11.9"),
        vllm_version="0.15.1",
        disk_free_bytes=None,
        shm_total=None,
        shm_free=None,
        listening=[],
        servers=[],
    )


def test_preflight_compares_the_live_host_with_last_good_in_its_runs_folder(
    tmp_path: Path, monkeypatch
) -> None:
    source = tmp_path / "d.yml"
    source.write_text("")
    doc = {"model": {"path": "/m"}, "hosts": [{"address": "a", "user": "ops"}]}
    dep = parse_deployment(doc, source=str(source))
    runs = tmp_path / "runs"
    good = GOOD.model_copy(update={"qualification": Qualification(verdict="pass")})
    filed = RunFacts(
        run="20260101T000000Z-deploy", deployment=deployment_key(source), hosts={"ops@a": good}
    )
    (runs / filed.run).mkdir(parents=True)
    (runs / filed.run / "facts.json").write_text(filed.to_json())
    monkeypatch.delenv(RUNS_DIR_ENV, raising=False)
    monkeypatch.setenv(JOURNAL_ENV, str(runs / "now" / "journal.jsonl"))
    versions = {"versions": {"torch": "2.10.0", "vllm": "0.15.1"}}
    # The host's python answers torch; the manifest probe does not answer: unknown, not moved.
    unanswered = ProbeError("the probe did not answer JSON")
    host = FakeHost("a", commands={"-c": json.dumps(versions)}, probes={"download": unanswered})
    moved = drift.since_last_good(host, dep, live_facts("580.95.05"))
    assert [(f.subject, f.message.split(": ")[-1]) for f in moved] == [
        ("driver", "575.57.08 -> 580.95.05"),
        ("torch", "2.9.1 -> 2.10.0"),
    ]
    assert [kind for kind, _ in host.calls] == ["run", "probe"]
    other = FakeHost("b", commands={"-c": json.dumps(versions)})
    assert drift.since_last_good(other, dep, live_facts("580.95.05")) == []
    assert other.calls == []  # no last good: not one command more
    monkeypatch.delenv(JOURNAL_ENV)
    assert drift.since_last_good(host, dep, live_facts("580.95.05")) == []
