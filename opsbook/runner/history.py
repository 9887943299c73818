"""What the records remember across runs: the list filtered, what changed between two runs'
facts (``records diff``), the last good runs (``records last-good``, ``records mark-good``),
the runs where a fact had a value or a failure struck (``records search``), and what changed
since last good for ``opsbook diagnose``.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from opsbook.core.exceptions import RunError
from opsbook.core.facts_diff import FactsDiff, diff_facts, flatten
from opsbook.core.facts_schema import FACTS_FILE, RunFacts, load_facts
from opsbook.core.results import Table
from opsbook.runner import records
from opsbook.steps import last_good
from opsbook.steps.last_good import deployment_key

# A run folder's name begins with when it started (opsbook.runner.execution.new_run_folder).
_STARTED = re.compile(r"^(\d{8}T\d{6}Z)")


@dataclass(frozen=True)
class RunFilter:
    """Which runs ``records list`` shows: each given filter must hold.

    Args:
        deployment: the deployment file (its path, or its name as the list shows it).
        hosts: a host of the run is one of these (a glob on its name, or part of it).
        state: the run's status (``ok``, ``problem found``...).
        since: runs started at or after this (UTC); until: before this.
    """

    deployment: str = ""
    hosts: tuple[str, ...] = ()
    state: str = ""
    since: datetime | None = None
    until: datetime | None = None

    def keeps_folder(self, folder: Path) -> bool:
        """Whether the folder's name alone leaves the run in (its start time; a name without
        one is decided on its record)."""
        started = started_of(folder.name)
        return started is None or self._in_dates(started)

    def keeps(self, folder: Path, doc: Mapping[str, Any]) -> bool:
        started = started_of(folder.name) or _when(doc.get("started"))
        if (self.since or self.until) and (started is None or not self._in_dates(started)):
            return False
        if self.state and str(doc.get("status", "")).lower() != self.state.lower():
            return False
        if self.deployment and not any(
            _same_deployment(d, self.deployment) for d in records.deployments_of(dict(doc))
        ):
            return False
        named = hosts_of(doc)
        return not self.hosts or any(_host_matches(h, p) for h in named for p in self.hosts)

    def _in_dates(self, started: datetime) -> bool:
        return (self.since is None or started >= self.since) and (
            self.until is None or started < self.until
        )


def _when(value: Any) -> datetime | None:
    try:
        when = datetime.fromisoformat(str(value))
    except ValueError:
        return None
    return when if when.tzinfo else when.replace(tzinfo=timezone.utc)


def started_of(name: str) -> datetime | None:
    """When a run started, from its folder's name."""
    found = _STARTED.match(name)
    if not found:
        return None
    return datetime.strptime(found.group(1), "%Y%m%dT%H%M%SZ").replace(tzinfo=timezone.utc)


def parse_when(text: str) -> datetime:
    """A ``--since``/``--until`` value: an ISO date or date and time (UTC unless it says).

    Raises:
        RunError: it is neither.
    """
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise RunError(
            f"{text!r} is not a date",
            remedy="give an ISO date or time: 2026-12-06 or 2026-12-06T05:00",
        ) from None
    return when if when.tzinfo else when.replace(tzinfo=timezone.utc)


def _same_deployment(recorded: str, given: str) -> bool:
    if recorded == given or Path(recorded).name == given:
        return True
    return deployment_key(recorded) == deployment_key(given)


def _host_matches(host: str, pattern: str) -> bool:
    return pattern in host or fnmatch.fnmatchcase(host, pattern)


def hosts_of(doc: Mapping[str, Any]) -> list[str]:
    """The hosts a run record names (its hosts, else its results')."""
    named = [str(h) for h in doc.get("hosts") or []]
    return named or list(dict.fromkeys(str(r.get("host", "")) for r in doc.get("results") or []))


def list_runs(runs_dir: Path, only: RunFilter | None = None) -> Table:
    """``records list``: every run folder the filter keeps, newest first."""
    if only is None or only == RunFilter():
        return records.list_runs(runs_dir)
    return records.list_runs(runs_dir, keep=only.keeps, keep_folder=only.keeps_folder)


def facts_of(runs_dir: Path, run: str | Path) -> RunFacts:
    """A run's facts (a run folder's path, or its name under ``runs_dir``).

    Raises:
        RunError: the run has no ``facts.json``.
    """
    folder = Path(run) if Path(run).is_dir() else runs_dir / str(run)
    path = folder / FACTS_FILE
    if not path.is_file():
        raise RunError(
            f"{folder} has no {FACTS_FILE} (not a run folder, or a run of an opsbook before it)",
            remedy="see `opsbook records list`",
        )
    return load_facts(path)


def diff_runs(runs_dir: Path, a: str, b: str) -> FactsDiff:
    """``records diff A B``."""
    return diff_facts(facts_of(runs_dir, a), facts_of(runs_dir, b))


# --- last good and search ---------------------------------------------------------------


def last_good_table(runs_dir: Path) -> Table:
    """``records last-good``: per deployment, host and host fingerprint, the newest good run."""
    rows = [
        [
            Path(g.deployment).name,
            g.host,
            g.fingerprint,
            g.run,
            g.why,
            g.facts.engine.vllm or "",
            g.facts.fingerprint.driver or "",
        ]
        for g in last_good.last_good(runs_dir)
    ]
    return Table(["deployment", "host", "fingerprint", "run", "why", "vLLM", "driver"], rows)


def mark_good(runs_dir: Path, run: str, hosts: Sequence[str] = ()) -> list[str]:
    """``records mark-good RUN``: see :func:`opsbook.steps.last_good.mark_good`."""
    folder = Path(run)
    name = folder.name if folder.is_dir() else run
    return last_good.mark_good(folder.parent if folder.is_dir() else runs_dir, name, list(hosts))


def parse_fact(text: str) -> tuple[str, str]:
    """``vllm=0.15.1`` as (name, value).

    Raises:
        RunError: it has no ``=``.
    """
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise RunError(f"--fact {text!r} is not NAME=VALUE", remedy="e.g. --fact vllm=0.15.1")
    return name.strip(), value.strip()


def fact_matches(flat: Mapping[str, Any], name: str, value: str) -> bool:
    """Whether a fact named ``name`` (its whole key, or its last part: ``vllm``,
    ``engine.vllm``, ``flags.kv-cache-dtype``) has the value ``value`` (a glob)."""
    return any(
        (key == name or key.endswith("." + name)) and fnmatch.fnmatchcase(str(v), value)
        for key, v in flat.items()
    )


def search(
    runs_dir: Path, facts: Sequence[tuple[str, str]] = (), failures: Sequence[str] = ()
) -> Table:
    """``records search``: each run and host where every fact given had its value and every
    failure given struck, newest first."""
    rows = []
    for run in last_good.run_facts(runs_dir):
        for host, found in run.hosts.items():
            flat = flatten(found)
            if not all(fact_matches(flat, n, v) for n, v in facts):
                continue
            if not all(f in found.failures for f in failures):
                continue
            rows.append(
                [
                    run.run,
                    host,
                    Path(run.deployment).name,
                    run.status,
                    found.engine.vllm or "",
                    ", ".join(found.failures),
                ]
            )
    return Table(["run", "host", "deployment", "status", "vLLM", "failures"], rows)
