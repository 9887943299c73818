"""Every error format string the catalogue covers, of every vLLM release read (and of the
libraries it covers), rendered with sample values, is diagnosed as the entry that covers it.

The format strings come from ``tests/data/vllm_error_formats.json``, written by
``tools/vllm_error_formats.py`` from the release wheels (0.10.2 to 0.33.0), huggingface_hub,
transformers and uvicorn; messages of compiled code (PyTorch, NCCL, safetensors, Triton, the
kernel) are quoted in its ``native_formats`` with their source file, and Python messages the
extraction does not select (earlier vLLM releases, requests, a raised form a later release
logs as a warning) in its ``quoted_formats``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from opsbook.knowledge.logscan import FAILED, HUNG, diagnose_log, load_catalogue

FORMATS = Path(__file__).resolve().parents[1] / "data" / "vllm_error_formats.json"
DATA = json.loads(FORMATS.read_text(encoding="utf-8"))
FIELD = re.compile(r"\{([^{}]*)\}")
# Sample values by what a placeholder's expression names; the first that fits wins.
SAMPLES = (
    (r"status_code", "401"),
    (r"^expected$", "BFloat16"),
    (r"^found$", "Float8_e4m3fn"),
    (r"shm_path", "/dev/shm"),
    (r"url", "https://huggingface.co/api/models/org/model/revision/main"),
    (r"repo_id|model_name_or_path|path_or_repo_id|model_or_path", "/models/missing-model"),
    (r"kv_cache_dtype|cache_dtype", "fp7"),
    (r"selected_backend", "AttentionBackendEnum.FLASHMLA"),
    (r"invalid_reasons|reasons", "['compute capability not supported']"),
    (r"quantization", "fp8"),
    (r"proc_name|proc\.name|failed_proc_name", "EngineCore_DP0"),
    (r"device_str", "GPU"),
    (r"device_count", "16"),  # a count of devices, not a device name
    (r"device_name|device_", "cuda"),
    (r"utilization", "0.9"),
    (
        r"size|len|num|count|capability|dim|heads|rank|world|gpu|seconds|bytes|memory|mib|gib"
        r"|free|total|block|tokens|timeout|required|exitcode|threshold|INTERVAL|time|dp_|ms|\bs\b"
        r"|seq|ran|n\b|alloc|vm|rss|pt|adj|uid|pid|tid|numerator|denominator",
        "16",
    ),
)
ENTRIES = {entry.id: entry for entry in load_catalogue()}
PREFIX = "(EngineCore_DP0 pid=7) {level} 03-12 10:11:12 [core.py:1] "


def sample(expression: str) -> str:
    return next((value for key, value in SAMPLES if re.search(key, expression)), "x")


def render(template: str) -> str:
    text = FIELD.sub(lambda m: sample(m.group(1)), template.replace("{{", "\0").replace("}}", "\1"))
    # A message built with %-placeholders and formatted later (logger.warning(msg, n)).
    text = re.sub(r"%[-#0 +]*\d*(?:\.\d+)?[dif]", "16", text).replace("%s", "x")
    return text.replace("\0", "{").replace("\1", "}")


def as_log(kind: str, message: str, entry_kind: str) -> str:
    """The message as vLLM's log shows it: a logger line, or an exception's last line."""
    if entry_kind == "stall" and not kind.startswith("logger."):
        kind = "logger.warning"  # built first, then logged (shm_broadcast.py)
    if kind.startswith("logger."):
        return PREFIX.format(level=kind.split(".", 1)[1].upper()) + message
    return PREFIX.format(level="ERROR") + "ValueError: " + message


def expect(entry_id: str, log: str) -> None:
    entry = ENTRIES[entry_id]
    diagnosis = diagnose_log(log)
    if entry.kind == "note":
        assert entry_id in {note.entry.id for note in diagnosis.notes}, (log, str(diagnosis))
    elif entry.kind == "stall":
        assert (diagnosis.state, diagnosis.failure) == (HUNG, entry_id), (log, str(diagnosis))
    else:
        # A known class outside the shared failure ids is reported under its family's id.
        found = (diagnosis.state, diagnosis.failure, diagnosis.error_class)
        assert found == (FAILED, entry.failure, entry.error_class), (log, str(diagnosis))


def python_formats() -> list[dict[str, Any]]:
    return list(DATA["formats"])


def test_the_formats_cover_every_release_from_0_10_2_to_0_33_0() -> None:
    releases = DATA["vllm_releases"]
    assert releases[0] == "0.10.2" and releases[-1] == "0.33.0" and len(releases) >= 24
    covered = {f["entry"] for f in DATA["formats"]} | {f["entry"] for f in DATA["native_formats"]}
    assert DATA["quoted_formats"]
    with_stems = {entry.id for entry in ENTRIES.values() if entry.stems}
    assert with_stems <= covered, with_stems - covered
    for found in DATA["formats"]:
        assert found["found"] and all(re.match(r"\S+\.py:\d+$", f["file"]) for f in found["found"])


@pytest.mark.parametrize(
    "found",
    python_formats(),
    ids=[f"{f['entry']}-{f['releases'][0]}-{i}" for i, f in enumerate(python_formats())],
)
def test_every_catalogued_format_string_is_diagnosed_as_its_entry(found: dict[str, Any]) -> None:
    message = render(found["template"])
    head, *rest = message.split("\n")
    log = as_log(found["kind"], head, ENTRIES[found["entry"]].kind)
    expect(found["entry"], "\n".join([log, *rest]))


@pytest.mark.parametrize(
    "found", DATA["native_formats"], ids=[f["entry"] for f in DATA["native_formats"]]
)
def test_every_quoted_native_message_is_diagnosed_as_its_entry(found: dict[str, str]) -> None:
    assert found["source"]
    expect(found["entry"], render(found["template"]))


@pytest.mark.parametrize(
    "found",
    DATA["quoted_formats"],
    ids=[f"{f['entry']}-{i}" for i, f in enumerate(DATA["quoted_formats"])],
)
def test_every_quoted_python_message_is_diagnosed_as_its_entry(found: dict[str, str]) -> None:
    assert found["source"]
    expect(found["entry"], render(found["template"]))
