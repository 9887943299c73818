"""Which catalogue entries each log line matches."""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Iterable, Sequence
from functools import lru_cache, partial

from opsbook.knowledge.logscan.catalogue import CONTEXT_WINDOW, CatalogueEntry, Hit, _catalogue
from opsbook.knowledge.logscan.line_grammar import _FRAME, _NOT_A_CAUSE, NAMED_GROUP, RAISE_LITERAL
from opsbook.knowledge.logscan.log_lines import LineMemo, LogLine


def match_catalogue(
    lines: Sequence[LogLine],
    catalogue: Sequence[CatalogueEntry] | None = None,
    memo: LineMemo | None = None,
) -> list[Hit]:
    """Every catalogue entry found on every message line (traceback source lines skipped).

    Args:
        lines: the log's lines.
        catalogue: the entries to look for; the shipped catalogue by default.
        memo: which patterns each text matched at earlier looks (see :class:`LineMemo`).

    Returns:
        Hits in log order; one line may hit several entries.
    """
    entries = _catalogue() if catalogue is None else tuple(catalogue)
    # The memo knows the shipped catalogue's matches only.
    memo = memo if memo is not None and catalogue is None else LineMemo()
    matching_patterns = partial(_matching_patterns, entries, _screen(entries))
    caseless_matches = partial(_caseless_matches, entries)
    hits = []
    recent: deque[str] = deque(maxlen=CONTEXT_WINDOW)
    generic = [entry for entry in entries if entry.kind == "generic"]
    for position, line in enumerate(lines):
        found = False
        message = not line.is_code or _failed_assertion(lines, position)
        text = _completed_from_raise(lines, position) if line.exception else line.text
        if message and line.exception and not text.endswith("."):
            # A message a reporter or a page wrapped over two lines matches as one.
            text = _with_continuation(lines, position, text)
        matching = memo.matches.get(text, matching_patterns) if message else ()
        for entry, indexes in matching:
            index = _first_after(entry, indexes, recent)
            if index is not None:
                hits.append(Hit(entry, line, index))
                found = found or entry.kind == "generic"
        if line.exception and not found:
            # An exception line no pattern names (a name read from its place in a traceback).
            hits += [Hit(entry, line, 0) for entry in generic]
        if _typed_in_lower_case(line) and not any(hit.line is line for hit in hits[-1:]):
            matches = memo.caseless.get(line.text, caseless_matches)
            hits += [Hit(entry, line, index) for entry, index in matches]
        recent.append(line.text)
    return hits


def _with_continuation(lines: Sequence[LogLine], index: int, text: str) -> str:
    """An exception line's text joined with the next line when that line continues its
    sentence: text at the margin that starts in lower case, with no level, exception name or
    code of its own. An indented or capitalised line is a message of its own (pydantic's
    "Value error, ..." detail under its ValidationError)."""
    if index + 1 >= len(lines):
        return text
    following = lines[index + 1]
    if (
        not following.text[:1].islower()
        or following.raw[:1].isspace()
        or following.level
        or following.exception
        or following.is_code
        or _NOT_A_CAUSE.match(following.text)
        or _FRAME.match(following.raw)
    ):
        return text
    return f"{text} {following.text}"


def _completed_from_raise(lines: Sequence[LogLine], index: int) -> str:
    """An exception line that an excerpt cut short ("RuntimeError: Engine core ini") reads as
    the message of the ``raise`` statement just above it, when that statement's literal
    starts with what is left of the line; any other line's text unchanged."""
    line = lines[index]
    name, _, message = line.text.partition(": ")
    above = (lines[n] for n in range(index - 1, max(index - 4, -1), -1))
    before = next((other for other in above if other.text), None)
    if before is None or not before.is_code or len(message) < 3:
        return line.text
    found = RAISE_LITERAL.match(before.text.strip())
    if found is None or found.group("name").rsplit(".", 1)[-1] != name.rsplit(".", 1)[-1]:
        return line.text
    literal = found.group("literal").rstrip()
    if len(literal) > len(message.rstrip()) and literal.startswith(message.rstrip()):
        return f"{name}: {literal}"
    return line.text


def _failed_assertion(lines: Sequence[LogLine], index: int) -> bool:
    """A traceback's ``assert`` source line followed by a bare ``AssertionError``: Python
    prints no message for an assertion without one, so the failed line is the message."""
    if not lines[index].text.startswith("assert "):
        return False
    # The assertion's message may wrap, or a "^^^^" marker line follow: a few lines at most.
    after = (lines[n].text for n in range(index + 1, min(index + 4, len(lines))))
    return any(text.rstrip(": ") == "AssertionError" for text in after)


def _typed_in_lower_case(line: LogLine) -> bool:
    # A reporter who retyped an error in lower case ("valueerror: loading x requires you to
    # execute the configuration file ..."): no capital letter at all in a sentence-long line.
    text = line.text
    return len(text) >= 40 and not line.is_code and text.islower() and " " in text


def _caseless_matches(
    entries: Sequence[CatalogueEntry], text: str
) -> tuple[tuple[CatalogueEntry, int], ...]:
    # The causes whose patterns match the text in any case, each with its first such pattern.
    matches = []
    for entry in entries:
        if entry.kind != "cause":
            continue
        index = next((i for i, p in enumerate(_caseless_patterns(entry)) if p.search(text)), None)
        if index is not None:
            matches.append((entry, index))
    return tuple(matches)


@lru_cache(maxsize=256)
def _caseless_patterns(entry: CatalogueEntry) -> tuple[re.Pattern[str], ...]:
    return tuple(re.compile(p.pattern, re.IGNORECASE) for p in entry.patterns)


@lru_cache(maxsize=8)
def _screen(entries: tuple[CatalogueEntry, ...]) -> re.Pattern[str]:
    # One pass of all patterns at once: most lines of a long log match none of them.
    alternatives = (NAMED_GROUP.sub("(?:", p.pattern) for e in entries for p in e.patterns)
    return re.compile("|".join(f"(?:{alternative})" for alternative in alternatives))


def _first_matching(entry: CatalogueEntry, text: str, recent: Sequence[str] = ()) -> int | None:
    # Lazily: the search stops at the first pattern that matches with its context.
    indexes = (index for index, pattern in enumerate(entry.patterns) if pattern.search(text))
    return _first_after(entry, indexes, recent)


def _matching_patterns(
    entries: tuple[CatalogueEntry, ...], screen: re.Pattern[str], text: str
) -> tuple[tuple[CatalogueEntry, tuple[int, ...]], ...]:
    """The entries whose patterns the text matches, each with the indexes of those patterns
    (their ``after`` context not yet asked); ``screen`` is the entries' combined pattern."""
    if not screen.search(text):
        return ()
    found = (
        (entry, tuple(i for i, pattern in enumerate(entry.patterns) if pattern.search(text)))
        for entry in entries
    )
    return tuple((entry, indexes) for entry, indexes in found if indexes)


def _first_after(
    entry: CatalogueEntry, indexes: Iterable[int], recent: Sequence[str]
) -> int | None:
    """The first of the matching patterns whose ``after`` context one of the recent lines
    holds (a pattern without one needs none)."""
    for index in indexes:
        after = entry.after[index] if index < len(entry.after) else None
        if after is None or any(after.search(before) for before in recent):
            return index
    return None
