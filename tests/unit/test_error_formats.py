"""Every error format string the catalogue covers, of every vLLM release read (and of the
libraries it covers), rendered with sample values, is diagnosed as the entry that covers it.

The format strings come from ``tests/data/vllm_error_formats.json``, written by
``tools/vllm_error_formats.py`` from the wheel of every release in the facts data
(``opsbook/knowledge/data/vllm_facts``), huggingface_hub, transformers, uvicorn, pydantic, Ray
and CPython's argparse; messages of compiled code (PyTorch, NCCL, safetensors, Triton, the
kernel) are quoted in its ``native_formats`` with their source file, and Python messages the
extraction does not select (earlier vLLM releases, requests, a raised form a later release
logs as a warning) in its ``quoted_formats``.

Fatal (the tool's ``fatal_rule``): raised, or logged at ERROR/CRITICAL. Each release's fatal
format strings that hold an entry's stem must be diagnosed as that entry; and each pattern of an
entry with stems must match one of the entry's format strings or a line of a development log
(``tests/data/logs``, never its held-out folders), or it is a pattern nothing shows to be real.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from opsbook.knowledge import vllm_facts
from opsbook.knowledge.logscan import FAILED, HUNG, diagnose_log, load_catalogue

FORMATS = Path(__file__).resolve().parents[1] / "data" / "vllm_error_formats.json"
LOGS = Path(__file__).resolve().parents[1] / "data" / "logs"
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

# Patterns that nothing read so far shows to be real (issue 31, item 2): each needs its text
# from a source (a library or native message quoted with its file) or a development log. The
# list only shrinks: a pattern given evidence must leave it, and a new pattern must not join.
UNPROVEN = {
    (
        "head-size-unsupported",
        "FlashAttention forward only supports head dimension at most (?P<max_head_size>\\d+)",
    ),
    ("head-size-unsupported", "Unexpected head dim size"),
    ("head-size-unsupported", "expect head_dim to be multiples of (?P<multiple>\\d+)"),
    ("head-size-unsupported", "invalid head_size"),
    (
        "invalid-kv-cache-dtype",
        "Input should be 'auto', '(?:float16|fp8)'.*\\[type=literal_error,"
        " input_value='(?P<kv_cache_dtype>[^']*)'",
    ),
    (
        "invalid-kv-cache-dtype",
        "argument --kv-cache-dtype: invalid choice: '(?P<kv_cache_dtype>[^']*)'",
    ),
    (
        "not-enough-devices",
        "Required number of devices: (?P<world_size>\\d+)\\. Total number of devices:"
        " (?P<gpu_count>\\d+)",
    ),
    ("ray-node-died", "ActorUnavailableError"),
    ("ray-node-died", "NodeDiedError"),
    ("ray-resources", "resource request cannot be scheduled right now"),
    (
        "tp-not-divisible",
        "^assert (?P<dimension>[\\w.\\[\\]\"']+) %"
        " (?:self\\.)?(?:tp_size|tensor_parallel_size|tp_world_size) == 0\\b",
    ),
    (
        "unknown-attention-backend",
        "argument --attention-backend: invalid choice: '(?P<backend>[^']*)'",
    ),
    ("weights-missing", "No such file or directory: .(?P<file>[^']*\\.safetensors)."),
}


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


def test_the_formats_cover_every_release_in_the_facts_data() -> None:
    assert DATA["vllm_releases"] == list(vllm_facts.releases())
    assert {"argparse", "huggingface_hub", "transformers", "pydantic", "ray"} <= set(
        DATA["libraries"]
    )
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


@pytest.mark.parametrize("release", vllm_facts.releases())
def test_every_release_fatal_format_strings_are_diagnosed_as_their_entries(release: str) -> None:
    fatal = [f for f in DATA["formats"] if f["fatal"] and release in f["releases"]]
    assert len(fatal) >= 20, f"vLLM {release}: only {len(fatal)} fatal format strings read"
    wrong = []
    for found in fatal:
        head, *rest = render(found["template"]).split("\n")
        log = "\n".join([as_log(found["kind"], head, ENTRIES[found["entry"]].kind), *rest])
        try:
            expect(found["entry"], log)
        except AssertionError:
            wrong.append((found["entry"], found["template"]))
    assert wrong == []


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


def development_log_lines() -> list[str]:
    """Every line of the development logs; the held-out folders are never opened."""
    lines = []
    for top in sorted(LOGS.iterdir()):
        if top.name.startswith("heldout"):
            continue
        for path in sorted([top] if top.is_file() else top.rglob("*")):
            if path.is_file() and path.suffix == ".log":
                lines += path.read_text(encoding="utf-8", errors="replace").splitlines()
    return lines


def entry_texts() -> dict[str, list[str]]:
    """Each entry's format strings, rendered, and as vLLM's log shows them."""
    texts: dict[str, list[str]] = {}
    for found in [*DATA["formats"], *DATA["native_formats"], *DATA["quoted_formats"]]:
        message = render(found["template"])
        texts.setdefault(found["entry"], []).append(message)
        if "kind" in found:
            head = message.split("\n")[0]
            texts[found["entry"]].append(as_log(found["kind"], head, "cause"))
    return texts


def unproven_patterns() -> set[tuple[str, str]]:
    """``(entry, pattern)`` of the patterns of entries with stems that match none of the
    entry's format strings and no development log line."""
    texts, lines = entry_texts(), development_log_lines()
    return {
        (entry.id, pattern.pattern)
        for entry in ENTRIES.values()
        if entry.stems
        for pattern in entry.patterns
        if not any(pattern.search(t) for t in texts.get(entry.id, ()))
        and not any(pattern.search(line) for line in lines)
    }


def test_every_pattern_matches_a_format_string_or_a_development_log() -> None:
    """A new pattern needs evidence (its format string read by the tool or quoted with its
    source, or a development log); one given evidence leaves UNPROVEN (the list only shrinks)."""
    assert unproven_patterns() == UNPROVEN
