"""The decision: from a log's lines, hits and phases to a state, a failure and a remedy."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from opsbook.knowledge.logscan.catalogue import CatalogueEntry, Hit, entry_with, signals
from opsbook.knowledge.logscan.details import _last_error_detail, _logged_message
from opsbook.knowledge.logscan.diagnosis import (
    FAILED,
    HUNG,
    LOADING,
    NO_CONCLUSION,
    READY,
    LogDiagnosis,
    OomKill,
    RootCause,
)
from opsbook.knowledge.logscan.filters import (
    _after_launch,
    _api_server_errors_outranked,
    _debug_dropped,
    _error_after_progress,
    _optional_import_dropped,
    _served_then_stopped,
    _stop_requested,
    _survived_dropped,
    _teardown_dropped,
    _tool_parser_dropped,
    _warnings_outranked,
)
from opsbook.knowledge.logscan.line_grammar import gib_of_text, number_of_text
from opsbook.knowledge.logscan.log_lines import LineMemo, LogLine, _number_of, read_log_lines
from opsbook.knowledge.logscan.matching import match_catalogue
from opsbook.knowledge.logscan.readiness import (
    _error_before_shutdown,
    _killed_by_signal,
    _ready_line,
    _serving_line,
    _stats_line,
)
from opsbook.knowledge.logscan.remedies import with_release_remedy
from opsbook.knowledge.logscan.root_cause import (
    _chained_cause,
    _engine_loop_death,
    _engine_loop_root,
    _own_record_root,
    _quoted_root,
    _ray_task_cause,
    _report_root_cause,
    _root_cause,
    _root_cause_below,
    _walk_back_start,
)
from opsbook.knowledge.logscan.startup_phases import (
    _first_phases,
    _furthest_phase,
    _phase_events,
    find_version,
    stage_at,
)

_PERSISTENT_STALLS = 3
_SIGNALS = signals()


def parse_backend_reasons(text: str) -> dict[str, list[str]]:
    """Read ``Reasons: {BACKEND: [reason, ...], ...}`` of a "No valid attention backend" line.

    Args:
        text: the error line; a truncated tail keeps the backends that are complete.

    Returns:
        Backend name to its reasons.
    """
    opening = _SIGNALS.reasons_opening.search(text)
    if opening is None:
        return {}
    reasons: dict[str, list[str]] = {}
    for found in _SIGNALS.reasons_item.finditer(text[opening.end() :]):
        reasons[found["backend"]] = _split_reasons(found["reasons"])
    return reasons


def _split_reasons(body: str) -> list[str]:
    # Reasons are joined with ", " but may hold a bracketed list and a ", but got N" clause.
    parts: list[str] = []
    for part in _SIGNALS.reasons_separator.split(body):
        part = part.strip()
        if parts and part.startswith("but "):
            parts[-1] += ", " + part
        elif part:
            parts.append(part)
    return parts


def classify_kernel_log(dmesg_text: str) -> list[OomKill]:
    """Find the processes the kernel's OOM killer ended (``dmesg`` / ``journalctl -k`` text).

    Args:
        dmesg_text: kernel log text.

    Returns:
        One ``OomKill`` per ``Out of memory: Killed process N (name)`` line, in order.
    """
    entry = entry_with("killed_from_outside")
    kills = []
    for hit in match_catalogue(read_log_lines(dmesg_text), [entry]):
        values = _parse_values(entry, [hit.line])
        if "pid" not in values or "process" not in values:
            continue
        kills.append(
            OomKill(
                pid=int(values["pid"]),
                process=str(values["process"]),
                line_no=hit.line.number,
                line=hit.line.raw,
                anon_rss_kb=values.get("anon_rss_kb"),
            )
        )
    return kills


def _diagnose_lines(
    lines: list[LogLine],
    running: bool | None,
    kernel_log: str | None,
    memo: LineMemo | None = None,
    *,
    keep_survived: bool = False,
) -> LogDiagnosis:
    # A "# " line (a pasted report's markdown title) is a comment, never read as the log: the
    # diagnosis reads what the server wrote. With ``keep_survived``, an uncatalogued error the
    # startup went past is still a failure: what a server that became ready had logged.
    diagnosis = _diagnose_body(lines, running, kernel_log, memo or LineMemo(), keep_survived)
    return with_release_remedy(diagnosis, lines)


def _diagnose_body(
    lines: list[LogLine],
    running: bool | None,
    kernel_log: str | None,
    memo: LineMemo,
    keep_survived: bool = False,
) -> LogDiagnosis:
    events = _phase_events(lines, memo)
    found = match_catalogue(lines, memo=memo)
    found = _optional_import_dropped(_tool_parser_dropped(_debug_dropped(found)))
    hits = _after_launch(found, lines)
    if not keep_survived:
        hits = _survived_dropped(hits, events)
    ready_at = max((line.number for line, name in events if name == READY), default=None)
    # The engine's stats lines show it serving: an uncatalogued error after the first one is a
    # request's, as after the startup's end.
    errors = any(hit.entry.kind in ("cause", "wrapper", "generic") for hit in hits)
    stats = _stats_line(lines, errors) if ready_at is None and running is not False else None
    if stats is not None:
        ready_at = stats.number
    furthest = _furthest_phase(events)
    base: dict[str, Any] = {
        "phase": furthest,
        "version": find_version(lines),
        "phases": _first_phases(events, lines),
        "notes": _first_of_each([hit for hit in hits if hit.entry.kind == "note"]),
    }
    stopped = _stop_requested(hits, ready_at)
    if stopped is not None:
        hits = _teardown_dropped(hits, stopped)
    failure = _choose_failure(hits, ready_at)
    if failure:
        failure = _last_error_detail(_logged_message(failure, lines), lines)
        failure = _ray_task_cause(failure, hits)
        if _engine_loop_death([failure], None) is not None:
            failure = Hit(failure.entry, _chained_cause(failure.line, lines), failure.pattern_index)
        diagnosis = _failed(FAILED, failure, hits, events, base)
        if failure.entry.kind == "wrapper" or failure.entry.walks_back:
            start = _walk_back_start(failure, hits)
            root = (
                _own_record_root(lines, hits, start)
                or _root_cause(lines, hits, start, events)
                or _quoted_root(hits, start)
                or _root_cause_below(lines, hits, start)
                or _engine_loop_root(lines, hits, start)
            )
            _report_root_cause(diagnosis, root)
        return diagnosis
    stalls = [hit for hit in hits if hit.entry.kind == "stall"]
    if _stall_is_hang(stalls, lines, events, ready_at):
        return _failed(HUNG, _pick_line(stalls), hits, events, base)
    # A timed wait that is no hang is the startup going on, not a line worth pointing out.
    base["notes"] = base["notes"] + _first_of_each(
        [s for s in stalls if s.entry.hang_after is None]
    )
    if ready_at is not None:
        # A server that came up and was then killed (SIGKILL: the OOM killer, or kill -9) is
        # not ready: the shell's job line or the runtime's exit status ends the log.
        killed = _killed_by_signal(lines) if not running else None
        if killed is not None and killed.number > ready_at:
            entry = entry_with("killed_from_outside")
            return _failed(FAILED, Hit(entry, killed, 0), [], events, base)
        loop_death = _engine_loop_death(hits, ready_at) if stopped is None else None
        if loop_death is not None:
            entry = entry_with("fallback")
            diagnosis = _failed(FAILED, Hit(entry, loop_death, 0), [], events, base)
            _report_root_cause(diagnosis, RootCause(_chained_cause(loop_death, lines), None))
            return diagnosis
        bind_error = _error_before_shutdown(lines, ready_at) if stopped is None else None
        if bind_error is not None:
            entry = entry_with("fallback")
            return _failed(FAILED, Hit(entry, bind_error, 0), [], events, base)
        if stats is not None:
            return _ready(lines, stats.number, base, serving_stats=True, stopped=stopped)
        return _ready(lines, _ready_line(lines, events, ready_at), base, stopped=stopped)
    kills = classify_kernel_log(kernel_log) if kernel_log else []
    if kills:
        return _killed(kills[-1], kernel_log or "", base)
    signalled = _killed_by_signal(lines)
    if signalled is not None and not running:
        entry = entry_with("killed_from_outside")
        return _failed(FAILED, Hit(entry, signalled, 0), [], events, base)
    serving = _serving_line(lines, events) if running is None else None
    if serving is not None:
        return _ready(lines, serving.number, base, listed_routes=True)
    # uvicorn's own shutdown lines with no error: a server (its start cut from the excerpt,
    # or logged as another run) that had served and was stopped.
    served = _served_then_stopped(hits) if not running else None
    if served is not None:
        return _ready(lines, served.line.number, base, stopped=served)
    # A process known to be alive is still starting, whatever it logged.
    logged = _error_after_progress(lines, events) if not running else None
    if logged is not None:
        return _failed(FAILED, Hit(entry_with("fallback"), logged, 0), [], events, base)
    return _unfinished(lines, events, running, base)


def _failed(
    state: str,
    chosen: Hit,
    hits: list[Hit],
    events: list[tuple[LogLine, str]],
    base: dict[str, Any],
) -> LogDiagnosis:
    entry = chosen.entry
    same = [chosen.line] + [h.line for h in hits if h.entry is entry and h.line is not chosen.line]
    numbers = _parse_values(entry, same)
    if entry.stage_numbers is not None:
        stage = stage_at(entry.stage_numbers, events, chosen.line.number)
        if stage:
            numbers[entry.stage_numbers.field] = stage
    if entry.parse_reasons and _SIGNALS.reasons_opening.search(chosen.line.text):
        numbers["reasons"] = parse_backend_reasons(chosen.line.text)
    wrappers = [h.line for h in hits if h.entry.kind == "wrapper"]
    wrapper = wrappers[-1] if wrappers and entry.kind != "wrapper" else None
    for pattern in entry.process_numbers:
        found = pattern.fullmatch(chosen.line.process or "")
        for key, value in found.groupdict().items() if found else ():
            if value is not None and key not in numbers:
                numbers[key] = number_of_text(value)
    return LogDiagnosis(
        state=state,
        failure=entry.failure,
        error_class=entry.error_class,
        title=entry.title,
        severity=entry.severity,
        line=chosen.line,
        wrapper=wrapper,
        remedy=_remedy(entry, numbers),
        source=entry.source,
        numbers=numbers,
        **base,
    )


def _ready(
    lines: list[LogLine],
    ready_at: int,
    base: dict[str, Any],
    *,
    listed_routes: bool = False,
    serving_stats: bool = False,
    stopped: Hit | None = None,
) -> LogDiagnosis:
    line = next(line for line in lines if line.number == ready_at)
    title = "the server finished starting and accepts requests"
    source = (
        "uvicorn uvicorn/lifespan/on.py ('Application startup complete.'); vLLM "
        "vllm/entrypoints/openai/api_server.py serves with uvicorn"
    )
    if serving_stats and (
        _SIGNALS.request_taken.match(line.text) or _SIGNALS.access.match(line.text)
    ):
        title = "the server logs the requests it takes: it is serving"
        source = (
            "vLLM 0.10.2-0.33.0 vllm/entrypoints/logger.py ('Received request %s: ...'), "
            "vllm/v1/engine/async_llm.py ('Added request %s.'); uvicorn's access log"
        )
    elif serving_stats:
        title = "the engine logs its throughput stats: it is serving requests"
        source = (
            "vLLM 0.10.2 vllm/engine/metrics.py and 0.10.2-0.34.0 vllm/v1/metrics/loggers.py "
            "(LoggingStatLogger: 'Avg prompt throughput: ...')"
        )
    if listed_routes:
        title = (
            "the server listed its routes: it is serving (the log ends before uvicorn's "
            "'Application startup complete.')"
        )
    if stopped is not None and stopped.line is line:
        title = "the server had started and served; it was then stopped on purpose"
        source = stopped.entry.source
    elif stopped is not None:
        title += f"; it was then stopped on purpose (line {stopped.line.number})"
    return LogDiagnosis(
        state=READY,
        failure=None,
        title=title,
        severity="ok",
        line=line,
        remedy="Nothing to do: smoke-test it (GET /health, GET /v1/models, one completion).",
        source=source,
        **base,
    )


def _killed(kill: OomKill, kernel_log: str, base: dict[str, Any]) -> LogDiagnosis:
    entry = entry_with("killed_from_outside")
    line = next(line for line in read_log_lines(kernel_log) if line.number == kill.line_no)
    numbers = {"pid": kill.pid, "process": kill.process}
    if kill.anon_rss_kb is not None:
        numbers["anon_rss_kb"] = kill.anon_rss_kb
    return LogDiagnosis(
        state=FAILED,
        failure=entry.id,
        title=entry.title,
        severity=entry.severity,
        line=line,
        remedy=entry.remedy,
        source=entry.source,
        numbers=numbers,
        **base,
    )


def _unfinished(
    lines: list[LogLine],
    events: list[tuple[LogLine, str]],
    running: bool | None,
    base: dict[str, Any],
) -> LogDiagnosis:
    phase = base["phase"]
    notes: list[Hit] = base["notes"]
    line = _stopped_at(lines, events, notes)
    if line is None:
        return LogDiagnosis(
            state=NO_CONCLUSION,
            failure=None,
            title="nothing in this text shows a vLLM startup or a known failure",
            severity="warning",
            line=None,
            remedy="Give the whole server log, from the launch command to its last line.",
            source="vLLM vllm/entrypoints/openai/api_server.py (run_server: the startup sequence)",
            **base,
        )
    if running:
        return LogDiagnosis(
            state=LOADING,
            failure=None,
            title=f"still starting: phase {phase}" if phase else "still starting",
            severity="info",
            line=line,
            remedy="Nothing to do yet: follow the log until 'Application startup complete.'",
            source="vLLM vllm/entrypoints/openai/api_server.py (run_server: the startup sequence)",
            **base,
        )
    if _stops_after_nccl_init(lines, events):
        return _hung_in_nccl_setup(lines, events, line, base)
    suspect = entry_with("killed_from_outside")
    return LogDiagnosis(
        state=NO_CONCLUSION,
        failure=None,
        title=(
            f"the log stops during phase {phase} without an error"
            if phase
            else "the log stops before any startup phase it shows, without an error"
        ),
        severity="warning",
        line=line,
        remedy=(
            "If the server process is still alive it is loading: follow the log. If it is gone "
            f"or makes no progress: {suspect.remedy}"
        ),
        source=suspect.source,
        suspect=suspect.id,
        **base,
    )


def _hung_in_nccl_setup(
    lines: list[LogLine],
    events: list[tuple[LogLine, str]],
    stopped: LogLine,
    base: dict[str, Any],
) -> LogDiagnosis:
    """A startup whose log stops, with no error, once NCCL is being set up: the ranks wait for
    each other in NCCL's first collective (vLLM runs one as it creates its groups: V0
    vllm/distributed/parallel_state.py and 0.10.2-0.34.0 device_communicators/pynccl.py, an
    all-reduce to warm up), where a peer that cannot connect (P2P, shared memory, a network
    interface) makes every rank wait with nothing logged."""
    progress_at = max((line.number for line, _ in events), default=0)
    entry = entry_with("silent_hang_after")
    setup = entry.silent_hang_after
    nccl = [
        line for line in lines if line.number > progress_at and setup and setup.search(line.text)
    ]
    return LogDiagnosis(
        state=HUNG,
        failure=entry.id,
        title="the log stops during NCCL's set-up without an error: the ranks wait on each other",
        severity="error",
        line=nccl[-1] if nccl else stopped,
        remedy=(
            "If the server process is still alive and makes no progress, its ranks are stuck in "
            "NCCL's first collective: dump them with py-spy, rerun with NCCL_DEBUG=INFO. "
            + entry.remedy
        ),
        source=entry.source
        + "; vLLM 0.10.2-0.34.0 vllm/distributed/device_communicators/pynccl.py (warm-up "
        "all-reduce after the communicator is made)",
        suspect=entry.id,
        **base,
    )


def _stopped_at(
    lines: list[LogLine], events: list[tuple[LogLine, str]], notes: list[Hit]
) -> LogLine | None:
    """The line to show for a startup that ends without an error: a note that may explain
    the stop (a benign-looking line worth a look), else where it stopped, its last record.
    That is the last line with a log level (any level: vLLM logs its waits at DEBUG) or a
    later phase line without one (a progress bar); text after it (a reporter's prose, a line
    cut inside its prefix) is not part of the startup. None when the text shows neither a
    startup phase, a note nor a levelled line: it is not a vLLM log."""
    if notes:
        return notes[0].line
    levelled = [line for line in lines if line.level and line.text and not line.is_code]
    candidates = levelled[-1:] + [line for line, _ in events[-1:]]
    return max(candidates, key=_number_of, default=None)


def _choose_failure(hits: list[Hit], ready_at: int | None) -> Hit | None:
    # A server that became ready survived anything before; after it, only catalogue failures
    # count (a request's traceback does not make a serving server failed).
    kinds = ("cause", "wrapper") if ready_at is not None else ("cause", "wrapper", "generic")
    candidates = [
        hit
        for hit in hits
        if hit.entry.kind in kinds and (ready_at is None or hit.line.number > ready_at)
    ]
    # By severity and process first: the catalogue's priority only orders the errors that
    # could have ended the startup.
    candidates = _api_server_errors_outranked(_warnings_outranked(candidates))
    if not candidates:
        return None
    best = max(candidates, key=lambda hit: (hit.entry.priority, -hit.line.number)).entry
    return _pick_line([hit for hit in candidates if hit.entry is best])


def _first_of_each(hits: list[Hit]) -> list[Hit]:
    # Eight ranks print the same note eight times; one is enough to point at.
    seen: dict[str, Hit] = {}
    for hit in hits:
        seen.setdefault(hit.entry.id, hit)
    return list(seen.values())


def _bare_message_line(line: LogLine) -> bool:
    return not (line.exception or line.level or line.timestamp or line.process)


def _pick_line(hits: list[Hit]) -> Hit:
    # The entry's first pattern names its most telling line; among equals, the raised error
    # rather than a message quoting it, then the earliest. A raised exception's line wins
    # over the bare lines of a message (no level, time or process of their own: the lines
    # its multi-line message goes on with, e.g. huggingface_hub's "Cannot access gated repo
    # for url ..." under transformers' "OSError: You are trying to access a gated repo.").
    # An exception line that only states an HTTP status (huggingface_hub's "404 Client
    # Error. (Request ID: ...)", requests' HTTPError) leaves the cause to the lines under it.
    raised = any(
        hit.line.exception and not _SIGNALS.status_only.search(hit.line.text) for hit in hits
    )
    return min(
        hits,
        key=lambda hit: (
            raised and _bare_message_line(hit.line),
            hit.pattern_index,
            bool(_SIGNALS.quotes_original.search(hit.line.text)),
            hit.line.number,
        ),
    )


def _stall_is_hang(
    stalls: list[Hit], lines: list[LogLine], events: list[tuple[LogLine, str]], ready_at: int | None
) -> bool:
    if not stalls or (ready_at is not None and ready_at > stalls[-1].line.number):
        return False
    if stalls[-1].entry.hang_after is not None:
        return _repeated_at_end(stalls[-1].entry, stalls, lines)
    # The log's last record, not a reporter's words under it ("it hangs here forever").
    last_text = next((line for line in reversed(lines) if line.text), None)
    last = _stopped_at(lines, events, []) if last_text is not None and not last_text.level else None
    progress_at = max((line.number for line, _ in events), default=0)
    since_progress = [hit for hit in stalls if hit.line.number > progress_at]
    return (
        stalls[-1].line in (last_text, last)
        or len(since_progress) >= _PERSISTENT_STALLS
        or _only_quoted(stalls, lines, events)
    )


def _repeated_at_end(entry: CatalogueEntry, stalls: list[Hit], lines: list[LogLine]) -> bool:
    """Whether the log's last records are ``entry.hang_after`` or more of this stall in a row
    (a reporter's prose after them aside): the wait went on with nothing else logged."""
    mine = {hit.line.number for hit in stalls if hit.entry is entry}
    records = [line for line in lines if line.text and (line.level or line.number in mine)]
    run = 0
    for line in reversed(records):
        if line.number not in mine:
            break
        run += 1
    return run >= (entry.hang_after or 0)


def _only_quoted(
    stalls: list[Hit], lines: list[LogLine], events: list[tuple[LogLine, str]]
) -> bool:
    """A report that quotes only the stall message, in prose: no line of the text carries a
    log level and no startup progress is shown, so the stall is all the log there is."""
    return not events and not any(line.level for line in lines) and bool(stalls)


def _stops_after_nccl_init(lines: list[LogLine], events: list[tuple[LogLine, str]]) -> bool:
    progress_at = max((line.number for line, _ in events), default=0)
    setup = entry_with("silent_hang_after").silent_hang_after
    return any(setup and setup.search(line.text) for line in lines if line.number > progress_at)


def _parse_values(entry: CatalogueEntry, lines: Sequence[LogLine]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for line in lines:
        for pattern in entry.patterns + entry.parse:
            found = pattern.search(line.text)
            if not found:
                continue
            for key, value in found.groupdict().items():
                if value is not None and key not in values:
                    values[key] = number_of_text(value)
                    gib = gib_of_text(value)
                    if gib is not None:
                        values[f"{key}_gib"] = gib
    return values


def _remedy(entry: CatalogueEntry, numbers: dict[str, Any]) -> str:
    if entry.remedy_parsed:
        try:
            return entry.remedy_parsed.format(**numbers)
        except KeyError:
            pass
    return entry.remedy
