"""The failure catalogue (``opsbook/knowledge/data/failures.yaml``) loaded into typed entries."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any

import yaml

from opsbook.core.exceptions import OpsbookError
from opsbook.core.results import SEVERITIES
from opsbook.knowledge.logscan.line_grammar import EXCEPTION_NAME
from opsbook.knowledge.logscan.log_lines import LogLine

KINDS = ("cause", "wrapper", "stall", "generic", "note")

# How far back a pattern's ``after`` context is looked for: a traceback's last frames.
CONTEXT_WINDOW = 12


@dataclass(frozen=True)
class CatalogueEntry:
    """One failure class of ``opsbook/knowledge/data/failures.yaml``."""

    id: str
    title: str
    kind: str
    severity: str
    priority: int
    patterns: tuple[re.Pattern[str], ...]
    remedy: str
    source: str
    parse: tuple[re.Pattern[str], ...] = ()
    remedy_parsed: str = ""
    stems: tuple[str, ...] = ()
    # Per pattern: a text that must be on one of the CONTEXT_WINDOW lines before (None: any).
    after: tuple[re.Pattern[str] | None, ...] = ()
    # The shared failure id this class is reported under, when its own id is not one of them.
    family: str | None = None
    # A stall logged on a timer while a normal startup waits too: a hang only when this many
    # end the log in a row, with no other line between them.
    hang_after: int | None = None

    @property
    def failure(self) -> str:
        """The failure id a diagnosis of this class reports."""
        return self.family or self.id

    @property
    def error_class(self) -> str | None:
        """The class's own id when it is reported under a family's failure id."""
        return self.id if self.family else None


@dataclass(frozen=True)
class Hit:
    """A catalogue entry found on a log line; ``pattern_index`` says which pattern matched."""

    entry: CatalogueEntry
    line: LogLine
    pattern_index: int


def load_catalogue() -> list[CatalogueEntry]:
    """Read the failure catalogue shipped with opsbook.

    Returns:
        The entries in file order.

    Raises:
        OpsbookError: when the catalogue file is malformed.
    """
    return list(_catalogue())


@lru_cache(maxsize=1)
def _catalogue() -> tuple[CatalogueEntry, ...]:
    text = (
        resources.files("opsbook.knowledge")
        .joinpath("data/failures.yaml")
        .read_text(encoding="utf-8")
    )
    # libyaml's parser when PyYAML has it: the pure-Python one takes most of a small log's
    # diagnosis (opsbook diagnose starts in well under half a second).
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return tuple(_entry(raw) for raw in yaml.load(text, Loader=loader))


def _entry(raw: dict[str, Any]) -> CatalogueEntry:
    try:
        entry = CatalogueEntry(
            id=raw["id"],
            title=raw["title"],
            kind=raw["kind"],
            severity=raw["severity"],
            priority=int(raw["priority"]),
            patterns=tuple(re.compile(_regex(p)) for p in raw["patterns"]),
            remedy=raw["remedy"],
            source=raw["source"],
            parse=tuple(re.compile(p) for p in raw.get("parse", ())),
            remedy_parsed=raw.get("remedy_parsed", ""),
            stems=tuple(raw.get("stems", ())),
            after=tuple(_after(p) for p in raw["patterns"]),
            family=raw.get("family"),
            hang_after=raw.get("hang_after"),
        )
    except (KeyError, TypeError, re.error) as exc:
        raise OpsbookError(
            f"failure catalogue entry {raw!r:.80} is malformed: {exc}",
            remedy="fix opsbook/knowledge/data/failures.yaml (fields are described at its top)",
        ) from exc
    if entry.kind not in KINDS or entry.severity not in SEVERITIES:
        raise OpsbookError(
            f"failure catalogue entry {entry.id!r} has kind {entry.kind!r} / severity "
            f"{entry.severity!r}",
            remedy=f"use a kind of {KINDS} and a severity of {SEVERITIES}",
        )
    return entry


def _regex(pattern: str | dict[str, str]) -> str:
    # "<EXCEPTION>" in a pattern stands for any exception name (EXCEPTION_NAME).
    text = pattern["regex"] if isinstance(pattern, dict) else pattern
    return text.replace("<EXCEPTION>", EXCEPTION_NAME)


def _after(pattern: str | dict[str, str]) -> re.Pattern[str] | None:
    """A pattern's context: a text one of the lines just before must hold (a traceback's
    frame), for a message that means different things from different kernels."""
    return re.compile(pattern["after"]) if isinstance(pattern, dict) else None


def _entry_by_id(entry_id: str) -> CatalogueEntry:
    return next(entry for entry in _catalogue() if entry.id == entry_id)
