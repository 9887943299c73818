"""The development cases of opsbook.knowledge.logscan as a table: each short log excerpt in
tests/data/logs/cases is diagnosed and checked against its label in labels.yaml (the label
format is described at the top of that file). A new case is a file and a label, no code.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from opsbook.knowledge.logscan import LogDiagnosis, diagnose_log

CASES = Path(__file__).resolve().parents[1] / "data" / "logs" / "cases"
OPS = ("not", "contains", "lacks", "startswith", "endswith", "truthy")


def _labels() -> list[dict[str, Any]]:
    entries = yaml.safe_load((CASES / "labels.yaml").read_text(encoding="utf-8"))
    assert isinstance(entries, list)
    return entries


LABELS = _labels()


def read_case(name: str) -> str:
    # Bytes as written: a carriage return or a missing final newline is part of the case.
    return (CASES / name).read_bytes().decode("utf-8")


def value_at(diagnosis: LogDiagnosis, path: str) -> Any:
    """The value a dotted path names on the diagnosis: attributes, then mapping keys;
    ``name()`` calls the method, ``str()`` is the diagnosis (or value) as text."""
    value: Any = diagnosis
    for part in path.split("."):
        if part == "str()":
            value = str(value)
        elif part.endswith("()"):
            value = getattr(value, part[:-2])()
        elif isinstance(value, dict):
            value = value[part]
        else:
            value = getattr(value, part)
    return value


def check(diagnosis: LogDiagnosis, key: str, expected: Any) -> None:
    path, _, op = key.partition(" ")
    actual = value_at(diagnosis, path)
    shown = f"{key}: expected {expected!r}, got {actual!r}"
    if not op:
        assert actual == expected, shown
    elif op == "not":
        assert actual != expected, shown
    elif op == "contains":
        assert expected in actual, shown
    elif op == "lacks":
        assert expected not in actual, shown
    elif op == "startswith":
        assert actual.startswith(expected), shown
    elif op == "endswith":
        assert actual.endswith(expected), shown
    else:
        assert op == "truthy", f"unknown check {key!r}"
        assert bool(actual) is expected, shown


@pytest.mark.parametrize("label", LABELS, ids=[label["file"] for label in LABELS])
def test_case_is_diagnosed_as_labelled(label: dict[str, Any]) -> None:
    running = label.get("running")
    diagnosis = diagnose_log(read_case(label["file"]), running=running)

    for expected in label["expect"]:
        ((key, value),) = expected.items()
        check(diagnosis, key, value)


def test_every_case_file_has_one_label_and_every_label_a_file() -> None:
    labelled = [label["file"] for label in LABELS]

    assert len(labelled) == len(set(labelled))
    assert set(labelled) == {path.name for path in CASES.glob("*.log")}


def test_each_label_is_complete_and_names_its_failure_in_the_file_name() -> None:
    for label in LABELS:
        assert label["source"].strip() and label["expect"], label["file"]
        for expected in label["expect"]:
            ((key, _),) = expected.items()
            assert key.partition(" ")[2] in ("", *OPS), (label["file"], key)
        # <failure-id>--<what>.log: the failure named is the one a "failure" check expects.
        failures = [e["failure"] for e in label["expect"] if "failure" in e]
        if failures and failures[0] is not None:
            assert label["file"].startswith(failures[0] + "--"), label["file"]
