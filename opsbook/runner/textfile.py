"""A run's verdicts as a textfile for node_exporter's textfile collector.

``opsbook run 05_diagnose -f D --textfile DIR`` writes ``DIR/opsbook_<deployment>.prom`` once
the run is filed, with prometheus_client's own writer (a temporary file in DIR renamed over the
old one, so the collector never reads half a file):

- ``opsbook_server_state{deployment, host, state}``: 1 for the state 05_diagnose found, 0 for
  the others (:data:`STATES`);
- ``opsbook_seconds_since_ready{deployment, host}``: for a server that answers, since it became
  ready;
- ``opsbook_last_verdict{deployment, host, stage, verdict, failure_id}``: 1, the stage's result;
- ``opsbook_last_run_timestamp_seconds{deployment}``: when the run ended.

``opsbook run 06_qualify -f D --textfile DIR`` writes ``DIR/opsbook_<deployment>_qualify.prom``
(a file of its own, so that a scheduled diagnosis and a scheduled qualification never replace
each other's), from the run's receipts (``qualify/receipt.json``):

- ``opsbook_qualify_passed{deployment, host}``: 1 when the verdict passed, else 0;
- ``opsbook_qualify_output_tokens_per_second{deployment, host, cell}`` and
  ``opsbook_qualify_ttft_p99_seconds{deployment, host, cell}``: per cell of the matrix
  (``cell`` is "prompt tokens x concurrency");
- ``opsbook_qualify_kv_cache_tokens{deployment, host}``: the KV cache the server's log named;
- ``opsbook_last_verdict`` and ``opsbook_last_run_timestamp_seconds`` as above.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Gauge, write_to_textfile

from opsbook.core.exceptions import RunError
from opsbook.core.results import HostResult, State
from opsbook.steps.qualify_receipt import Receipt
from opsbook.steps.triage import STATES as SERVER_STATES

# A host whose diagnosis did not run to the end has no server state of its own.
UNREACHABLE = "unreachable"
UNKNOWN = "unknown"
STATES = (*SERVER_STATES, UNREACHABLE, UNKNOWN)
# The stage whose record gives the server's state (its summary at the end).
DIAGNOSE = "diagnose"


QUALIFY = "qualify"


def textfile_path(folder: Path, deployment: str, stage: str = DIAGNOSE) -> Path:
    """``opsbook_<deployment>.prom`` in ``folder`` (the name made safe for a file);
    ``opsbook_<deployment>_qualify.prom`` for 06_qualify's figures."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", deployment)
    suffix = "_qualify" if stage == QUALIFY else ""
    return folder / f"opsbook_{safe}{suffix}.prom"


def check_folder(folder: Path) -> None:
    """Refuse a folder the textfile cannot be written to, before the run touches a host.

    Raises:
        RunError: it does not exist, is not a folder, or is not writable.
    """
    if not folder.is_dir():
        raise RunError(
            f"--textfile {folder}: not a folder",
            remedy="give node_exporter's --collector.textfile.directory (it must exist)",
        )
    probe = folder / f".opsbook-textfile-check.{time.monotonic_ns()}"
    try:
        probe.write_text("")
        probe.unlink()
    except OSError as error:
        raise RunError(
            f"--textfile {folder}: cannot write there ({error.strerror or error})",
            remedy="give a folder the user running opsbook may write to",
        ) from None


def write_textfile(
    folder: Path,
    deployment: str,
    results: Sequence[HostResult],
    summaries: Sequence[Mapping[str, Any]],
    *,
    now: float | None = None,
) -> Path:
    """Write the run's verdicts (``results``) and the diagnosis's summaries at its end
    (``summaries``, as ``summary.json``'s ``metrics`` lists them) atomically.

    Raises:
        RunError: the file cannot be written.
    """
    now = time.time() if now is None else now
    registry = build_registry(deployment, results, summaries, now)
    return _write(registry, textfile_path(folder, deployment))


