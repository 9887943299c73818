"""``facts.json``: a run's facts (:mod:`opsbook.core.facts_schema`), folded when the run ends
from the notes its stages wrote (``*.facts.jsonl``), its results, and 06_qualify's receipt
(``qualify/receipt.json``) when the run has one.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from opsbook.core.facts_schema import (
    FACTS_FILE,
    NOTES_SUFFIX,
    HostRunFacts,
    Qualification,
    RunFacts,
    read_notes,
)
from opsbook.core.results import HostResult, State
from opsbook.steps.last_good import READY, deployment_key

RECEIPTS = "qualify"
RECEIPT = "receipt.json"
LAUNCH_STAGE = "launch"


def collect(
    folder: Path,
    *,
    deployment: str,
    started: str,
    status: str,
    hosts: Sequence[str],
    results: Sequence[HostResult],
) -> RunFacts:
    """The run's facts: per host, the sections its stages noted, how its launch ended, the
    failures its stages named, and its qualification's verdict."""
    notes = read_notes(sorted(folder.rglob(f"*{NOTES_SUFFIX}")))
    receipts = qualification_receipts(folder)
    named = list(dict.fromkeys([*hosts, *(r.host for r in results), *notes]))
    per_host = {
        host: host_facts_of(host, notes.get(host, {}), results, receipts) for host in named if host
    }
    return RunFacts(
        run=folder.name,
        deployment=deployment_key(deployment) if deployment else "",
        started=started or datetime.now(timezone.utc).isoformat(timespec="seconds"),
        status=status,
        hosts=per_host,
    )


def host_facts_of(
    host: str,
    sections: Mapping[str, Mapping[str, Any]],
    results: Sequence[HostResult],
    receipts: Mapping[str, Qualification],
) -> HostRunFacts:
    mine = [r for r in results if r.host == host]
    launched = [r for r in mine if r.stage == LAUNCH_STAGE]
    ready = bool(launched) and launched[-1].state in (State.OK, State.CHANGED)
    # A launch's notes are written only once its server answered (opsbook.steps.record_facts).
    state = (
        READY
        if ready and "launch" in sections
        else (launched[-1].state.value if launched else None)
    )
    qualification = receipts.get(host) or receipts.get("") or Qualification()
    return HostRunFacts.model_validate(
        {
            **{name: dict(values) for name, values in sections.items()},
            "qualification": qualification,
            "state": state,
            "failures": list(dict.fromkeys(r.failure_id for r in mine if r.failure_id)),
        }
    )


def qualification_receipts(folder: Path) -> dict[str, Qualification]:
    """The run's qualification receipts, by the host each names ("" for a run's one receipt
    that names none): its verdict and its top-level numbers."""
    found: dict[str, Qualification] = {}
    for path in sorted((folder / RECEIPTS).rglob(RECEIPT)):
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(doc, dict):
            continue
        verdict = doc.get("verdict")
        numbers = {
            str(k): float(v)
            for k, v in doc.items()
            if isinstance(v, int | float) and not isinstance(v, bool)
        }
        found[str(doc.get("host") or "")] = Qualification(
            verdict=str(verdict) if verdict in ("pass", "fail") else None, numbers=numbers
        )
    return found


def write_facts(
    folder: Path,
    *,
    deployment: str,
    started: str,
    status: str,
    hosts: Sequence[str],
    results: Sequence[HostResult],
) -> Path:
    """Write ``facts.json`` in a run folder (before it is sealed)."""
    facts = collect(
        folder,
        deployment=deployment,
        started=started,
        status=status,
        hosts=hosts,
        results=results,
    )
    path = folder / FACTS_FILE
    path.write_text(facts.to_json())
    return path
