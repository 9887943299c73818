"""Checks of the labelled real vLLM log sets and their labels: the former held-out sets, seen
while the catalogue was developed and now development logs (tests/data/logs/development/heldout*,
issue 31, item 4), and the fresh held-out set (tests/data/logs/heldout-2026-12).

These tests only check the sets themselves: every labelled file exists, keeps its provenance line,
holds its key line verbatim (as ``grep -F`` would find it) and carries a failure id of the
shared vocabulary. They never run the diagnosis.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

HELDOUT = Path(__file__).resolve().parents[1] / "data" / "logs" / "development" / "heldout"

# The failure ids of the diagnosis catalogue, as fixed for this session (existing and new).
VOCABULARY = frozenset(
    {
        "fp8kv-mla",
        "no-backend",
        "oom",
        "kv-cache-too-small",
        "free-memory",
        "free-memory-info",
        "port-in-use",
        "trust-remote-code",
        "custom-allreduce",
        "custom-allreduce-disabled",
        "symm-mem-unsupported",
        "nccl",
        "quant-capability",
        "safetensors-corrupt",
        "shm",
        "shm-space",
        "unknown-arg",
        "model-not-found",
        "host-oom-killer",
        "engine-dead",
        "unrecognised-error",
        "not-enough-devices",
        "no-device",
        "tp-not-divisible",
        "max-model-len-too-large",
        "no-weights",
        "weights-missing",
        "invalid-kv-cache-dtype",
        "unknown-attention-backend",
        "backend-invalid",
        "tool-call-parser-missing",
        "hub-gated",
        "ray-version-mismatch",
        "ray-resources",
        "ray-node-died",
        "nccl-timeout",
        "cuda-arch-unsupported",
        "head-size-unsupported",
        "kv-dtype-kernel-mismatch",
    }
)
STATES = frozenset({"ready", "failed", "unfinished"})


def _labels() -> list[dict[str, object]]:
    entries = yaml.safe_load((HELDOUT / "labels.yaml").read_text(encoding="utf-8"))
    assert isinstance(entries, list)
    return entries


LABELS = _labels()


def test_the_set_is_large_enough_and_mostly_failures() -> None:
    failures = [e for e in LABELS if e["state"] == "failed"]
    wrappers = [e for e in LABELS if e.get("wrapper")]
    assert len(LABELS) >= 45
    assert len(failures) >= 40
    assert len(wrappers) >= 5


def test_every_log_file_is_labelled_once() -> None:
    labelled = [str(e["file"]) for e in LABELS]
    assert len(labelled) == len(set(labelled))
    assert set(labelled) == {p.name for p in HELDOUT.glob("*.log")}


@pytest.mark.parametrize("entry", LABELS, ids=lambda e: str(e["file"]))
def test_label_is_consistent_with_its_file(entry: dict[str, object]) -> None:
    path = HELDOUT / str(entry["file"])
    lines = path.read_text(encoding="utf-8").splitlines()
    assert lines[0].startswith("# source: ")
    assert entry["state"] in STATES
    if entry["state"] == "failed":
        assert entry["failure"] in VOCABULARY
    else:
        # A ready server, or a startup the log leaves in progress with no error: no failure id.
        assert entry["failure"] is None
    if entry["failure"] == "unrecognised-error":
        assert entry.get("class")
    key = str(entry["key_line"])
    assert key and any(key in line for line in lines[1:]), f"key line not in {path.name}"
    assert path.name.startswith(f"{entry['failure'] or entry['state']}-h")
    assert entry["source"] and entry["version"]


# The fresh set (heldout2): gathered after the first was seen, labelled before it was run.
HELDOUT2 = HELDOUT.parent / "heldout2"
LABELS2 = yaml.safe_load((HELDOUT2 / "labels.yaml").read_text(encoding="utf-8"))


def test_the_fresh_set_has_thirty_logs_from_issues_the_first_set_does_not_use() -> None:
    assert len(LABELS2) >= 30
    assert {str(e["file"]) for e in LABELS2} == {p.name for p in HELDOUT2.glob("*.log")}
    first = {str(e["source"]).split(" ")[0] for e in LABELS}
    fresh = [str(e["source"]).split(" ")[0] for e in LABELS2]
    assert len(fresh) == len(set(fresh)), "one issue per log"
    assert not first & set(fresh)


@pytest.mark.parametrize("entry", LABELS2, ids=lambda e: str(e["file"]))
def test_fresh_label_is_consistent_with_its_file(entry: dict[str, object]) -> None:
    path = HELDOUT2 / str(entry["file"])
    lines = path.read_text(encoding="utf-8").splitlines()
    assert lines[0].startswith(f"# source: {entry['source']} ")
    assert entry["state"] == "failed" and entry["failure"] in VOCABULARY
    key = str(entry["key_line"])
    assert any(key in line for line in lines[1:]), f"key line not in {path.name}"
    assert path.name.startswith(f"{entry['failure']}-g")


# The third set (heldout3): gathered after the first two were seen, labelled before it was run.
HELDOUT3 = HELDOUT.parent / "heldout3"
LABELS3 = yaml.safe_load((HELDOUT3 / "labels.yaml").read_text(encoding="utf-8"))


def _issue(source: str) -> str:
    """``owner/repo#N`` of a GitHub issue or PR address, else the address itself."""
    parts = source.split("github.com/", 1)[-1].split("/")
    if len(parts) >= 4 and parts[2] in ("issues", "pull"):
        return f"{parts[0]}/{parts[1]}#{parts[3]}"
    return source


