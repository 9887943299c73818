"""The facts schema: versioned, typed, and folded from the notes the stages write."""

import json
from pathlib import Path

import pytest

from opsbook.core import facts_schema
from opsbook.core.channel import OUTCOME_ENV
from opsbook.core.exceptions import RunError
from opsbook.core.facts_schema import HostFingerprint, HostRunFacts, RunFacts


def test_a_record_round_trips_with_its_schema_version(tmp_path: Path) -> None:
    facts = RunFacts(
        run="r1",
        deployment="/d.yml",
        hosts={"ops@a:22": HostRunFacts(fingerprint=HostFingerprint(driver="595.58.03"))},
    )
    path = tmp_path / "facts.json"
    path.write_text(facts.to_json())
    assert json.loads(path.read_text())["schema_version"] == facts_schema.SCHEMA_VERSION
    assert facts_schema.load_facts(path) == facts


def test_a_record_of_a_newer_schema_is_refused_by_name(tmp_path: Path) -> None:
    path = tmp_path / "facts.json"
    path.write_text(json.dumps({"schema_version": 99, "run": "r", "deployment": "d"}))
    with pytest.raises(RunError, match="facts schema 99; this opsbook reads up to 1") as e:
        facts_schema.load_facts(path)
    assert "upgrade opsbook" in e.value.remedy


def test_keys_a_later_opsbook_added_are_ignored(tmp_path: Path) -> None:
    path = tmp_path / "facts.json"
    doc = {"schema_version": 1, "run": "r", "deployment": "d", "hosts": {"h": {"new": 1}}}
    path.write_text(json.dumps(doc))
    assert facts_schema.load_facts(path).hosts["h"] == HostRunFacts()


def test_the_fingerprint_digest_moves_with_the_driver_only_when_it_changes() -> None:
    one = HostFingerprint(gpus=["B200"] * 8, driver="575.57.08", kernel="6.8")
    assert (
        one.digest()
        == HostFingerprint(gpus=["B200"] * 8, driver="575.57.08", kernel="6.8").digest()
    )
    assert one.digest() != one.model_copy(update={"driver": "580.95.05"}).digest()


def test_notes_go_beside_the_outcome_file_and_fold_in_order(tmp_path, monkeypatch) -> None:
    outcome = tmp_path / "00_preflight.results.jsonl"
    monkeypatch.setenv(OUTCOME_ENV, str(outcome))
    assert facts_schema.recording()
    facts_schema.note("h", "engine", {"vllm": "0.15.1", "torch": None})
    facts_schema.note("h", "engine", {"vllm": None, "torch": "2.9.1"})
    facts_schema.note("h", "fingerprint", {"driver": "595"})
    path = tmp_path / "00_preflight.facts.jsonl"
    assert facts_schema.notes_file(outcome) == path
    with path.open("a") as f:
        f.write('{"host": "h", "sect')  # a line cut short by a killed kernel
    folded = facts_schema.read_notes([path])
    # A None does not erase a value known.
    assert folded == {
        "h": {"engine": {"vllm": "0.15.1", "torch": "2.9.1"}, "fingerprint": {"driver": "595"}}
    }


def test_outside_a_run_nothing_is_noted_and_an_unknown_section_is_a_defect(
    tmp_path, monkeypatch
) -> None:
    monkeypatch.delenv(OUTCOME_ENV, raising=False)
    assert not facts_schema.recording()
    facts_schema.note("h", "engine", {"vllm": "0.15.1"})
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ValueError, match="no facts section 'engines'"):
        facts_schema.note("h", "engines", {})
