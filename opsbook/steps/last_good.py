"""Last good: per deployment and host, the newest run whose facts a host is known to work with.

A host's run is good when 06_qualify's receipt says it passed there, or, for a run without a
qualification, when its launch left the server ready and the operator marked it good
(``opsbook records mark-good RUN``). A failed qualification is never good. The marks live in
:data:`MARKS_FILE`, one JSON line each, in the runs folder beside the run folders: a sealed
run folder is never edited.

Preflight reads this (drift, :mod:`opsbook.steps.drift`), so it lives below the stages; the
runner's history commands read it too (``opsbook.runner.history``).
"""

from __future__ import annotations

import getpass
import json
import os
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import TypeVar

from opsbook.core.channel import JOURNAL_ENV, RUNS_DIR_ENV
from opsbook.core.deployment import Deployment
from opsbook.core.exceptions import RunError
from opsbook.core.facts_diff import FactsDiff, diff_facts
from opsbook.core.facts_schema import FACTS_FILE, HostRunFacts, RunFacts, load_facts

MARKS_FILE = ".good-marks.jsonl"
QUALIFIED, MARKED = "qualified", "marked good"
READY = "ready"


@dataclass(frozen=True)
class GoodRun:
    """A run a host was good in, and why."""

    run: str
    deployment: str
    host: str
    why: str
    facts: HostRunFacts

    @property
    def fingerprint(self) -> str:
        return self.facts.fingerprint.digest()


def deployment_key(path: str | Path) -> str:
    """A deployment file as records compare it: its absolute path."""
    return str(Path(path).expanduser().resolve())


def run_facts(runs_dir: Path) -> Iterator[RunFacts]:
    """Every run's facts under ``runs_dir``, newest first (a run without ``facts.json``, or
    one written by a newer opsbook, is left out)."""
    for folder in sorted(runs_dir.glob(f"*/{FACTS_FILE}"), reverse=True):
        try:
            yield load_facts(folder)
        except RunError:
            continue


def marks(runs_dir: Path) -> set[tuple[str, str]]:
    """The (run, host) pairs the operator marked good."""
    path = runs_dir / MARKS_FILE
    if not path.is_file():
        return set()
    found = set()
    for line in path.read_text().splitlines():
        try:
            doc = json.loads(line)
            found.add((str(doc["run"]), str(doc["host"])))
        except (ValueError, KeyError, TypeError):
            continue
    return found


def judged_good(verdict: str | None, marked: bool, ready: bool) -> str:
    """Why a host's run is good ("" when it is not): its qualification passed; or, without a
    qualification, its server was left ready and the operator marked it good. The one rule of
    ``records last-good`` and of 06's gate (:func:`newest_good`)."""
    if verdict == "pass":
        return QUALIFIED
    if verdict is None and marked and ready:
        return MARKED
    return ""


def why_good(facts: HostRunFacts, marked: bool) -> str:
    """Why a host's run is good ("" when it is not)."""
    return judged_good(facts.qualification.verdict, marked, facts.state == READY)


Run = TypeVar("Run")


def newest_good(
    runs: Iterable[Run], key: Callable[[Run], Hashable], why: Callable[[Run], str]
) -> dict[Hashable, list[Run]]:
    """The good runs (``why`` says why, "" when not) grouped by ``key``, newest first in each
    group: the first of a group is its last good. ``key`` is the same host and hardware
    fingerprint for both readers (``records last-good``: deployment, host and the facts'
    fingerprint; 06's gate: host, the receipt's fingerprint and the model); ``runs`` come
    newest first."""
    found: dict[Hashable, list[Run]] = {}
    for run in runs:
        if why(run):
            found.setdefault(key(run), []).append(run)
    return found


def good_runs(runs_dir: Path) -> Iterator[GoodRun]:
    """Every host's good runs, newest first."""
    marked = marks(runs_dir)
    for run in run_facts(runs_dir):
        for host, facts in run.hosts.items():
            why = why_good(facts, (run.run, host) in marked)
            if why:
                yield GoodRun(run.run, run.deployment, host, why, facts)


def last_good(runs_dir: Path) -> list[GoodRun]:
    """Per deployment, host and host fingerprint, its newest good run."""
    groups = newest_good(
        good_runs(runs_dir), lambda g: (g.deployment, g.host, g.fingerprint), lambda g: g.why
    )
    return [runs[0] for runs in groups.values()]


def last_good_for(
    runs_dir: Path, deployment: str | Path, host: str, *, before: str = ""
) -> GoodRun | None:
    """A host's newest good run of a deployment, whatever the host's fingerprint was then
    (what moved since is what drift names); ``before``: only runs older than that run."""
    key = deployment_key(deployment)
    for good in good_runs(runs_dir):
        if good.deployment == key and good.host == host and (not before or good.run < before):
            return good
    return None


