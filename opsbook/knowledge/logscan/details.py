"""The line that says what failed when the error's own line does not."""

from __future__ import annotations

import re
from dataclasses import replace

from opsbook.knowledge.logscan.catalogue import Hit, _catalogue
from opsbook.knowledge.logscan.line_grammar import _NOT_A_CAUSE, _TRACEBACK
from opsbook.knowledge.logscan.log_lines import LogLine, _position
from opsbook.knowledge.logscan.matching import _first_matching


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


_LAST_ERROR = re.compile(r"^Last error:\s*$")
# Ascend CANN's header of an inner error (six-character code: E, the module, four digits).
_CANN_INNER_ERROR = re.compile(r"^E[0-9A-Z]\d{4}: Inner Error!?\s*$")


# torch_npu's error for a failed operator call (its message names the place,
# "InnerRunOpApi:torch_npu/csrc/framework/OpParamMaker.cpp:N OPS function error: HcclAllreduce,
# error code is 6", as vllm-ascend logs show it), after which torch_npu prints CANN's error
# message: a coded line (CANN error codes: E, the module, four digits; HCCL's are EI0001-EI0010,
# e.g. EI0006 "Getting socket times out. Reason: %s", hiascend.com CANN error code reference
# "HCCL Errors"). The coded line names the cause; the operator error only its call.
_NPU_OPS_ERROR = re.compile(r"\bOPS function error: \w+, error code is \d+")
_CANN_CODED = re.compile(r"^E[0-9A-Z]\d{4}: \S")
_CANN_DETAIL_LINES = 4


def _cann_coded_detail(chosen: Hit, lines: list[LogLine]) -> Hit:
    index = _position(lines, chosen.line)
    for line in lines[index + 1 : index + 1 + _CANN_DETAIL_LINES]:
        if line.process != chosen.line.process or line.is_code:
            continue
        if _CANN_CODED.match(line.text):
            coded = replace(chosen, line=line)
            return _last_error_detail(coded, lines) if _CANN_INNER_ERROR.match(line.text) else coded
    return chosen


def _last_error_detail(chosen: Hit, lines: list[LogLine]) -> Hit:
    """For an NCCL error followed by "Last error:", the line under it: ncclGetLastError()'s
    text names the call that failed and the peer (vLLM 0.34.0
    vllm/distributed/device_communicators/pynccl_wrapper.py NCCL_CHECK: f"NCCL error:
    {error_str}\nLast error:\n{last_error}"; PyTorch's ProcessGroupNCCL adds the same), while
    the error's own line is only the ncclResult_t's name.

    Likewise for Ascend CANN's inner error (ReportInnerErrMsg: the code's header "EZ9999: Inner
    Error!", its message on the indented line under it): the header says nothing of its own."""
    if _CANN_INNER_ERROR.match(chosen.line.text):
        index = _position(lines, chosen.line)
        detail = next((line for line in lines[index + 1 : index + 3] if line.text), None)
        if detail is not None and not detail.is_code and not _CANN_INNER_ERROR.match(detail.text):
            return replace(chosen, line=detail)
        return chosen
    if _NPU_OPS_ERROR.search(chosen.line.text):
        return _cann_coded_detail(chosen, lines)
    if chosen.entry.failure != "nccl":
        return chosen
    index = _position(lines, chosen.line)
    after = [line for line in lines[index + 1 : index + 4] if line.text]
    if len(after) >= 2 and _LAST_ERROR.match(after[0].text) and not after[1].is_code:
        return replace(chosen, line=after[1])
    return chosen


# pydantic-core's ValidationError text (src/errors/validation_exception.rs: "{count} validation
# error{s} for {title}", then per error its location line when it has one and the indented
# message "{msg} [type={type}, input_value=..., input_type=...]"; vLLM's config classes are
# pydantic dataclasses from 0.10 on, so a refused config raises it).
_VALIDATION_HEADER = re.compile(r"\b\d+ validation errors? for \S")
_VALIDATION_DETAIL = re.compile(r"\S.* \[type=\w+")
_VALIDATION_DETAIL_LINES = 3


def _validation_detail(line: LogLine, lines: list[LogLine]) -> LogLine | None:
    """For pydantic's header of a validation error, its first error's message line: the header
    only counts the errors, the message under it states the cause."""
    if not _VALIDATION_HEADER.search(line.text):
        return None
    index = _position(lines, line)
    below = [
        each
        for each in lines[index + 1 : index + 1 + 2 * _VALIDATION_DETAIL_LINES]
        if each.process == line.process
    ]
    for each in below[:_VALIDATION_DETAIL_LINES]:
        if not each.is_code and _VALIDATION_DETAIL.match(each.text):
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
        and _NAMES_A_VALUE.search(message.text)
        and not _NOT_A_CAUSE.match(message.text)
        and not any(_first_matching(entry, message.text) is not None for entry in wrappers)
    ):
        return replace(chosen, line=message)
    return chosen


_NAMES_A_VALUE = re.compile(r"'[^']+'|\"[^\"]+\"|: \S")
