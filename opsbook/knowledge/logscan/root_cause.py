"""The wrapper-to-root-cause walk: from a wrapper error back to the failed process's first error."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator, Sequence

from opsbook.knowledge.logscan.catalogue import (
    CatalogueEntry,
    Hit,
    entry_by_id,
    entry_with,
    signals,
)
from opsbook.knowledge.logscan.details import _detail_line
from opsbook.knowledge.logscan.diagnosis import LogDiagnosis, RootCause
from opsbook.knowledge.logscan.line_grammar import (
    _EXCEPTION_LINE,
    _FRAME,
    _NOT_A_CAUSE,
    _TRACEBACK,
    exception_line_of,
)
from opsbook.knowledge.logscan.log_lines import LogLine, _number_of, _position

_SIGNALS = signals()


def _root_cause(
    lines: list[LogLine],
    hits: list[Hit],
    wrapper: LogLine,
    events: Sequence[tuple[LogLine, str]] = (),
) -> RootCause | None:
    """Walk back from the wrapper to the first error of the failed process.

    The first error is the first exception line (a traceback's last line), ``ERROR`` line
    or NCCL ``WARN`` line before the wrapper that is not itself a wrapper; a worker's or
    engine core's error comes before the API server's (which only reports that its engine
    died).
    """
    wrapper_lines = {h.line.number for h in hits if h.entry.kind == "wrapper"}
    wrapper_lines |= {h.line.number for h in hits if h.entry.walks_back}
    # A line the catalogue names as a cause or an error is one whatever its form (a
    # linker's "ld: cannot find -lcuda", NCCL's and the kernel's lines).
    named = {h.line.number for h in hits if h.entry.kind in ("cause", "generic")}
    own = _wrapper_record(lines, wrapper)
    candidates = [
        line
        for line in lines
        if line.number < wrapper.number
        and line.number not in wrapper_lines
        and line.number not in own
        and not line.is_code
        and not _NOT_A_CAUSE.match(line.text)
        and not _SIGNALS.state_dump.match(line.text)
        and (line.number in named or _is_error_line(line))
    ]
    candidates = _not_gone_past(candidates, events, wrapper)
    # An optional extension's refused import was gone past (vLLM imports it as an option).
    required = [line for line in candidates if not _SIGNALS.optional_extension.search(line.text)]
    candidates = required or candidates
    if not candidates:
        return None
    others = [
        line for line in candidates if not _SIGNALS.api_server_process.match(line.process or "")
    ]
    first = (others or candidates)[0]
    best = _best_cause(hits, first)
    exception = _exception_of_record(first, lines)
    if exception is not None:
        first = exception
        best = _best_cause(hits, first)
    return RootCause(_detail_line(first, lines) or first, best)


def _not_gone_past(
    candidates: list[LogLine], events: Sequence[tuple[LogLine, str]], wrapper: LogLine
) -> list[LogLine]:
    """The candidates without the errors their own process went past: a startup phase it
    logged after the error and before the wrapper shows the error did not stop it (a handled
    error, an optional import), so the process failed later, of something else."""
    progress: dict[str | None, list[int]] = {}
    for line, _ in events:
        if line.number < wrapper.number:
            progress.setdefault(line.process, []).append(line.number)
    kept = []
    for line in candidates:
        numbers = progress.get(line.process, [])
        later = bisect_left(numbers, line.number + 1)
        if later < len(numbers) and numbers[later] < wrapper.number:
            continue
        kept.append(line)
    return kept


def _exception_of_record(message: LogLine, lines: list[LogLine]) -> LogLine | None:
    """For the message of a ``logger.exception`` record (the traceback follows it with the
    same level, time and process) that names nothing ("EngineCore encountered a fatal error.",
    vLLM 0.10.2-0.34.0 vllm/v1/engine/core.py), the record's first exception line: the error
    itself, the message being only where it was caught."""
    if message.exception or message.level is None or _SIGNALS.names_a_value.search(message.text):
        return None
    key = (message.level, message.timestamp, message.process)
    index = _position(lines, message)
    record = []
    for line in lines[index + 1 :]:
        if (line.level, line.timestamp, line.process) != key:
            break
        record.append(line)
    if not record or not _TRACEBACK.match(record[0].text):
        return None
    return next(
        (line for line in record if not line.is_code and _EXCEPTION_LINE.match(line.text)), None
    )


def _wrapper_record(lines: list[LogLine], wrapper: LogLine) -> set[int]:
    """The lines of the logged record that ends in the wrapper: ``logger.exception(msg)``
    prefixes its message and every line of the traceback with the same level, time and
    process (vLLM 0.10.2-0.34.0 vllm/v1/engine/async_llm.py output_handler: "AsyncLLM
    output_handler failed." above the EngineDeadError). Its message only says which handler
    caught the wrapper; it is no error of the failed process. Empty when the record holds
    another exception (a chained one is a cause) or no traceback."""
    if wrapper.level not in ("ERROR", "CRITICAL") or wrapper.timestamp is None:
        return set()
    index = _position(lines, wrapper)
    record: list[LogLine] = []
    for line in reversed(lines[:index]):
        same = (line.level, line.timestamp, line.process) == (
            wrapper.level,
            wrapper.timestamp,
            wrapper.process,
        )
        if not same:
            break
        if line.exception or _EXCEPTION_LINE.match(line.text):
            return set()
        record.append(line)
        if _TRACEBACK.match(line.text):
            break
    else:
        return set()
    if not record or not _TRACEBACK.match(record[-1].text):
        return set()
    above = lines[index - len(record) - 1] if index - len(record) - 1 >= 0 else None
    own = {line.number for line in record}
    if above is not None and (above.level, above.timestamp, above.process) == (
        wrapper.level,
        wrapper.timestamp,
        wrapper.process,
    ):
        own.add(above.number)
    return own


def _root_cause_below(lines: list[LogLine], hits: list[Hit], wrapper: LogLine) -> RootCause | None:
    """With no error of the failed process above a startup wrapper, the first exception below
    it: the failed process writes its traceback to the same terminal as the API server, and
    two processes' output interleaves (a reporter also often pastes the process's own error
    under the wrapper's). Only below a wrapper of the startup, when no request is in flight
    (below a dead engine's wrapper while serving, the requests' cancellations follow), and
    only an exception line (ERROR lines below a wrapper are the shutdown's)."""
    if not _SIGNALS.startup_wrapper.search(wrapper.text):
        return None
    wrapper_lines = {h.line.number for h in hits if h.entry.kind == "wrapper"}
    wrapper_lines |= {h.line.number for h in hits if h.entry.walks_back}
    for line in lines:
        if (
            line.number > wrapper.number
            and line.number not in wrapper_lines
            and not line.is_code
            and bool(_EXCEPTION_LINE.match(line.text))
            and not _SIGNALS.api_server_process.match(line.process or "")
        ):
            best = _best_cause(hits, line)
            return RootCause(line, best)
    return None


def _chained_cause(record: LogLine, lines: list[LogLine]) -> LogLine:
    """The first exception of the traceback that ``record`` (the engine loop's repr of its
    error) logs under it, when it is another one: logger.exception prints a chained
    exception's cause first (CPython traceback.format_exception: the cause, then "The above
    exception was the direct cause of the following exception:"), e.g. the ValueError under
    vLLM's RuntimeError("Loading lora ... failed") (vLLM 0.10.2 vllm/lora/worker_manager.py).
    The record's lines share its level, time and process (:func:`_record_lines`)."""
    for line in _record_lines(record, lines):
        if line.exception and not line.is_code:
            return line if line.text != record.text else record
    return record


def _record_lines(record: LogLine, lines: list[LogLine]) -> Iterator[LogLine]:
    """The lines after ``record`` that go on with it: its level, time and process (other
    processes' lines interleaved with them skipped: several workers' tracebacks often are)."""
    key = (record.level, record.timestamp, record.process)
    index = _position(lines, record)
    for line in lines[index + 1 :]:
        if record.process is not None and line.process not in (None, record.process):
            continue
        if (line.level, line.timestamp, line.process) != key:
            return
        yield line


def _ray_task_cause(failure: Hit, hits: list[Hit]) -> Hit:
    """For Ray's RayTaskError(X) header, the exception line X of the task's traceback under
    it (the first such line hit after it), which states the error."""
    header = _SIGNALS.ray_task_header.search(failure.line.text)
    if header is None:
        return failure
    cause = exception_line_of(header["cause"])
    line = next(
        (
            hit.line
            for hit in hits
            if hit.line.number > failure.line.number
            and hit.line.exception
            and cause.match(hit.line.text)
        ),
        None,
    )
    return failure if line is None else Hit(failure.entry, line, failure.pattern_index)


def _engine_loop_death(hits: list[Hit], after: int | None) -> LogLine | None:
    """The first record of V0's engine loop ending on an error, after line ``after``: among
    the exception lines already hit, an ERROR record of engine.py whose message is a repr."""
    return next(
        (
            hit.line
            for hit in hits
            if hit.line.exception
            and hit.line.level in ("ERROR", "CRITICAL")
            and (after is None or hit.line.number > after)
            and _SIGNALS.engine_loop_death.search(hit.line.raw)
        ),
        None,
    )


def _engine_loop_root(lines: list[LogLine], hits: list[Hit], wrapper: LogLine) -> RootCause | None:
    """Under V0's MQEngineDeadError, the engine loop's own record of its error, wherever it
    is: the API server's wrapper and the engine's record are two processes' output and
    interleave (the wrapper often comes first)."""
    if not _SIGNALS.engine_loop_dead.search(wrapper.text):
        return None
    death = _engine_loop_death(hits, None)
    if death is None:
        return None
    line = _chained_cause(death, lines)
    best = _best_cause(hits, line)
    return RootCause(line, best)


def _best_cause(hits: list[Hit], line: LogLine) -> CatalogueEntry | None:
    """The highest-priority cause entry hit on ``line``, if any."""
    causes = [hit.entry for hit in hits if hit.line is line and hit.entry.kind == "cause"]
    return max(causes, key=lambda entry: entry.priority) if causes else None


def _own_record_root(lines: list[LogLine], hits: list[Hit], wrapper: LogLine) -> RootCause | None:
    """For an engine core's record of its death, the exception that closes the record: the
    lines after it with its level, time and process (other processes' lines interleaved with
    them skipped: several workers' tracebacks often are). Nothing when an excerpt cuts the
    record before its exception (the wrapper is then all the log shows)."""
    if not _SIGNALS.death_record.search(wrapper.text) or wrapper.level is None:
        return None
    record = list(_record_lines(wrapper, lines)) or _unprefixed_traceback(wrapper, lines)
    for line in record:
        if not line.is_code and _EXCEPTION_LINE.match(line.text):
            best = _best_cause(hits, line)
            return RootCause(_detail_line(line, lines) or line, best)
    return None


def _unprefixed_traceback(record: LogLine, lines: list[LogLine]) -> list[LogLine]:
    """The traceback right under a record's message when its lines carry no prefix: vLLM's
    formatter prefixes each line of a record (vLLM 0.32.0 vllm/logging_utils/formatter.py
    NewLineFormatter), but with VLLM_CONFIGURE_LOGGING=0 (vllm/envs.py, vllm/logger.py) a
    harness's handler formats it, and Python's logging.Formatter appends the traceback bare
    (CPython 3.11 Lib/logging/__init__.py Formatter.format). It starts with the traceback's
    header or a frame (a reporter's paste may elide lines with "..."), and ends where a
    prefixed line begins."""
    index = _position(lines, record)
    following: list[LogLine] = []
    for line in lines[index + 1 :]:
        if line.level is not None or line.process is not None:
            break
        following.append(line)
    opening = next((line for line in following if line.text.strip() != "..."), None)
    if opening is None or not (_TRACEBACK.match(opening.text) or _FRAME.match(opening.raw)):
        return []
    return following


def _walk_back_start(failure: Hit, hits: list[Hit]) -> LogLine:
    if failure.entry.walks_back:
        # Ray's message runs over several lines: walk back from its first one.
        return min((h.line for h in hits if h.entry is failure.entry), key=_number_of)
    # From the last wrapper line: vLLM's engine core logs "EngineCore failed to start." above
    # its traceback, so in an excerpt cut before the API server's final wrapper the error
    # lies between the wrappers.
    return max((h.line for h in hits if h.entry.kind == "wrapper"), key=_number_of)


def _quoted_root(hits: list[Hit], start: LogLine) -> RootCause | None:
    """A wrapper line that quotes the failed process's error (``Worker failed with error
    '...'``) is the root cause when no error of that process is in the log before it."""
    for hit in hits:
        if hit.entry.kind != "wrapper" or hit.line.number > start.number:
            continue
        found = hit.entry.patterns[hit.pattern_index].search(hit.line.text)
        if found and found.groupdict().get("error"):
            return RootCause(hit.line, None)
    return None


def _is_error_line(line: LogLine) -> bool:
    text = line.text
    if not text or _NOT_A_CAUSE.match(text):
        return False
    return (
        line.exception
        or bool(_EXCEPTION_LINE.match(text))
        or line.level in ("ERROR", "CRITICAL")
        or "NCCL WARN" in text
    )


def _report_root_cause(diagnosis: LogDiagnosis, root: RootCause | None) -> None:
    wrapper = diagnosis.line
    if root is None and wrapper is not None and _SIGNALS.death_record.search(wrapper.text):
        # The line is the failed process's own record of its exception: it was not killed
        # from outside, the excerpt only stops before the exception.
        diagnosis.remedy = (
            "This line is the failed process's own record of its error; the log stops before "
            "the exception under it. " + diagnosis.remedy
        )
        return
    if root is None:
        diagnosis.remedy = (
            "No error of the failed process is in this log before the wrapper: it was killed "
            "from outside (check `dmesg -T` for the OOM killer) or it wrote elsewhere (a "
            "worker's own log, Ray's logs under /tmp/ray/session_latest/logs). " + diagnosis.remedy
        )
        return
    where = f"line {root.line.number}" + (f", {root.line.process}" if root.line.process else "")
    diagnosis.wrapper = wrapper
    diagnosis.line = root.line
    diagnosis.root_cause = root.line
    raised_in_constructor = bool(_SIGNALS.creation_task.search(wrapper.text)) if wrapper else False
    if root.entry is not None:
        if raised_in_constructor or not (root.entry.family and _walks_back(diagnosis.failure)):
            # A known class outside the shared ids counts as an uncatalogued error: under a
            # Ray death the node or actor loss keeps its class (as below).
            diagnosis.failure = root.entry.failure
        diagnosis.error_class = root.entry.error_class
        diagnosis.title = root.entry.title
        diagnosis.remedy = root.entry.remedy
        diagnosis.source = root.entry.source
        return
    if diagnosis.failure and (
        entry_by_id(diagnosis.failure).kind == "wrapper" or raised_in_constructor
    ):
        # The log shows the root error and the catalogue does not know it: an unrecognised
        # error (engine-dead is a wrapper with no error of the failed process above it). A
        # Ray death keeps its class: the node or actor loss is itself the finding.
        diagnosis.failure = entry_with("fallback").id
    diagnosis.title = f"the process died; its first error ({where}): {root.line.text}"
    diagnosis.remedy = (
        f"The root cause is the first error of the failed process ({where}): "
        f"{root.line.text!r}. It is not in opsbook's catalogue: read its traceback and search "
        "the vLLM issues for it."
    )


def _walks_back(failure: str | None) -> bool:
    """Whether the failure's class only says a process died (its ``walks_back``)."""
    return failure is not None and entry_by_id(failure).walks_back
