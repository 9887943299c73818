"""The line that says what failed when the error's own line does not."""

from __future__ import annotations

from dataclasses import replace

from opsbook.knowledge.logscan.catalogue import Hit, _catalogue, signals
from opsbook.knowledge.logscan.line_grammar import _NOT_A_CAUSE, _TRACEBACK
from opsbook.knowledge.logscan.log_lines import LogLine, _position
from opsbook.knowledge.logscan.matching import _first_matching

_SIGNALS = signals()


def _logged_message(chosen: Hit, lines: list[LogLine]) -> Hit:
    """For a generic traceback line, the ERROR line just before it that carries the
    message (same process), when there is one."""
    if chosen.entry.kind != "generic":
        return chosen
    asserted = _detail_line(chosen.line, lines)
    if asserted is not None:
        return replace(chosen, line=asserted)
    if not _TRACEBACK.match(chosen.line.text):
        return _record_message(chosen, lines)
    index = _position(lines, chosen.line)
    before = next((line for line in reversed(lines[:index]) if line.text), None)
    if (
        before is not None
        and before.level in ("ERROR", "CRITICAL")
        and before.process == chosen.line.process
        and not before.is_code
        and not _NOT_A_CAUSE.match(before.text)
    ):
        return replace(chosen, line=before)
    return chosen


_CANN_DETAIL_LINES = 4


def _cann_coded_detail(chosen: Hit, lines: list[LogLine]) -> Hit:
    index = _position(lines, chosen.line)
    for line in lines[index + 1 : index + 1 + _CANN_DETAIL_LINES]:
        if line.process != chosen.line.process or line.is_code:
            continue
        if _SIGNALS.cann_coded.match(line.text):
            coded = replace(chosen, line=line)
            return (
                _last_error_detail(coded, lines)
                if _SIGNALS.cann_inner_error.match(line.text)
                else coded
            )
    return chosen


def _last_error_detail(chosen: Hit, lines: list[LogLine]) -> Hit:
    """For an NCCL error followed by "Last error:", the line under it: ncclGetLastError()'s
    text names the call that failed and the peer (vLLM 0.34.0
    vllm/distributed/device_communicators/pynccl_wrapper.py NCCL_CHECK: f"NCCL error:
    {error_str}\nLast error:\n{last_error}"; PyTorch's ProcessGroupNCCL adds the same), while
    the error's own line is only the ncclResult_t's name.

    Likewise for Ascend CANN's inner error (ReportInnerErrMsg: the code's header "EZ9999: Inner
    Error!", its message on the indented line under it): the header says nothing of its own."""
    if _SIGNALS.cann_inner_error.match(chosen.line.text):
        index = _position(lines, chosen.line)
        detail = next((line for line in lines[index + 1 : index + 3] if line.text), None)
        if (
            detail is not None
            and not detail.is_code
            and not _SIGNALS.cann_inner_error.match(detail.text)
        ):
            return replace(chosen, line=detail)
        return chosen
    if _SIGNALS.npu_ops_error.search(chosen.line.text):
        return _cann_coded_detail(chosen, lines)
    under = chosen.entry.detail_under
    if under is None:
        return chosen
    index = _position(lines, chosen.line)
    after = [line for line in lines[index + 1 : index + 1 + under.within] if line.text]
    if len(after) >= 2 and under.marker.match(after[0].text) and not after[1].is_code:
        return replace(chosen, line=after[1])
    return chosen


_VALIDATION_DETAIL_LINES = 3


def _validation_detail(line: LogLine, lines: list[LogLine]) -> LogLine | None:
    """For pydantic's header of a validation error, its first error's message line: the header
    only counts the errors, the message under it states the cause."""
    if not _SIGNALS.validation_header.search(line.text):
        return None
    index = _position(lines, line)
    below = [
        each
        for each in lines[index + 1 : index + 1 + 2 * _VALIDATION_DETAIL_LINES]
        if each.process == line.process
    ]
    for each in below[:_VALIDATION_DETAIL_LINES]:
        if not each.is_code and _SIGNALS.validation_detail.match(each.text):
            return each
    return None


def _detail_line(line: LogLine, lines: list[LogLine]) -> LogLine | None:
    """The line that says what failed when the error's own line does not."""
    return _asserted_line(line, lines) or _validation_detail(line, lines)


def _asserted_line(line: LogLine, lines: list[LogLine]) -> LogLine | None:
    """For a bare ``AssertionError`` (an ``assert`` without a message: Python prints only the
    name), the failed ``assert`` statement its traceback shows just above: the only words
    that say what failed."""
    if line.text.rstrip(": ") != "AssertionError":
        return None
    index = _position(lines, line)
    for other in reversed(lines[max(index - 4, 0) : index]):
        if other.text.startswith("assert "):
            return other
    return None


def _record_message(chosen: Hit, lines: list[LogLine]) -> Hit:
    """For an exception line inside one logged record (vLLM's formatter prefixes every line of
    ``logger.error(msg, exc_info=True)`` / ``logger.exception(msg)`` with the same level and
    time), the record's message line above its traceback: the program's statement of what
    failed, the exception being how."""
    if chosen.line.level not in ("ERROR", "CRITICAL") or chosen.line.timestamp is None:
        return chosen
    index = _position(lines, chosen.line)
    record = [
        i
        for i in range(index)
        if lines[i].level == chosen.line.level
        and lines[i].timestamp == chosen.line.timestamp
        and lines[i].process == chosen.line.process
    ]
    start = next((i for i in record if _TRACEBACK.match(lines[i].text)), None)
    if start is None or start - 1 not in record:
        return chosen
    message = lines[start - 1]
    # A handler's constant words ("EngineCore encountered a fatal error.", a wrapper) say less
    # than the exception; a message that names what failed ('LlamaForCausalLM') says more.
    wrappers = (entry for entry in _catalogue() if entry.kind == "wrapper")
    if (
        not message.is_code
        and not message.exception
        and _SIGNALS.names_a_value.search(message.text)
        and not _NOT_A_CAUSE.match(message.text)
        and not any(_first_matching(entry, message.text) is not None for entry in wrappers)
    ):
        return replace(chosen, line=message)
    return chosen