def mark_good(runs_dir: Path, run: str, hosts: list[str] | None = None) -> list[str]:
    """Mark a run good on its hosts whose launch left the server ready (``hosts``: only
    those); the hosts marked.

    Raises:
        RunError: the run has no facts, a host named is not in it or was not ready, or a
            qualification of it failed (a mark does not overrule a failed gate).
    """
    path = runs_dir / run / FACTS_FILE
    if not path.is_file():
        raise RunError(
            f"run {run} has no {FACTS_FILE} (a run of an earlier opsbook, or not a run folder)",
            remedy="mark a deploy run that ended with its server ready; see `opsbook records list`",
        )
    facts = load_facts(path)
    wanted = hosts or list(facts.hosts)
    unknown = sorted(set(wanted) - set(facts.hosts))
    if unknown:
        raise RunError(
            f"run {run} has no host {', '.join(unknown)}", remedy=f"hosts: {', '.join(facts.hosts)}"
        )
    failed = [h for h in wanted if facts.hosts[h].qualification.verdict == "fail"]
    if failed:
        raise RunError(
            f"run {run} failed its qualification on {', '.join(failed)}: it cannot be marked good",
            remedy="fix what the qualification found and qualify again (06_qualify)",
        )
    ready = [h for h in wanted if facts.hosts[h].state == READY]
    if not ready:
        raise RunError(
            f"run {run} left no server ready on {', '.join(wanted)}",
            remedy="mark a deploy run whose launch ended with the server ready",
        )
    now = datetime.now(timezone.utc).isoformat(timespec="seconds")
    lines = [json.dumps({"run": run, "host": h, "by": getpass.getuser(), "at": now}) for h in ready]
    fd = os.open(runs_dir / MARKS_FILE, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    with os.fdopen(fd, "a") as f:
        f.write("".join(line + "\n" for line in lines))
    return ready


def runs_dir_of_run() -> Path | None:
    """The runs folder of the run this process's stages belong to: JupyterLab's (set by its
    session), else the folder above the run folder, which holds the run's journal (a deploy
    in batches writes its stages' outcome files in a folder per batch, its journal at the top);
    None outside a run."""
    named = os.environ.get(RUNS_DIR_ENV)
    if named:
        return Path(named)
    journal = os.environ.get(JOURNAL_ENV)
    return Path(journal).parent.parent if journal else None


@dataclass(frozen=True)
class SinceGood:
    """What changed on a host from its last good run to its newest run."""

    host: str
    good: GoodRun | None
    newest: str
    diff: FactsDiff | None


def since_last_good(
    runs_dir: Path, deployment: str | Path, hosts: Sequence[str]
) -> list[SinceGood]:
    """Per host, what its newest run with facts changed since its last good run of the
    deployment (``diff`` None: no last good, or the newest run is the last good). Only facts
    known in both count: a run that stopped before the launch knows no startup figures."""
    key = deployment_key(deployment)
    found = []
    for host in hosts:
        newest = next(
            (r for r in run_facts(runs_dir) if r.deployment == key and host in r.hosts),
            None,
        )
        good = last_good_for(runs_dir, deployment, host)
        diff = None
        if newest is not None and good is not None and newest.run != good.run:
            good_run = RunFacts(run=good.run, deployment=key, hosts={host: good.facts})
            one = RunFacts(run=newest.run, deployment=key, hosts={host: newest.hosts[host]})
            whole = diff_facts(good_run, one)
            diff = replace(whole, changes=[c for c in whole.changes if c.kind == "changed"])
        found.append(SinceGood(host, good, newest.run if newest else "", diff))
    return found


def describe_since(found: Sequence[SinceGood]) -> list[str]:
    """``since last good`` lines for a terminal or a notebook."""
    lines = []
    for s in found:
        if s.good is None:
            lines.append(
                f"{s.host}: no last good run (qualify it, or `opsbook records mark-good RUN`)"
            )
        elif s.diff is None:
            lines.append(f"{s.host}: its newest run is its last good ({s.good.run}, {s.good.why})")
        else:
            moved = "; ".join(c.line() for c in s.diff.changes)
            lines.append(
                f"{s.host}: since last good ({s.good.run}, {s.good.why}) to {s.newest}: "
                + (moved or "no fact changed")
            )
    return lines


def since_last_good_here(deployment: Deployment, host: str) -> str:
    """For a stage of a run (05_diagnose on a failed server): one line of what changed on
    ``host`` since its last good run ("" outside a run, or with no run of the deployment)."""
    runs_dir = runs_dir_of_run()
    if runs_dir is None or not runs_dir.is_dir():
        return ""
    [found] = since_last_good(runs_dir, deployment.source, [host])
    return describe_since([found])[0] if found.newest else ""