def write_qualify_textfile(
    folder: Path,
    deployment: str,
    results: Sequence[HostResult],
    receipts: Sequence[Receipt],
    *,
    now: float | None = None,
) -> Path:
    """Write a qualification run's verdicts and its receipts' figures atomically.

    Raises:
        RunError: the file cannot be written.
    """
    now = time.time() if now is None else now
    registry = CollectorRegistry()
    _verdicts_and_end(registry, deployment, results, now)
    passed = Gauge(
        "opsbook_qualify_passed",
        "1 when 06_qualify's verdict passed on the host, else 0.",
        ["deployment", "host"],
        registry=registry,
    )
    tok_s = Gauge(
        "opsbook_qualify_output_tokens_per_second",
        "Output tokens a second, all requests of a cell together (06_qualify's matrix).",
        ["deployment", "host", "cell"],
        registry=registry,
    )
    ttft = Gauge(
        "opsbook_qualify_ttft_p99_seconds",
        "The 99th percentile of the time to first token in a cell (06_qualify's matrix).",
        ["deployment", "host", "cell"],
        registry=registry,
    )
    kv_tokens = Gauge(
        "opsbook_qualify_kv_cache_tokens",
        "The KV cache's size in tokens, as the server's log named it.",
        ["deployment", "host"],
        registry=registry,
    )
    for receipt in receipts:
        passed.labels(deployment, receipt.host).set(1 if receipt.passed else 0)
        if receipt.startup.kv_cache_tokens is not None:
            kv_tokens.labels(deployment, receipt.host).set(receipt.startup.kv_cache_tokens)
        for cell in receipt.cells:
            tok_s.labels(deployment, receipt.host, cell.cell.label).set(cell.output_tok_s)
            if cell.ttft_ms.p99 is not None:
                ttft.labels(deployment, receipt.host, cell.cell.label).set(cell.ttft_ms.p99 / 1e3)
    return _write(registry, textfile_path(folder, deployment, QUALIFY))


def _write(registry: CollectorRegistry, path: Path) -> Path:
    """prometheus_client's writer: a temporary file in the same folder, renamed over."""
    try:
        write_to_textfile(str(path), registry)
    except OSError as error:
        raise RunError(
            f"cannot write {path}: {error.strerror or error}",
            remedy="check the --textfile folder's permissions and free space",
        ) from None
    return path


def build_registry(
    deployment: str,
    results: Sequence[HostResult],
    summaries: Sequence[Mapping[str, Any]],
    now: float,
) -> CollectorRegistry:
    """The gauges of :func:`write_textfile`, in a registry of their own."""
    registry = CollectorRegistry()
    state = Gauge(
        "opsbook_server_state",
        "The model server's state as 05_diagnose found it (1 for the state found).",
        ["deployment", "host", "state"],
        registry=registry,
    )
    since_ready = Gauge(
        "opsbook_seconds_since_ready",
        "Seconds since the model server became ready (servers that answer only).",
        ["deployment", "host"],
        registry=registry,
    )
    _verdicts_and_end(registry, deployment, results, now)
    at_end = _diagnosis_ends(summaries)
    for result in results:
        if result.stage != DIAGNOSE:
            continue
        found = host_state(result, at_end.get(result.host))
        for name in STATES:
            state.labels(deployment, result.host, name).set(1 if name == found else 0)
        ready_at = (at_end.get(result.host) or {}).get("ready_at")
        if isinstance(ready_at, (int, float)):
            since_ready.labels(deployment, result.host).set(max(0.0, now - ready_at))
    return registry


def _verdicts_and_end(
    registry: CollectorRegistry, deployment: str, results: Sequence[HostResult], now: float
) -> None:
    """``opsbook_last_verdict`` per host and stage, and when the run ended."""
    verdict = Gauge(
        "opsbook_last_verdict",
        "The last run's result per host and stage (1), with its failure id if any.",
        ["deployment", "host", "stage", "verdict", "failure_id"],
        registry=registry,
    )
    for result in results:
        verdict.labels(deployment, result.host, result.stage, result.state.value,
                       result.failure_id).set(1)  # fmt: skip
    ended = Gauge(
        "opsbook_last_run_timestamp_seconds",
        "When opsbook's last run of this deployment ended (seconds since the epoch).",
        ["deployment"],
        registry=registry,
    )
    ended.labels(deployment).set(now)


def host_state(result: HostResult, summary: Mapping[str, Any] | None) -> str:
    """The server state the diagnosis recorded for the host, else why there is none."""
    recorded = (summary or {}).get("server_state")
    if recorded in SERVER_STATES:
        return str(recorded)
    return UNREACHABLE if result.state is State.UNREACHABLE else UNKNOWN


def _diagnosis_ends(summaries: Sequence[Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    """Each host's last summary at the end of a diagnosis."""
    ends: dict[str, Mapping[str, Any]] = {}
    for entry in summaries:
        if entry.get("stage") == DIAGNOSE and entry.get("moment") == "end":
            ends[str(entry["host"])] = entry.get("summary") or {}
    return ends
