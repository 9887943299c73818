"""What changed between two runs' facts (:mod:`opsbook.core.facts_schema`): each fact that
differs, old and new, and how a number moved; counted per section as ``git diff --stat``
counts per file.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from opsbook.core.facts_schema import HostRunFacts, RunFacts
from opsbook.core.results import Table


@dataclass(frozen=True)
class Change:
    """A fact that differs between two runs: its key (``engine.vllm``), and its values."""

    host: str
    key: str
    old: Any
    new: Any

    @property
    def section(self) -> str:
        return self.key.split(".", 1)[0]

    @property
    def kind(self) -> str:
        if self.old is None:
            return "added"
        return "removed" if self.new is None else "changed"

    def line(self) -> str:
        """``engine.vllm 0.15.1 -> 0.33.0``."""
        return f"{self.key} {_shown(self.old) or '(unknown)'} -> {_shown(self.new) or '(unknown)'}"

    def moved(self) -> str:
        """How a number moved (``+12.5 s (x1.4)``...); "" for other values."""
        if not _number(self.old) or not _number(self.new):
            return ""
        delta = float(self.new) - float(self.old)
        ratio = f" (x{float(self.new) / float(self.old):.2f})" if float(self.old) else ""
        return f"{delta:+g}{ratio}"


@dataclass(frozen=True)
class FactsDiff:
    """What changed in the facts from run ``a`` to run ``b``, host by host."""

    a: str
    b: str
    changes: list[Change] = field(default_factory=list)
    pairs: list[tuple[str, str]] = field(default_factory=list)  # the hosts compared

    def stat(self) -> list[tuple[str, int]]:
        """Per section, how many facts changed (as ``git diff --stat`` counts per file)."""
        counts: dict[str, int] = {}
        for change in self.changes:
            counts[change.section] = counts.get(change.section, 0) + 1
        return sorted(counts.items())

    def head(self) -> str:
        kinds = [c.kind for c in self.changes]
        head = (
            f"{len(self.changes)} fact(s) differ from {self.a} to {self.b}: "
            f"{kinds.count('changed')} changed, {kinds.count('added')} added, "
            f"{kinds.count('removed')} removed"
        )
        other = [f"{old} -> {new}" for old, new in self.pairs if old != new]
        compared = f" (hosts compared: {', '.join(other)})" if other else ""
        unpaired = "" if self.pairs else " (no host in both runs: nothing compared)"
        return head + compared + unpaired

    def table(self) -> Table:
        rows = [[c.host, c.key, _shown(c.old), _shown(c.new), c.moved()] for c in self.changes]
        return Table(["host", "fact", "old", "new", "moved"], rows)


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _shown(value: Any) -> str:
    return "" if value is None else str(value)


def flatten(facts: HostRunFacts) -> dict[str, Any]:
    """A host's facts as ``section.key`` (``section.key.name`` in a mapping) to value; lists
    joined; unknown values left out."""
    flat: dict[str, Any] = {}

    def put(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                put(f"{prefix}.{k}", v)
        elif isinstance(value, list):
            if value:
                flat[prefix] = ", ".join(str(v) for v in value)
        elif value is not None:
            flat[prefix] = value

    for name, value in facts.model_dump().items():
        put(name, value)
    return flat


def diff_facts(a: RunFacts, b: RunFacts) -> FactsDiff:
    """The facts that differ between two runs, host by host (two one-host runs are compared
    whatever their hosts' names)."""
    if len(a.hosts) == 1 and len(b.hosts) == 1:
        pairs = [(next(iter(a.hosts)), next(iter(b.hosts)))]
    else:
        pairs = [(h, h) for h in a.hosts if h in b.hosts]
    changes = []
    for old_host, new_host in pairs:
        old, new = flatten(a.hosts[old_host]), flatten(b.hosts[new_host])
        for key in sorted(set(old) | set(new), key=_key_order):
            if old.get(key) != new.get(key):
                changes.append(Change(new_host, key, old.get(key), new.get(key)))
    return FactsDiff(a.run, b.run, changes, pairs)


# The sections in the order the schema gives them.
_SECTION_ORDER = {name: i for i, name in enumerate(HostRunFacts.model_fields)}


def _key_order(key: str) -> tuple[int, str]:
    return _SECTION_ORDER.get(key.split(".", 1)[0], len(_SECTION_ORDER)), key
