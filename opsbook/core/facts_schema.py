"""The facts every run record keeps (``facts.json``): one typed, versioned schema.

A stage notes the part of a host's facts it learned (:func:`note`: preflight the host and its
engine, the download check the model's shard manifest, the launch what it started and how
the start went) in ``<notebook>.facts.jsonl`` beside the run's outcome file; when the run ends
the runner folds the notes into one :class:`RunFacts` per run (``opsbook.runner.run_facts``).
A value nobody learned is None: it is unknown, and differs from nothing.

Readers take any ``schema_version`` up to :data:`SCHEMA_VERSION`; a later one is refused by name
(:func:`load_facts`), so that an old opsbook never misreads a newer record.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from opsbook.core.channel import OUTCOME_ENV
from opsbook.core.exceptions import RunError

SCHEMA_VERSION = 1
FACTS_FILE = "facts.json"
NOTES_SUFFIX = ".facts.jsonl"
# The sections a stage may note, as named in a note's line and in RunFacts' per-host entry.
SECTIONS = ("fingerprint", "engine", "model", "launch", "startup", "capacity", "upgrade")
_lock = threading.Lock()


class _Facts(BaseModel):
    # A record written by a newer opsbook of the same schema version may carry more keys.
    model_config = ConfigDict(extra="ignore", frozen=True)


class HostFingerprint(_Facts):
    """What the machine is: a driver update or a moved GPU changes it."""

    gpus: list[str] = Field(default_factory=list)  # one name per GPU, in index order
    driver: str | None = None
    cuda: str | None = None
    kernel: str | None = None
    cpu: str | None = None  # the CPU count, as the facts probe reads it
    topology_digest: str | None = None  # sha256 of nvidia-smi topo -m's link matrix
    # The kernel command line's IOMMU and ACS words ("intel_iommu=on iommu=pt",
    # "pcie_acs_override=downstream"; "not set": none given), as the launch read them.
    iommu: str | None = None
    acs: str | None = None

    def digest(self) -> str:
        """The fingerprint's identity: the same machine as far as a deploy is concerned."""
        return digest_of(self.model_dump())[:16]


class EngineFacts(_Facts):
    """The engine the deployment's interpreter runs."""

    vllm: str | None = None
    torch: str | None = None
    ray: str | None = None
    interpreter: str | None = None
    python: str | None = None
    pip_freeze_digest: str | None = None  # sha256 of the env's sorted name==version list
    kv_cache_dtype: str | None = None
    attention_backend: str | None = None
    engine_from: str | None = None  # "the server's log" or "predicted"


class ModelFacts(_Facts):
    """The checkpoint served."""

    path: str | None = None
    revision: str | None = None  # the Hugging Face commit the files came from
    revision_source: str | None = None  # where it was read, or why it is unknown
    manifest_digest: str | None = None  # sha256 of the shard manifest 01 read (names, sizes)
    shards: int | None = None
    # Per config file the host's configs read by the launch (config.json...), its sha256: a
    # config patch (02) shows here.
    configs: dict[str, str] = Field(default_factory=dict)


class LaunchFacts(_Facts):
    """What was started: the serve flags (secret values masked), the env names, the script."""

    flags: dict[str, str] = Field(default_factory=dict)
    env_names: list[str] = Field(default_factory=list)
    script_digest: str | None = None


class StartupFacts(_Facts):
    """How the last start went, from its log: seconds per phase and the KV cache."""

    state: str | None = None
    load_s: float | None = None
    compile_s: float | None = None
    ready_s: float | None = None
    kv_tokens: int | None = None


class CapacityFacts(_Facts):
    """The capacity plan 02 made for the start (``opsbook.steps.plan``) beside what the start's
    log said once vLLM sized its KV cache (04), per GPU: the next plan's overhead prior."""

    vllm: str | None = None  # the release planned for
    flags: dict[str, str] = Field(default_factory=dict)  # the flags that move the overhead
    gpu_memory: int | None = None  # bytes, the smallest GPU's
    utilization: float | None = None
    fixed_kv: bool | None = None  # kv-cache-memory-bytes set: no overhead to measure
    max_model_len: int | None = None
    verdict: str | None = None
    predicted_tokens: list[int] = Field(default_factory=list)  # the band: low, high
    predicted_kv_memory: list[int] = Field(default_factory=list)
    overhead_source: str | None = None
    observed_tokens: int | None = None
    observed_concurrency: float | None = None
    observed_kv_memory: int | None = None
    observed_weights: int | None = None
    tokens_error_pct: float | None = None  # the band's middle against vLLM's, in %
    kv_memory_error_pct: float | None = None
    overhead: int | None = None  # budget - weights - KV memory, from vLLM's own lines


