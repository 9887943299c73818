"""What shows a server up and serving, or killed from outside, without the startup's end."""

from __future__ import annotations

import re

from opsbook.knowledge.logscan.diagnosis import READY
from opsbook.knowledge.logscan.line_grammar import _NOT_A_CAUSE
from opsbook.knowledge.logscan.log_lines import LogLine
from opsbook.knowledge.logscan.startup_phases import _furthest_phase

_SIGKILL = re.compile(
    r"^(?:\[\d+\]\+?\s+)?Killed\b|^\S+: line \d+: +\d+ Killed\b|^zsh: killed\b"
    r"|exited with code 137\b|\bExited \(137\)|exit code:? 137\b"
    r"|killed by the OOM killer|Failed with result 'oom-kill'|code=killed, status=9/KILL"
    r"|\bOOMKilled\b"
)

# Lines a reporter writes under the shell's "Killed" (a question, a remark) are no record of
# the server: a few of them may follow the kill.
_AFTER_KILL_LINES = 3
# The other processes of the server warn as they exit once the API server is gone: torch's
# ProcessGroupNCCL ("Warning: WARNING: destroy_process_group() was not called before program
# exit"), Python's multiprocessing resource_tracker ("UserWarning: resource_tracker: There
# appear to be %d leaked semaphore objects"). Such a warning is no sign the server lived on.
_EXIT_WARNING = re.compile(r"\bWarning: |^warnings\.warn\(")


def _killed_by_signal(lines: list[LogLine]) -> LogLine | None:
    """The last line with text, when it says the server was killed (and nothing failed); or
    such a line followed only by a few lines no process logged (no level, time, process
    prefix, exception or code) or warnings of processes exiting: after SIGKILL the server
    writes nothing more."""
    tail = [line for line in lines[-50:] if line.text]
    for line in reversed(tail[-(_AFTER_KILL_LINES + 1) :]):
        if _SIGKILL.search(line.text):
            return line
        if _exit_warning(line):
            continue
        if line.level or line.timestamp or line.process or line.exception or line.is_code:
            return None
    return None


def _exit_warning(line: LogLine) -> bool:
    return line.level not in ("ERROR", "CRITICAL") and bool(_EXIT_WARNING.search(line.text))


# uvicorn logs both once the app has started (lifespan "Application startup complete.", then
# "Uvicorn running on ..."); the first says the application is ready.
_STARTUP_COMPLETE = re.compile(r"Application startup complete")
# vLLM lists its routes (vllm/entrypoints/launcher.py serve_http) after the engine is up and
# just before uvicorn serves them; "Starting vLLM (API) server ... on" names the address
# (vllm/entrypoints/openai/api_server.py).
_ROUTES = re.compile(r"^(?:Available routes are|Route: /)")
# launcher.py serve_http: logger.info("Route: %s, Methods: %s", path, ", ".join(methods)).
_WHOLE_ROUTE = re.compile(r"^Route: /\S*, Methods: [A-Z]")
# The product's name may be a reporter's redaction ("Starting v<HOST> server on").
_SERVER_ADDRESS = re.compile(r"Starting \S+ (?:API )?server(?: \d+)? on ")


def _ready_line(lines: list[LogLine], events: list[tuple[LogLine, str]], ready_at: int) -> int:
    # The last "Application startup complete." of the final ready lines, else the last one.
    ready = [line for line, name in events if name == READY]
    complete = [line for line in ready if _STARTUP_COMPLETE.search(line.text)]
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
    if last_text is None or not _ROUTES.match(last_text.text):
        return None
    address = [line for line in http if _SERVER_ADDRESS.search(line.text)]
    routes = [line for line in http if _ROUTES.match(line.text)]
    # A route line the excerpt cut ("Route: /") states nothing: the last whole one does.
    whole = [line for line in routes if _WHOLE_ROUTE.search(line.text)]
    return (address or whole or routes)[-1]