def test_the_third_set_has_forty_failures_from_issues_no_other_set_uses() -> None:
    assert len([e for e in LABELS3 if e["state"] == "failed"]) >= 40
    assert {str(e["file"]) for e in LABELS3} == {p.name for p in HELDOUT3.glob("*.log")}
    third = [_issue(str(e["source"])) for e in LABELS3]
    assert len(third) == len(set(third)), "one issue per log"
    earlier = {str(e["source"]).split(" ")[0] for e in LABELS + LABELS2}
    assert not earlier & set(third)


# The fourth set (heldout4): gathered after the first three were seen, labelled before it was run.
HELDOUT4 = HELDOUT.parent / "heldout4"
LABELS4 = yaml.safe_load((HELDOUT4 / "labels.yaml").read_text(encoding="utf-8"))


def test_the_fourth_set_has_forty_failures_from_sources_no_other_set_uses() -> None:
    assert len([e for e in LABELS4 if e["state"] == "failed"]) >= 40
    assert {str(e["file"]) for e in LABELS4} == {p.name for p in HELDOUT4.glob("*.log")}
    fourth = [_issue(str(e["source"])) for e in LABELS4]
    assert len(fourth) == len(set(fourth)), "one source per log"
    earlier = {str(e["source"]).split(" ")[0] for e in LABELS + LABELS2}
    earlier |= {_issue(str(e["source"])) for e in LABELS3}
    assert not earlier & set(fourth)


# The fifth to fifteenth sets: each gathered after the earlier ones were seen and labelled before
# it was run.
LATEST_SET = 15


def labels_of(number: int) -> list[dict[str, object]]:
    text = (HELDOUT.parent / f"heldout{number}" / "labels.yaml").read_text(encoding="utf-8")
    labels: list[dict[str, object]] = yaml.safe_load(text)
    return labels


NUMBERED = {3: LABELS3, 4: LABELS4, **{n: labels_of(n) for n in range(5, LATEST_SET + 1)}}


@pytest.mark.parametrize("number", range(5, LATEST_SET + 1))
def test_a_later_set_has_forty_logs_from_sources_no_earlier_set_uses(number: int) -> None:
    folder, labels = HELDOUT.parent / f"heldout{number}", NUMBERED[number]
    assert len(labels) >= 40
    assert {str(e["file"]) for e in labels} == {p.name for p in folder.glob("*.log")}
    sources = [_issue(str(e["source"])) for e in labels]
    assert len(sources) == len(set(sources)), "one source per log"
    earlier = {str(e["source"]).split(" ")[0] for e in LABELS + LABELS2}
    earlier |= {_issue(str(e["source"])) for n in range(3, number) for e in NUMBERED[n]}
    assert not earlier & set(sources)