class Qualification(_Facts):
    """06_qualify's receipt (``qualify/receipt.json``), as far as this schema reads it."""

    verdict: str | None = None  # "pass" or "fail"
    numbers: dict[str, float] = Field(default_factory=dict)


class UpgradeFacts(_Facts):
    """07_upgrade's outcome on the host: the engines from and to, and how it ended."""

    outcome: str | None = None  # "upgraded", "rolled back", "refused" or "planned"
    from_vllm: str | None = None
    to_vllm: str | None = None
    from_python: str | None = None
    to_python: str | None = None
    failing: list[str] = Field(default_factory=list)  # the checks that refused or failed it
    downtime_s: float | None = None  # from the stop to the new (or restored) server qualified


class HostRunFacts(_Facts):
    """One host's facts in one run."""

    fingerprint: HostFingerprint = Field(default_factory=HostFingerprint)
    engine: EngineFacts = Field(default_factory=EngineFacts)
    model: ModelFacts = Field(default_factory=ModelFacts)
    launch: LaunchFacts = Field(default_factory=LaunchFacts)
    startup: StartupFacts = Field(default_factory=StartupFacts)
    capacity: CapacityFacts = Field(default_factory=CapacityFacts)
    qualification: Qualification = Field(default_factory=Qualification)
    upgrade: UpgradeFacts = Field(default_factory=UpgradeFacts)
    # How the host ended in the run: "ready" when its launch left a server answering.
    state: str | None = None
    failures: list[str] = Field(default_factory=list)


class RunFacts(_Facts):
    """``facts.json``: a run's facts, host by host."""

    schema_version: int = SCHEMA_VERSION
    run: str
    deployment: str
    started: str = ""
    status: str = ""
    hosts: dict[str, HostRunFacts] = Field(default_factory=dict)

    def to_json(self) -> str:
        return self.model_dump_json(indent=2) + "\n"


def digest_of(value: Any) -> str:
    """The sha256 of a JSON-ready value (keys sorted: the same value, the same digest)."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def load_facts(path: Path) -> RunFacts:
    """A ``facts.json`` read and checked.

    Raises:
        RunError: it is not one, or a newer opsbook wrote it.
    """
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise RunError(f"cannot read {path}: {e}", remedy="see `opsbook records list`") from None
    version = doc.get("schema_version") if isinstance(doc, dict) else None
    if isinstance(version, int) and version > SCHEMA_VERSION:
        raise RunError(
            f"{path} has facts schema {version}; this opsbook reads up to {SCHEMA_VERSION}",
            remedy="read it with the opsbook that wrote it, or upgrade opsbook",
        )
    try:
        return RunFacts.model_validate(doc)
    except ValidationError as e:
        raise RunError(f"{path} is not a facts record: {e.errors()[0]['msg']}") from None


def notes_file(outcome: str | Path) -> Path:
    """Where the facts of the stage writing ``outcome`` go (``00_preflight.facts.jsonl``)."""
    path = Path(outcome)
    stem = path.name.removesuffix(".results.jsonl")
    return path.with_name(stem + NOTES_SUFFIX)


def recording() -> bool:
    """Whether the stages of this process run inside a run that keeps notes."""
    return bool(os.environ.get(OUTCOME_ENV))


def note(host: str, section: str, values: Mapping[str, Any]) -> None:
    """Note a section of ``host``'s facts for the run's record (nothing without a run: a
    notebook stepped through outside one)."""
    if section not in SECTIONS:
        raise ValueError(f"no facts section {section!r}: one of {', '.join(SECTIONS)}")
    outcome = os.environ.get(OUTCOME_ENV)
    if not outcome:
        return
    line = json.dumps({"host": host, "section": section, "values": dict(values)}, default=str)
    with _lock, notes_file(outcome).open("a") as f:
        f.write(line + "\n")


def read_notes(paths: Iterable[Path]) -> dict[str, dict[str, dict[str, Any]]]:
    """Per host and section, the values noted in ``paths`` (in order: a later note of a value
    takes the place of an earlier one; a None does not erase a value known)."""
    found: dict[str, dict[str, dict[str, Any]]] = {}
    for path in paths:
        for line in path.read_text().splitlines():
            try:
                doc = json.loads(line)
                host, section, values = str(doc["host"]), str(doc["section"]), doc["values"]
            except (ValueError, KeyError, TypeError):
                continue  # a line cut short by a killed kernel
            known = found.setdefault(host, {}).setdefault(section, {})
            known.update({k: v for k, v in values.items() if v is not None})
    return found