# The engine's periodic stats line: vLLM 0.10.2 vllm/engine/metrics.py (V0 LoggingStatLogger)
# and 0.10.2-0.34.0 vllm/v1/metrics/loggers.py (LoggingStatLogger.log): "Avg prompt
# throughput: %.1f tokens/s, Avg generation throughput: %.1f tokens/s, Running: %d reqs, ...".
# The engine logs it only once it schedules requests, i.e. it is serving.
_STATS = re.compile(
    r"Avg prompt throughput: (?P<prompt>[\d.]+) tokens/s, "
    r"Avg generation throughput: (?P<generation>[\d.]+) tokens/s"
)


# The server's record of a request it took: vLLM 0.10.2 vllm/entrypoints/logger.py
# (RequestLogger.log_inputs: "Received request %s: prompt: %r, ..."), 0.18.0-0.33.0
# vllm/entrypoints/logger.py and vllm/entrypoints/serve/utils/request_logger.py ("Received
# request %s: params: %s, ..."); the engine's, once it queued one: 0.10.2 vllm/engine/
# async_llm_engine.py and multiprocessing/engine.py, 0.10.2-0.34.0 vllm/v1/engine/async_llm.py
# (logger.info("Added request %s.", request_id)). Only a server that is up logs either.
_REQUEST_TAKEN = re.compile(r"^(?:Received request \S+: (?:prompt|params): |Added request \S+\.$)")
# uvicorn's access log line, written once the app answered a request, so once its startup
# completed (uvicorn 0.55.0 uvicorn/protocols/http/h11_impl.py and httptools_impl.py:
# '%s - "%s %s HTTP/%s" %d').
_ACCESS = re.compile(r'^\S+:\d+ - "[A-Z]+ /\S* HTTP/[\d.]+" \d{3}\b')


# An access line of a request the app answered with success: a POST (the generating
# endpoints are POSTs; a GET of /metrics or /v1/models is answered without the engine).
_ANSWERED = re.compile(r'^\S+:\d+ - "POST /\S* HTTP/[\d.]+" 2\d\d\b')


# A program that runs vLLM's engine logs each generation it finished: Xinference 1.7.1.post1
# xinference/model/llm/vllm/core.py ("Generate finished, request_id: %s, stop reason: %s, ...").
_GENERATION_FINISHED = re.compile(r"^Generate finished, request_id: \S+, stop reason: ")


def _tokens_through(line: LogLine) -> bool:
    """A stats line with tokens going through (an idle one logs 0.0 tokens/s for both), or a
    generation logged as finished."""
    if _GENERATION_FINISHED.match(line.text):
        return True
    stats = _STATS.search(line.text)
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
    first_stats = next((line for line in lines if _STATS.search(line.text)), None)
    answered = (
        None if errors else next((line for line in lines if _ANSWERED.match(line.text)), None)
    )
    shown = [line for line in (first_stats, answered) if line is not None]
    if shown:
        return min(shown, key=lambda line: line.number)
    taken = next((line for line in lines if _REQUEST_TAKEN.match(line.text)), None)
    if taken is not None or errors:
        return taken
    return next((line for line in lines if _ACCESS.match(line.text)), None)


# uvicorn binds the port after the lifespan startup (uvicorn 0.55.0 uvicorn/server.py
# Server.startup, after "Application startup complete."): on an OSError it logs the error
# (asyncio base_events.py create_server: "error while attempting to bind on address %r: %s")
# at ERROR, then shuts the lifespan down ("Waiting for application shutdown."): never serving.
_SHUTDOWN = re.compile(r"Waiting for application shutdown|Application shutdown complete")


def _error_before_shutdown(lines: list[LogLine], ready_at: int) -> LogLine | None:
    """An ERROR line after the last "Application startup complete." that the application's
    shutdown follows: the server never served."""
    shutdown_at = next(
        (line.number for line in lines if line.number > ready_at and _SHUTDOWN.search(line.text)),
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
