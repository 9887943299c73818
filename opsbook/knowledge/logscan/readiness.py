"""What shows a server up and serving, or killed from outside, without the startup's end."""

from __future__ import annotations

from opsbook.knowledge.logscan.catalogue import entry_with, signals
from opsbook.knowledge.logscan.diagnosis import READY
from opsbook.knowledge.logscan.line_grammar import _NOT_A_CAUSE
from opsbook.knowledge.logscan.log_lines import LogLine
from opsbook.knowledge.logscan.startup_phases import _furthest_phase

_SIGNALS = signals()

# Lines a reporter writes under the shell's "Killed" (a question, a remark) are no record of
# the server: a few of them may follow the kill.
_AFTER_KILL_LINES = 3


def _killed_by_signal(lines: list[LogLine]) -> LogLine | None:
    """The last line with text, when it says the server was killed (and nothing failed); or
    such a line followed only by a few lines no process logged (no level, time, process
    prefix, exception or code) or warnings of processes exiting: after SIGKILL the server
    writes nothing more."""
    signals_of_kill = entry_with("killed_from_outside").signal_lines
    tail = [line for line in lines[-50:] if line.text]
    for line in reversed(tail[-(_AFTER_KILL_LINES + 1) :]):
        if any(signal.search(line.text) for signal in signals_of_kill):
            return line
        if _exit_warning(line):
            continue
        if line.level or line.timestamp or line.process or line.exception or line.is_code:
            return None
    return None


def _exit_warning(line: LogLine) -> bool:
    return line.level not in ("ERROR", "CRITICAL") and bool(_SIGNALS.exit_warning.search(line.text))


def _ready_line(lines: list[LogLine], events: list[tuple[LogLine, str]], ready_at: int) -> int:
    # The last "Application startup complete." of the final ready lines, else the last one.
    ready = [line for line, name in events if name == READY]
    complete = [line for line in ready if _SIGNALS.startup_complete.search(line.text)]
    last_start = max((line.number for line, name in events if name != READY), default=0)
    final = [line for line in complete if line.number > last_start]
    return final[-1].number if final else ready_at


def _serving_line(lines: list[LogLine], events: list[tuple[LogLine, str]]) -> LogLine | None:
    """For a log that ends in vLLM's route list with no error: the line that says where it
    serves (or the route list's head). vLLM builds the engine client and the app before
    serve_http lists the routes, and V1 binds the socket before it builds the engine
    (vllm/entrypoints/openai/api_server.py run_server: create_server_socket, then
    build_async_engine_client; vllm/entrypoints/launcher.py serve_http: the route list, then
    uvicorn's serve), so what is left is uvicorn's own start; an excerpt often stops here, with
    or without the startup above it (a fragment of routes is the same evidence)."""
    http = [line for line, name in events if name == "http"]
    if not http or _furthest_phase(events) != "http":
        return None
    last_text = _last_record(lines)
    if last_text is None or not _SIGNALS.routes.match(last_text.text):
        return None
    address = [line for line in http if _SIGNALS.server_address.search(line.text)]
    routes = [line for line in http if _SIGNALS.routes.match(line.text)]
    # A route line the excerpt cut ("Route: /") states nothing: the last whole one does.
    whole = [line for line in routes if _SIGNALS.whole_route.search(line.text)]
    return (address or whole or routes)[-1]


def _tokens_through(line: LogLine) -> bool:
    """A stats line with tokens going through (an idle one logs 0.0 tokens/s for both), or a
    generation logged as finished."""
    if _SIGNALS.generation_finished.match(line.text):
        return True
    stats = _SIGNALS.stats.search(line.text)
    return stats is not None and (float(stats["prompt"]) > 0 or float(stats["generation"]) > 0)


def _stats_line(lines: list[LogLine], errors: bool = False) -> LogLine | None:
    """The line that shows the server serving, for an excerpt of a serving engine, which often
    holds no startup's end: the first stats line with tokens going through or generation
    logged as finished; else the first of an idle stats line and (in a log with no error) a
    POST answered with success; else the first of the engine's records of requests taken.
    Else, in a log with no error, uvicorn's first access line (with errors, the API server
    answers requests also when its engine is dead: the answer says nothing of the engine)."""
    through = next((line for line in lines if _tokens_through(line)), None)
    if through is not None:
        return through
    first_stats = next((line for line in lines if _SIGNALS.stats.search(line.text)), None)
    answered = (
        None
        if errors
        else next((line for line in lines if _SIGNALS.answered.match(line.text)), None)
    )
    shown = [line for line in (first_stats, answered) if line is not None]
    if shown:
        return min(shown, key=lambda line: line.number)
    taken = next((line for line in lines if _SIGNALS.request_taken.match(line.text)), None)
    if taken is not None or errors:
        return taken
    return next((line for line in lines if _SIGNALS.access.match(line.text)), None)


def _error_before_shutdown(lines: list[LogLine], ready_at: int) -> LogLine | None:
    """An ERROR line after the last "Application startup complete." that the application's
    shutdown follows: the server never served."""
    shutdown_at = next(
        (
            line.number
            for line in lines
            if line.number > ready_at and _SIGNALS.shutdown.search(line.text)
        ),
        None,
    )
    if shutdown_at is None:
        return None
    return next(
        (
            line
            for line in lines
            if ready_at < line.number < shutdown_at
            and line.level in ("ERROR", "CRITICAL")
            and line.text
            and not _NOT_A_CAUSE.match(line.text)
        ),
        None,
    )


def _last_record(lines: list[LogLine]) -> LogLine | None:
    """The log's last record: in a log whose lines carry a level, the last such line, so that
    an excerpt cut in the middle of a line's prefix ("INFO 05-13 14") or followed by the
    quoting page's prose ends where the log does; otherwise the last line with text."""
    with_text = [line for line in lines if line.text]
    levelled = [line for line in with_text if line.level]
    chosen = levelled or with_text
    return chosen[-1] if chosen else None


# logger.exception(msg) and vLLM's engine core log the message first, then the traceback.
