"""How a notebook tells its runner what each stage did on each host, and how the runner reads it.

This module owns both directions of the one format between the kernel and ``opsbook run``:
a stage writes each host's :class:`~opsbook.core.results.HostResult` as one JSON line the moment the
host is done (:func:`record_host`), a long stage the steps it reaches on the way
(:func:`record_progress`), and the changes a stage showed as diffs (:func:`record_diff`),
into the file that ``OPSBOOK_OUTCOME`` names; the runner follows that file while the notebook
runs (:class:`Follower`), so it prints a line per host as it happens, and reads it back typed
(:func:`read`, :func:`read_diffs`). Stepping through in JupyterLab, nothing is written.

The variables through which ``opsbook run`` and the notebook's kernel speak are all named here,
once; each module that reads or sets one imports its name from this module.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from opsbook.core.results import Finding, HostResult, Result, State, shown

# The file each host's result and a long stage's progress are appended to (set by the runner,
# or by a JupyterLab session, in the kernel).
OUTCOME_ENV = "OPSBOOK_OUTCOME"
# The journal of remote commands (opsbook.remote.journal), set beside the outcome file.
JOURNAL_ENV = "OPSBOOK_JOURNAL"
# "1" (or anything but "" and "0"): no frontend, whatever the kernel says (a headless run).
HEADLESS_ENV = "OPSBOOK_HEADLESS"
# "1" in a deploy's shared kernel: a closed Host leaves its SSH connection for the next stage.
KEEP_CONNECTIONS_ENV = "OPSBOOK_KEEP_CONNECTIONS"
# Where a JupyterLab session files its runs (default: the checkout's runs/).
RUNS_DIR_ENV = "OPSBOOK_RUNS_DIR"
# The deployment file a notebook opened in JupyterLab uses (its parameters cell reads it; a
# notebook's cell spells the name itself, and a test holds it to this one).
DEPLOYMENT_ENV = "OPSBOOK_DEPLOYMENT"
PROGRESS = "progress"
DIFF = "diff"
AMEND = "amend"
METRICS = "metrics"
_lock = threading.Lock()


@dataclass(frozen=True)
class StageProgress:
    """A step a long stage reached on one host (a launch's startup phase), for a live line."""

    host: str
    stage: str
    seconds: float
    text: str

    def line(self) -> str:
        return f"{self.stage:<14} {self.host:<32} {'...':<12} {self.seconds:6.0f} s  {self.text}"


def encode_progress(progress: StageProgress) -> str:
    """One JSON line for ``progress``."""
    return json.dumps({"kind": PROGRESS, **asdict(progress)})


def record_progress(progress: StageProgress) -> StageProgress:
    """Append ``progress`` to the outcome file of this run, if there is one."""
    _append(encode_progress(progress))
    return progress


@dataclass(frozen=True)
class StageDiff:
    """A change a stage showed on one host as a diff (the config patch's plan, the launch
    script it uploads), kept in the run record for ``opsbook records show --diff``."""

    host: str
    stage: str
    title: str
    text: str


def record_diff(diff: StageDiff) -> StageDiff:
    """Append ``diff`` to the outcome file of this run, if there is one (what looks like a
    secret masked)."""
    _append(json.dumps({"kind": DIFF, **asdict(replace(diff, text=shown(diff.text)))}))
    return diff


def read_diffs(path: Path) -> list[StageDiff]:
    """The diffs a run recorded, in order (none when the file is missing)."""
    if not path.exists():
        return []
    records = [_decode_any(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in records if isinstance(r, StageDiff)]


@dataclass(frozen=True)
class StageMetrics:
    """A server's ``/metrics`` summarized at a moment of a stage (04's ready, the end of a
    diagnose), kept in the run record (``summary.json``'s ``metrics``)."""

    host: str
    stage: str
    moment: str
    summary: dict[str, Any]


def record_metrics(metrics: StageMetrics) -> StageMetrics:
    """Append ``metrics`` to the outcome file of this run, if there is one."""
    _append(json.dumps({"kind": METRICS, **asdict(metrics)}))
    return metrics


def read_metrics(path: Path) -> list[StageMetrics]:
    """The metrics summaries a run recorded, in order (none when the file is missing)."""
    if not path.exists():
        return []
    records = [_decode_any(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in records if isinstance(r, StageMetrics)]


@dataclass(frozen=True)
class Amended:
    """A host's result of a stage as the stage amended it once all its hosts were done (what
    their comparison found): it takes the place of the result recorded for that host and
    stage before it."""

    result: HostResult


def record_amended(result: HostResult) -> HostResult:
    """Append ``result`` as an amendment of the host's earlier result of its stage."""
    _append(json.dumps({"kind": AMEND, **json.loads(encode(_masked(result)))}))
    return result


def amend(results: list[HostResult], result: HostResult) -> HostResult | None:
    """Put ``result`` in the place of the result of its host and stage in ``results`` (at
    the end when there is none); the one it replaced, or None."""
    for i, earlier in enumerate(results):
        if (earlier.host, earlier.stage) == (result.host, result.stage):
            results[i] = result
            return earlier
    results.append(result)
    return None


def same_line(earlier: HostResult | None, later: HostResult) -> bool:
    """Whether ``later`` says on its line what ``earlier`` said (its state and message)."""
    return earlier is not None and (earlier.state, earlier.message) == (later.state, later.message)


def encode(result: HostResult) -> str:
    """One JSON line for ``result``."""
    doc = {
        "host": result.host,
        "stage": result.stage,
        "state": result.state.value,
        "message": result.message,
        "failure_id": result.failure_id,
        "findings": [_finding_doc(f) for f in result.findings],
        "duration": round(result.duration, 3),
        "script_sha256": result.script_sha256,
    }
    return json.dumps(doc)


def decode(line: str) -> HostResult:
    """The :class:`HostResult` a line of :func:`encode` describes.

    Raises:
        ValueError: the line is not such a record.
    """
    doc = json.loads(line)
    if not isinstance(doc, dict) or doc.get("kind") in (PROGRESS, DIFF, AMEND, METRICS):
        raise ValueError(f"not a host result: {line[:80]!r}")
    return HostResult(
        host=str(doc["host"]),
        stage=str(doc["stage"]),
        state=State(doc["state"]),
        message=str(doc["message"]),
        failure_id=str(doc.get("failure_id") or ""),
        findings=tuple(Finding(**f) for f in doc.get("findings", [])),
        duration=float(doc.get("duration") or 0.0),
        script_sha256=str(doc.get("script_sha256") or ""),
    )


def to_dict(result: HostResult) -> dict[str, Any]:
    """The record of ``result`` as a JSON-ready mapping (for ``summary.json``)."""
    loaded: dict[str, Any] = json.loads(encode(result))
    return loaded


def record_host(result: HostResult) -> HostResult:
    """Append ``result`` to the outcome file of this run, if there is one; returns it.

    Threads of a stage's fan-out call this as each host finishes: one write per line, under a
    lock, flushed at once so that the runner sees it now. What looks like a secret (a foreign
    process's ``--api-key``, say, in a finding) is masked in the file.
    """
    _append(encode(_masked(result)))
    return result


def _masked(result: HostResult) -> HostResult:
    findings = tuple(
        replace(f, subject=shown(f.subject), message=shown(f.message), remedy=shown(f.remedy))
        for f in result.findings
    )
    return replace(result, message=shown(result.message), findings=findings)


def _append(line: str) -> None:
    path = os.environ.get(OUTCOME_ENV)
    if path:
        with _lock, Path(path).open("a") as f:
            f.write(line + "\n")
            f.flush()


def record(result: Result, stage: str = "", host: str = "") -> Result:
    """A single check's verdict, noted as ``host``'s result of ``stage`` (ok or failed)."""
    state = State.OK if result.ok else State.FAILED
    record_host(HostResult(host, stage, state, result.message, findings=tuple(result.findings)))
    return result


def read(path: Path) -> list[HostResult]:
    """The results a run recorded, in order, each amended as its stage amended it (none when
    the file is missing)."""
    if not path.exists():
        return []
    results: list[HostResult] = []
    for line in path.read_text().splitlines():
        record = _decode_any(line) if line.strip() else None
        if isinstance(record, HostResult):
            results.append(record)
        elif isinstance(record, Amended):
            amend(results, record.result)
    return results


class Follower:
    """Reads the results appended to an outcome file since the last look."""

    def __init__(self, path: Path):
        self.path = path
        self._offset = 0
        self._partial = ""

    def new(self) -> list[HostResult | StageProgress | StageDiff | Amended | StageMetrics]:
        """The complete lines written since the last call, decoded."""
        try:
            with self.path.open() as f:
                f.seek(self._offset)
                chunk = f.read()
                self._offset = f.tell()
        except FileNotFoundError:
            return []
        text = self._partial + chunk
        *lines, self._partial = text.split("\n")
        return [_decode_any(line) for line in lines if line.strip()]


def _decode_any(line: str) -> HostResult | StageProgress | StageDiff | Amended | StageMetrics:
    doc = json.loads(line)
    if isinstance(doc, dict) and doc.get("kind") == METRICS:
        return StageMetrics(
            str(doc["host"]), str(doc["stage"]), str(doc["moment"]), dict(doc["summary"])
        )
    if isinstance(doc, dict) and doc.get("kind") == AMEND:
        return Amended(decode(json.dumps({k: v for k, v in doc.items() if k != "kind"})))
    if isinstance(doc, dict) and doc.get("kind") == DIFF:
        return StageDiff(str(doc["host"]), str(doc["stage"]), str(doc["title"]), str(doc["text"]))
    if isinstance(doc, dict) and doc.get("kind") == PROGRESS:
        return StageProgress(
            str(doc["host"]), str(doc["stage"]), float(doc["seconds"]), str(doc["text"])
        )
    return decode(line)


def _finding_doc(finding: Finding) -> dict[str, str]:
    doc = {
        "severity": finding.severity,
        "subject": finding.subject,
        "message": finding.message,
        "remedy": finding.remedy,
        "source": finding.source,
    }
    # The machine id travels with it, so a record can be searched by kind (hosts-differ).
    return doc | {"code": finding.code} if finding.code else doc
