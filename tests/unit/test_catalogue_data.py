"""The failure catalogue is data: no failure id is spelled in opsbook's Python, every stage
finding and decision role names an entry, and a bad entry is refused with its name and field."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from opsbook.core.exceptions import OpsbookError
from opsbook.knowledge.logscan import catalogue, failure_for, load_catalogue

ROOT = Path(__file__).resolve().parents[2]
IDS = {entry.id for entry in load_catalogue()} | {
    entry.family for entry in load_catalogue() if entry.family
}
# Strings equal to a failure id that are words of another vocabulary, each where it is one.
OTHER_VOCABULARIES = {
    # The simulator's fault names: a stdlib-only program on the rehearsal host, run with
    # OPSBOOK_SIM_FAULT, that cannot read the catalogue.
    ("opsbook/rehearsal/sim/vllm/_simconfig.py", "oom"),
    ("opsbook/rehearsal/sim/vllm/_simconfig.py", "nccl-timeout"),
    ("opsbook/rehearsal/sim/vllm/_simengine.py", "oom"),
    ("opsbook/rehearsal/sim/vllm/_simengine.py", "nccl-timeout"),
    ("opsbook/rehearsal/fleet.py", "oom"),
    # A vLLM flag of the sandbox's example deployment.
    ("opsbook/rehearsal/box_files.py", "trust-remote-code"),
    # Keys of a probe's answer: the NCCL library found, /dev/shm's state.
    ("opsbook/remote/probes/cluster_node.py", "nccl"),
    ("opsbook/stages/cluster_preflight.py", "nccl"),
    ("opsbook/remote/probes/facts.py", "shm"),
    ("opsbook/remote/probes/launch.py", "shm"),
    ("opsbook/steps/host_facts.py", "shm"),
    ("opsbook/steps/launch_answers.py", "shm"),
}


def spelled_ids(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in IDS
    }


def test_no_failure_id_of_the_catalogue_is_spelled_in_opsbooks_python() -> None:
    spelled = {
        (str(path.relative_to(ROOT)), found)
        for path in sorted((ROOT / "opsbook").rglob("*.py"))
        for found in spelled_ids(path)
    }

    assert spelled - OTHER_VOCABULARIES == set()


def test_the_check_sees_an_id_spelled_in_code(tmp_path: Path) -> None:
    module = tmp_path / "decides.py"
    module.write_text('FAILURE = "host-oom-killer"\n', encoding="utf-8")

    assert spelled_ids(module) == {"host-oom-killer"}


def test_each_decision_role_is_played_by_one_entry() -> None:
    roles = {role: catalogue.entry_with(role).kind for role in catalogue.ROLES}

    assert set(roles) == set(catalogue.ROLES)


@pytest.mark.parametrize(
    ("finding", "failure"),
    [
        ("shards-missing", "weights-missing"),
        ("shards-damaged", "safetensors-corrupt"),
        ("ray-node-lost", "ray-node-died"),
        ("ray-resources-short", "ray-resources"),
        ("ray-versions-differ", "ray-version-mismatch"),
    ],
)
def test_a_stage_finding_names_its_failure_through_the_catalogue(
    finding: str, failure: str
) -> None:
    assert failure_for(finding) == failure


def test_a_finding_no_entry_raises_is_an_error() -> None:
    with pytest.raises(OpsbookError, match="no-such-finding"):
        failure_for("no-such-finding")


GOOD = {
    "id": "x-fails",
    "title": "x fails",
    "kind": "cause",
    "severity": "error",
    "priority": 1,
    "patterns": ["x failed"],
    "remedy": "fix x",
    "source": "x 1.0 x.py",
}


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"walk_back": True}, ["'x-fails'", "unknown field 'walk_back'"]),
        ({"patterns": ["x (failed"]}, ["'x-fails'", "'patterns'", "no valid regex"]),
        ({"fallback": "yes"}, ["'x-fails'", "'fallback'", "not true or false"]),
        ({"detail_under": {"marker": "^Last"}}, ["'x-fails'", "'detail_under'", "within"]),
        ({"kind": "reason"}, ["'x-fails'", "kind 'reason'"]),
    ],
)
def test_a_bad_entry_is_refused_naming_the_entry_and_the_field(
    change: dict[str, object], words: list[str]
) -> None:
    with pytest.raises(OpsbookError) as raised:
        catalogue._entry({**GOOD, **change})

    assert all(word in str(raised.value) for word in words), str(raised.value)


def test_an_entry_without_a_required_field_is_refused_naming_it() -> None:
    raw = {key: value for key, value in GOOD.items() if key != "remedy"}

    with pytest.raises(OpsbookError, match="'x-fails' lacks the field 'remedy'"):
        catalogue._entry(raw)


def test_the_signals_are_read_into_their_typed_fields() -> None:
    signals = catalogue.signals()

    assert [name for name, _ in signals.phases][0] == "args"
    assert signals.stats.search(
        "Avg prompt throughput: 1.0 tokens/s, Avg generation throughput: 2.0 tokens/s"
    )