# From the third set on, a label names a failure for a failed or hung log and none for a ready
# or unfinished one; each set's labels use the states it was labelled with.
ALL_STATES = ("failed", "hung", "ready", "unfinished")
LATER_SETS = [
    (HELDOUT3, LABELS3, "h3", ("failed", "ready")),
    (HELDOUT4, LABELS4, "h4", ("failed", "hung", "ready")),
    *(
        (HELDOUT.parent / f"heldout{n}", NUMBERED[n], f"h{n}", ALL_STATES)
        for n in range(5, LATEST_SET + 1)
    ),
]


@pytest.mark.parametrize(
    ("folder", "entry", "tag", "states"),
    [(f, entry, tag, states) for f, labels, tag, states in LATER_SETS for entry in labels],
    ids=lambda value: str(value["file"]) if isinstance(value, dict) else "",
)
def test_later_set_label_is_consistent_with_its_file(
    folder: Path, entry: dict[str, object], tag: str, states: tuple[str, ...]
) -> None:
    path = folder / str(entry["file"])
    lines = path.read_text(encoding="utf-8").splitlines()
    assert lines[0].startswith(f"# source: {entry['source']} ")
    assert entry["state"] in states
    if entry["state"] in ("ready", "unfinished"):
        assert entry["failure"] is None
    else:
        assert entry["failure"] in VOCABULARY
    if entry["failure"] == "unrecognised-error":
        assert entry.get("class")
    assert any(str(entry["key_line"]) in line for line in lines[1:]), f"key line not in {path.name}"
    assert path.name.startswith(f"{entry['failure'] or entry['state']}-{tag}-")
    assert entry["version"]


# The held-out set (issue 31, item 4): checked as data only. No test diagnoses these logs; the
# diagnosis meets them once, in bench/heldout.py, after the catalogue is frozen.
FRESH = HELDOUT.parents[1] / "heldout-2026-12"
FRESH_LABELS: list[dict[str, object]] = yaml.safe_load(
    (FRESH / "labels.yaml").read_text(encoding="utf-8")
)
CATALOGUE = HELDOUT.parents[4] / "opsbook" / "knowledge" / "data" / "failures.yaml"
FAILURES = yaml.safe_load(CATALOGUE.read_text(encoding="utf-8"))["failures"]
TOP_LEVEL_IDS = frozenset(str(f["id"]) for f in FAILURES if not f.get("family"))
CATALOGUE_IDS = frozenset(str(f["id"]) for f in FAILURES)


def test_every_held_out_log_is_labelled_once_from_its_own_source() -> None:
    labelled = [str(e["file"]) for e in FRESH_LABELS]
    assert len(labelled) == len(set(labelled))
    assert set(labelled) == {p.name for p in FRESH.glob("*.log")}
    sources = [str(e["source"]) for e in FRESH_LABELS]
    assert len(sources) == len(set(sources)), "one source per log"


@pytest.mark.parametrize("entry", FRESH_LABELS, ids=lambda e: str(e["file"]))
def test_held_out_label_is_well_formed_and_its_key_line_is_in_its_file(
    entry: dict[str, object],
) -> None:
    path = FRESH / str(entry["file"])
    lines = path.read_text(encoding="utf-8").splitlines()
    assert lines[0].startswith(f"# source: {entry['source']}")
    assert entry["state"] in ALL_STATES
    if entry["state"] in ("ready", "unfinished"):
        assert entry["failure"] is None
    else:
        assert entry["failure"] in TOP_LEVEL_IDS
    if entry.get("class") and entry["failure"] != "unrecognised-error":
        assert entry["class"] in CATALOGUE_IDS
    assert isinstance(entry.get("wrapper", False), bool)
    key = str(entry["key_line"])
    assert key and any(key in line for line in lines[1:]), f"key line not in {path.name}"
    assert entry["version"]
