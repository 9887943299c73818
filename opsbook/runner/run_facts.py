"""``facts.json``: a run's facts (:mod:`opsbook.core.facts_schema`), folded when the run ends
from the notes its stages wrote (``*.facts.jsonl``), its results, and 06_qualify's receipt
(``qualify/receipt.json``) when the run has one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

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

if TYPE_CHECKING:
    from opsbook.steps import qualify_receipt

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
    """The run's qualification receipts (06_qualify's ``qualify/receipt.json``), by host: its
    verdict and its numbers (each cell's output tok/s and p99 TTFT, the KV cache's tokens)."""
    found: dict[str, Qualification] = {}
    paths = sorted((folder / RECEIPTS).rglob(RECEIPT))
    if not paths:
        return found
    # Only with a receipt to read: the receipt's module brings logscan and the capacity
    # figures (0.2 s as every deploy ends, most of which run no qualification).
    from opsbook.steps import qualify_receipt

    for path in paths:
        for receipt in qualify_receipt.receipts_in(path):
            found[receipt.host] = Qualification(
                verdict="pass" if receipt.passed else "fail", numbers=_receipt_numbers(receipt)
            )
    return found


def _receipt_numbers(receipt: qualify_receipt.Receipt) -> dict[str, float]:
    numbers: dict[str, float] = {}
    if receipt.startup.kv_cache_tokens is not None:
        numbers["kv_cache_tokens"] = float(receipt.startup.kv_cache_tokens)
    for cell in receipt.cells:
        label = f"{cell.cell.prompt_tokens}x{cell.cell.concurrency}"
        numbers[f"{label} output_tok_s"] = cell.output_tok_s
        if cell.ttft_ms.p99 is not None:
            numbers[f"{label} ttft_p99_ms"] = cell.ttft_ms.p99
    return numbers


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
