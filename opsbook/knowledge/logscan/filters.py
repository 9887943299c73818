"""Hits that are not the startup's failure: handled, logged at DEBUG, gone past, a stop's."""

from __future__ import annotations

from bisect import bisect_left
from itertools import accumulate

from opsbook.knowledge.logscan.catalogue import Hit, signals
from opsbook.knowledge.logscan.line_grammar import _NOT_A_CAUSE
from opsbook.knowledge.logscan.log_lines import LogLine
from opsbook.knowledge.logscan.startup_phases import PHASE_NAMES

_SIGNALS = signals()


def _stop_requested(hits: list[Hit], ready_at: int | None) -> Hit | None:
    """The first line, after the server was up, that says it was asked to stop."""
    if ready_at is None:
        return None
    return next(
        (hit for hit in hits if hit.entry.stop_request and hit.line.number > ready_at), None
    )


def _teardown_dropped(hits: list[Hit], stopped: Hit) -> list[Hit]:
    """The hits without the failures logged once a stop of a serving server was under way: a
    stop (vLLM 0.23.0-0.34.0 shuts its engine down with mode=abort and force-kills it) makes
    the API server's output loop raise EngineDeadError, and tearing down the workers' process
    groups can fail: the stop's errors, not the server's failure."""
    return [
        hit
        for hit in hits
        if hit.line.number < stopped.line.number or hit.entry.kind not in ("wrapper", "cause")
    ]


def _served_then_stopped(hits: list[Hit]) -> Hit | None:
    return next(
        (
            hit
            for hit in hits
            if hit.entry.stop_request
            and hit.pattern_index in hit.entry.served_patterns
            and hit.entry.served_record is not None
            and hit.entry.served_record.search(hit.line.raw)
        ),
        None,
    )


def _after_launch(hits: list[Hit], lines: list[LogLine]) -> list[Hit]:
    """The hits of the text from vLLM's own start, when an error of the program that launches
    it (a platform's worker, a wrapper script) comes before that start: the launcher went on
    to start vLLM, so its error did not stop the launch. The start is the last API server
    version line of the text (the splitter has left one startup, whose head may hold the
    launcher's lines). Only stamped lines that carry neither a level opsbook reads nor a
    process prefix are taken for the launcher's: a line of vLLM's logger, or an error quoted
    above the log, is kept wherever it is."""
    start = next(
        (line.number for line in reversed(lines) if _SIGNALS.server_start.match(line.text)), None
    )
    if start is None:
        return hits
    return [
        hit
        for hit in hits
        if hit.line.number >= start
        or hit.entry.kind in ("note", "stall")
        or hit.line.level is not None
        or hit.line.process is not None
        # A line with no time is no launcher's record: an error a reporter quotes above the
        # log it came from.
        or hit.line.timestamp is None
    ]


def _debug_dropped(hits: list[Hit]) -> list[Hit]:
    """The hits without errors logged at DEBUG: what a program logs at DEBUG it has handled
    (vLLM 0.10.2-0.11.2 vllm/transformers_utils/config.py, 0.12.0-0.34.0 repo_utils.py:
    logger.debug("File or repository not found in hf_hub_download", e) for an optional file,
    then goes on). A stall or a note at DEBUG is kept (the engine's waits are DEBUG)."""
    return [hit for hit in hits if hit.line.level != "DEBUG" or hit.entry.kind in ("stall", "note")]


def _tool_parser_dropped(hits: list[Hit]) -> list[Hit]:
    """The hits without uncatalogued errors a tool-call parser logged: a request's handled
    error, not the server's failure."""
    return [
        hit
        for hit in hits
        if hit.entry.kind != "generic" or not _SIGNALS.handled_error_record.search(hit.line.raw)
    ]


def _optional_import_dropped(hits: list[Hit]) -> list[Hit]:
    """The hits without an optional extension's failed import, when another error is in the
    log: vLLM went on without the extension, so the other error stopped it."""
    optional = {id(hit.line) for hit in hits if _SIGNALS.optional_extension.search(hit.line.text)}
    errors = ("cause", "wrapper", "generic")
    if not any(id(hit.line) not in optional and hit.entry.kind in errors for hit in hits):
        return hits
    return [hit for hit in hits if id(hit.line) not in optional]


