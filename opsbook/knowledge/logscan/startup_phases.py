"""The startup phases a log shows, and the vLLM version it states."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from opsbook.knowledge.logscan.catalogue import StageNumbers, signals
from opsbook.knowledge.logscan.log_lines import LineMemo, LogLine, read_log_lines

# The phases in startup order (failures.yaml, signals.phases).
PHASE_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = signals().phases
PHASE_NAMES = tuple(name for name, _ in PHASE_PATTERNS)


_VERSION_PATTERNS = signals().versions


@dataclass(frozen=True)
class Phase:
    """A startup phase and the first line that shows it."""

    name: str
    first_line_no: int
    timestamp: datetime | None


def phases(text: str) -> list[Phase]:
    """The startup phases a log shows, each at its first line, in log order.

    Args:
        text: the whole log.

    Returns:
        Phases named as ``PHASE_NAMES``. A phase's timestamp is its first line's, or when
        that line has none (a progress bar, uvicorn), the last one stamped before it; None
        when no line before it has a time.
    """
    lines = read_log_lines(text)
    return _first_phases(_phase_events(lines), lines)


def find_version(lines: Sequence[LogLine]) -> str | None:
    """The vLLM version a log states (``vLLM API server version X``, ``V1 LLM engine (vX)``...).

    Args:
        lines: the log's lines.

    Returns:
        The first version stated, or None.
    """
    for line in lines:
        for pattern in _VERSION_PATTERNS:
            found = pattern.search(line.text)
            if found:
                return found.group(1).rstrip(".,;:)")
    return None


def stage_at(stages: StageNumbers, events: list[tuple[LogLine, str]], at: int) -> str | None:
    """The startup stage line ``at`` fell in, as ``stages`` names the phases (None before any)."""
    before = [(line, name) for line, name in events if line.number < at]
    furthest = _furthest_phase(before)
    if furthest is None:
        return None
    if furthest == stages.after_phase and any(
        stages.after_pattern.search(line.text) for line, _ in before
    ):
        return stages.after_stage
    return stages.stage_of(furthest)


def _phase_events(
    lines: Sequence[LogLine], memo: LineMemo | None = None
) -> list[tuple[LogLine, str]]:
    memo = memo or LineMemo()
    events = []
    for line in lines:
        if line.is_code:
            continue
        name = memo.phase.get(line.text, _phase_of)
        if name is not None:
            events.append((line, name))
    return events


def _phase_of(text: str) -> str | None:
    return next((name for name, pattern in PHASE_PATTERNS if pattern.search(text)), None)


def _first_phases(events: list[tuple[LogLine, str]], lines: Sequence[LogLine]) -> list[Phase]:
    # A phase whose first line has no time (a progress bar, a uvicorn line) began no earlier
    # than the last time stamped before it: that is the best start a timeline can have.
    first: dict[str, int] = {}
    for line, name in events:
        first.setdefault(name, line.number)
    starts = {number: name for name, number in first.items()}
    found: list[Phase] = []
    latest: datetime | None = None
    for line in lines:
        latest = line.timestamp or latest
        if line.number in starts:
            found.append(Phase(starts[line.number], line.number, latest))
    return found


def _furthest_phase(events: list[tuple[LogLine, str]]) -> str | None:
    # Phases of several ranks interleave; the furthest one reached is the honest "where".
    reached = {name for _, name in events}
    return next((name for name in reversed(PHASE_NAMES) if name in reached), None)