def _survived_dropped(hits: list[Hit], events: list[tuple[LogLine, str]]) -> list[Hit]:
    """The hits without uncatalogued errors that the same process's startup went past: a
    later phase than the one it was in, logged by the same process, shows the error was not
    fatal (a logged and handled exception, an optional import). A catalogued cause is kept."""
    if not events or not any(hit.entry.kind == "generic" for hit in hits):
        return hits
    order = {name: index for index, name in enumerate(PHASE_NAMES)}
    numbers = [line.number for line, _ in events]
    reached = list(accumulate((order[name] for _, name in events), max))
    # Per process: its events' numbers and the furthest phase it logs from each one on.
    by_process: dict[str | None, tuple[list[int], list[int]]] = {}
    for line, name in reversed(events):
        later, furthest = by_process.setdefault(line.process, ([], []))
        later.append(-line.number)
        furthest.append(max(order[name], furthest[-1] if furthest else -1))
    kept = []
    for hit in hits:
        # Only a record of the log (levelled or stamped): an error a reporter quotes above the
        # log it came from is no line of that startup.
        record = hit.line.level is not None or hit.line.timestamp is not None
        if hit.entry.kind == "generic" and record and hit.line.process in by_process:
            at = bisect_left(numbers, hit.line.number)
            phase = reached[at - 1] if at else -1
            later, furthest = by_process[hit.line.process]
            after = bisect_left(later, -hit.line.number) - 1  # the last event after the hit
            if after >= 0 and furthest[after] > phase:
                continue
        kept.append(hit)
    return kept


def _error_after_progress(
    lines: list[LogLine], events: list[tuple[LogLine, str]]
) -> LogLine | None:
    """The first ERROR line after the startup's last progress, when no exception or known
    error is in the log: a program that runs vLLM (a router, an inference server) often logs
    only its own error, not vLLM's. A line that opens a list (ends in ":") or is an item of
    one is not the statement of the error."""
    progress_at = max((line.number for line, _ in events), default=0)
    for line in lines:
        text = line.text
        if (
            line.number > progress_at
            and line.level in ("ERROR", "CRITICAL")
            and not line.is_code
            and text
            and not text.endswith(":")
            and not text.startswith(("- ", "* ", "• "))
            and not _NOT_A_CAUSE.match(text)
        ):
            return line
    return None


# Levels at which a program states the error that stops it (a raised exception is one too).
_FATAL_LEVELS = ("ERROR", "CRITICAL")
# Levels of a line that reports and goes on: never what ended a startup by itself.
_GOING_ON_LEVELS = ("WARNING", "INFO")
_STATED = ("cause", "generic")


def _states_fatal_error(hit: Hit, kinds: tuple[str, ...] = _STATED) -> bool:
    """Whether the hit states an error of ``kinds`` at a level that stops a program: a raised
    exception's line or an ERROR/CRITICAL record (a wrapper only says a process died, not of
    what)."""
    line = hit.line
    return hit.entry.kind in kinds and (line.exception or line.level in _FATAL_LEVELS)


def _warnings_outranked(hits: list[Hit]) -> list[Hit]:
    """The candidate failures without those logged at WARNING or INFO that a known fatal error
    of the same startup follows: a warning is the process going on (a slow node, an optional
    kernel missing, a retried allocation); what ended the startup is the catalogued error
    stated after it at ERROR level or raised, whatever the catalogue's priorities say.

    An uncatalogued exception after a catalogued warning does not outrank it: on the
    development logs that warning is the reason of the crash under it (vLLM's own compiled
    extension failing to import, "No platform detected" before the device lookup raises), and
    the exception only its consequence. A warning with no error after it (a startup that waits
    on it, or whose wrapper states no cause) stays a candidate too."""
    known = ("cause",)
    last_fatal = max((h.line.number for h in hits if _states_fatal_error(h, known)), default=0)
    kept = [
        hit
        for hit in hits
        if not (hit.line.level in _GOING_ON_LEVELS and hit.line.number < last_fatal)
    ]
    return kept or hits


def _api_server_errors_outranked(hits: list[Hit]) -> list[Hit]:
    """The candidate failures without the API server's, when the engine core (or a worker)
    recorded its own death: the API server only fronts the engine, and what it logs then is
    its reaction to the death or a request's error; the startup failed of what killed the
    engine (vLLM 0.10.2-0.34.0 vllm/v1/engine/core.py run_engine_core, its logger.exception
    records, the ``death_record`` signal)."""
    engine_died = any(
        hit.entry.kind == "wrapper"
        and hit.line.process
        and not _SIGNALS.api_server_process.match(hit.line.process)
        and _SIGNALS.death_record.search(hit.line.text)
        for hit in hits
    )
    if not engine_died:
        return hits
    kept = [
        hit
        for hit in hits
        if not (
            hit.entry.kind in _STATED
            and hit.line.process
            and _SIGNALS.api_server_process.match(hit.line.process)
        )
    ]
    return kept or hits
