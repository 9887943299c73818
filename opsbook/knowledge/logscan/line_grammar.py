"""How a log line is written: the prefixes, quoting and markup around a message, and the
shapes of exception, traceback and frame lines. These are the only patterns logscan's code
holds: what a line *says* (phases, failures, readiness) is data, in failures.yaml."""

from __future__ import annotations

import html
import json
import re
from datetime import datetime
from typing import Any

# vLLM's V1/V0 prefix has no year: year 2000 stands in (a leap year, so 02-29 parses) unless
# a line with a full date (Python logging format) says which year it is.
PLACEHOLDER_YEAR = 2000

# Escape sequences, and colour codes whose ESC byte a paste into an issue dropped ("[1;36m").
_ANSI = re.compile(
    r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07|(?<![\w\]])\[[0-9]{1,3}(?:;[0-9]{1,3})*m"
)
# How a log is quoted in an issue or a chat: "> " quote marks, a list bullet, a table's "|",
# Markdown bold or italics, an inline-code backtick, in any order and after any indentation.
# Removed only at the start (and the matching end): the text inside keeps its own indentation.
# Also the tag of a vLLM issue's title ("[Bug]: ") and pytest's failure marker ("E   ").
_MARKUP_START = re.compile(
    r"^\s*(?:(?:>\s?)+|[-*+•]\s+(?=\S)(?!\*)|\d{1,3}[.)]\s+(?=\S)|\|\s?|\*\*|__|`(?!`)"
    r"|\[(?:Bug|Usage|Installation|Performance|Misc|Doc|Hardware|New Model)[^\]]{0,30}\]:?\s*"
    r"|E {3,}(?=\S))"
)
_MARKUP_END = re.compile(r"(?:\*\*|__|\s\||(?<!`)`)\s*$")
# A terminal log viewer (k9s, lazydocker) draws a box: a vertical border before and after
# each line it shows.
_VIEWER_BORDER = re.compile(r"^\s*[│┃║] ?|(?<!\s)\s*[│┃║]\s*$")
# A line pasted as Markdown inline code: `...`.
_CODE_SPAN = re.compile(r"^\s*`([^`]+)`\s*$")
# A Markdown code fence: it marks where a pasted log begins or ends, and is not log text.
_FENCE = re.compile(r"^(?:```|~~~)[\w+-]*\s*$")
# The name of an exception as a traceback's last line shows it. A qualified name
# (``huggingface_hub.utils._http.OfflineModeIsEnabled``, ``torch._dynamo.exc.Unsupported``)
# is one whatever it ends in: exception classes of the libraries vLLM runs on are named
# freely (huggingface_hub OfflineModeIsEnabled, ray GracefulExit and TimeoutExpired, torch
# Unsupported and BackendCompilerFailed); a bare name needs one of the endings they use.
EXCEPTION_NAME = (
    r"(?:(?:[a-z_]\w*\.)+_?[A-Z]\w*(?<!Warning)"
    r"|_?[A-Z]\w*(?:Error|Exception|Exit|Interrupt|Timeout|Failure|Failed|Enabled"
    r"|Unavailable|NotFound|Denied|Exceeded|Expired|Mismatch|Died))"
)
# An exception quoted inside a sentence: after a space, a colon or an opening backtick.
_QUOTED_EXCEPTION = re.compile(
    r"(?:[\s`(（：]|: )(?P<exception>" + EXCEPTION_NAME + r"(?:\(\w+\))?: \S[^`]*)`?"
)

# Any CamelCase name followed by ": message": an exception's line when it ends a traceback
# (the line after its frames), whatever the name (``Unsupported: ...`` printed unqualified).
_BARE_EXCEPTION_LINE = re.compile(r"^_?[A-Z]\w*(?:\.\w+)*(?:\(\w+\))?: \S")
# An exception shown as its repr (a ``raise`` re-logged with %r, a Triton compile error):
# ``ValueError("msg")`` says what ``ValueError: msg`` says. A cut excerpt may lack the end.
_EXCEPTION_REPR = re.compile(
    r"^(?P<name>" + EXCEPTION_NAME + r")\((?P<q>[\"'])(?P<message>.*?)(?:(?P=q)\)?)?$"
)
_COMPOSE = re.compile(r"^[\w.-]{1,40}\s+\|\s?")
# A deployment's or a supervisor's tag before each line it relays ("[vllm]: ", an Akash or
# a process-compose log): a bracketed name and a colon. vLLM's own "[rank0]: " is a process.
_TAG = re.compile(
    r"^\[(?!rank\d)(?!(?i:debug|info|warn|warning|error|critical|fatal)\])[A-Za-z][\w.-]{0,39}\]: "
)
# vLLM's and Ray's process prefixes: "(EngineCore_DP0 pid=7)", "(RayWorkerWrapper pid=7,
# ip=10.0.0.2)", and Ray's own daemons, which carry no pid ("(raylet, ip=10.0.0.2)").
_PROCESS = re.compile(
    r"^\((?P<process>[^()\n]{0,80}?\bpid=\d+[^()\n]{0,60}"
    r"|(?:raylet|gcs_server|autoscaler|dashboard_agent|monitor)\b[^()\n]{0,60})\)\s?"
)
_RANK = re.compile(r"^\[(?P<process>rank\d+)\]:\s?")
# vLLM's prefix has no year; builds that change its date format (NVIDIA NIM) add one.
_VLLM_LEVEL = re.compile(
    r"^(?P<level>DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)\s+(?:(?P<year>\d{4})-)?"
    r"(?P<month>\d\d)-(?P<day>\d\d)\s+"
    r"(?P<time>\d\d:\d\d:\d\d)(?:[.,]\d+)?\s+\[?[\w./<>-]+:\d+\]\s?"
)
# Python logging's "%(asctime)s - %(levelname)s - %(message)s", and the logging HOWTO's
# "%(asctime)s - %(name)s - %(levelname)s - %(message)s" (docs.python.org/3/howto/logging.html)
# that programs which run vLLM relay its output through ("... - __main__ - INFO - ").
_PYTHON_LEVEL = re.compile(
    r"^(?P<year>\d{4})-(?P<month>\d\d)-(?P<day>\d\d) (?P<time>\d\d:\d\d:\d\d)(?:[.,]\d+)?"
    r" - (?:[\w.<>-]{1,60} - )?(?P<level>DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL|[A-Z]+(?= - ))"
    r" - (?:[\w./-]+:\d+ - )?"
)
_UVICORN_LEVEL = re.compile(r"^(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL):\s+")
# A level in square brackets, in any case, and the component in parentheses after it: the
# format of programs that start vLLM and log its fate in their own lines ("[Error] (Router)
# ...", "[WARN] ..."), and of Ascend's CANN ("[ERROR] 2026-08-05-08:40:06 (PID:94, ...)").
_BRACKET_LEVEL = re.compile(
    r"^\[(?P<level>(?i:debug|info|warn(?:ing)?|error|critical|fatal))\]:? +"
    r"(?:\((?P<process>[\w .-]{1,40})\) )?"
)
_LOCATION = re.compile(r"^\[[\w./-]+\.py:\d+\]\s?")
# The RFC 3339 time a container runtime puts before each line it stores (`docker logs -t`,
# `kubectl logs --timestamps`, hosted log views): one space follows, the line's own
# indentation is kept.
_RUNTIME_STAMP = re.compile(
    r"^(?P<year>\d{4})-(?P<month>\d\d)-(?P<day>\d\d)T(?P<time>\d\d:\d\d:\d\d)(?:[.,]\d+)?"
    r"(?:Z|[+-]\d\d:?\d\d)? "
)
# journald / syslog: "Dec 03 10:11:12 host vllm[1234]: " (journalctl's default output).
# journald's short format names the month in the host's locale (strftime %b under LC_TIME:
# "Aug", "авг", "août", "Mär"); only an English name gives the line a date.
_SYSLOG = re.compile(
    r"^(?P<monthname>[^\W\d_]{3,5}\.?) +(?P<day>\d{1,2}) "
    r"(?P<time>\d\d:\d\d:\d\d) \S+ [\w.@/:-]+(?:\[\d+\])?: "
)
# kubectl logs --prefix: "[pod/NAME/CONTAINER] "; stern and other log aggregators: the pod
# and container names, bare, before vLLM's own process prefix.
_KUBECTL = re.compile(
    r"^\[pod/[^\]\s]+\] |^(?:[\w.-]+ ){1,2}"
    r"(?=\([^()\n]{0,80}?\bpid=\d+[^()\n]{0,60}\) (?:DEBUG|INFO|WARNING|ERROR|CRITICAL) )"
)
# loguru's default format (Xinference and other servers that embed vLLM):
# "2024-05-01 10:11:12.345 | ERROR    | module:function:12 - ".
_LOGURU = re.compile(
    r"^(?P<year>\d{4})-(?P<month>\d\d)-(?P<day>\d\d) (?P<time>\d\d:\d\d:\d\d)(?:[.,]\d+)?"
    r" \| (?P<level>[A-Z]+)\s*\| [\w.<>:-]+ - "
)
# Python logging with the process id and the logger's name (either order, padded) between the
# time and the level, then a bracketed location or context: the servers that run vLLM as a
# backend. KServe (kserve python/kserve/kserve/logging.py KSERVE_LOGGER_FORMAT
# "%(asctime)s.%(msecs)03d %(process)s %(name)s %(levelname)s [%(funcName)s():%(lineno)s]
# %(message)s"); Xinference (xinference/deploy/cmdline.py "%(asctime)s %(name)-12s
# %(process)d %(levelname)-8s %(message)s", its actors' messages opening "[address=..., pid=...]").
_NAMED_LOGGER = re.compile(
    r"^(?P<year>\d{4})-(?P<month>\d\d)-(?P<day>\d\d) (?P<time>\d\d:\d\d:\d\d)(?:[.,]\d+)?"
    r" (?:[\w<][\w.<>-]{0,59} +){1,2}(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL) +"
    r"(?:\[[^\]\n]{1,120}\] )?"
)
# Ray's Python logger ("2024-05-01 10:11:12,345\tINFO worker.py:1 -- ") and its C++ (glog)
# lines ("[2024-05-01 10:11:12,345 E 123 456] raylet.cc:12: ", "E0501 10:11:12.345 123 f.cc:1] ").
_RAY_PYTHON = re.compile(
    r"^(?P<year>\d{4})-(?P<month>\d\d)-(?P<day>\d\d) (?P<time>\d\d:\d\d:\d\d)(?:[.,]\d+)?"
    r"\s+(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL) [\w./-]+:\d+ -- "
)
# Ray Serve's text records (ray python/ray/serve/_private/logging_utils.py ServeFormatter:
# "%(levelname)s %(asctime)s {component_name} {component_id} " then the request id and route
# when a request is in flight, then MESSAGE_FMT "%(filename)s:%(lineno)d - %(message)s"); its
# JSON records (ServeJSONFormatter) carry MESSAGE_FMT as their "message".
_RAY_SERVE = re.compile(
    r"^(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL) (?P<year>\d{4})-(?P<month>\d\d)-(?P<day>\d\d)"
    r" (?P<time>\d\d:\d\d:\d\d)(?:[.,]\d+)? (?:\S+ ){2,4}?(?=[\w.-]+\.py:\d+ - )"
)
_SERVE_LOCATION = re.compile(r"^[\w.-]+\.py:\d+ - ")
_RAY_NATIVE = re.compile(
    r"^\[(?P<year>\d{4})-(?P<month>\d\d)-(?P<day>\d\d) (?P<time>\d\d:\d\d:\d\d)(?:[.,]\d+)?"
    r" (?P<level>[DIWEF]) \d+ \d+\] (?:[\w./-]+:\d+: )?"
)
# glog's prefix (google/glog src/logging.cc LogMessage::Init: the severity's letter, the year
# when FLAGS_log_year_in_prefix, then month, day, time, thread id and file:line; src/flags.cc
# of 0.7 defines that flag true: "E20260106 06:43:02.966156  5793 transport.cpp:820] ").
_GLOG = re.compile(
    r"^(?P<level>[IWEF])(?P<year>\d{4})?(?P<month>\d\d)(?P<day>\d\d) "
    r"(?P<time>\d\d:\d\d:\d\d)\.\d+\s+\d+ "
    r"[\w./-]+:\d+\] "
)
# PyTorch's C++ (c10) log lines, behind "[rank0]:":
# "[E1203 10:11:12.345678 12 ProcessGroupNCCL.cpp:1] ".
_C10_LOG = re.compile(
    r"^\[(?P<level>[IWEF])(?P<month>\d\d)(?P<day>\d\d) (?P<time>\d\d:\d\d:\d\d)\.\d+"
    r"(?: \d+)? [\w./-]+:\d+\] ?"
)
# Any other date and time before the message ("[2024-05-01 10:11:12] ", a log shipper's):
# one space follows, as for a container runtime's stamp.
_DATE_STAMP = re.compile(
    r"^\[?(?P<year>\d{4})-(?P<month>\d\d)-(?P<day>\d\d)[ T](?P<time>\d\d:\d\d:\d\d)"
    r"(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?\]? "
)
# A structured log record's fields: docker's json-file driver ("log"), JSON loggers.
_JSON_MESSAGE_KEYS = ("log", "message", "msg", "textPayload")
_JSON_LEVEL_KEYS = ("level", "levelname", "severity")
_JSON_LEVELS = {
    "debug": "DEBUG",
    "info": "INFO",
    "warn": "WARNING",
    "warning": "WARNING",
    "error": "ERROR",
    "critical": "CRITICAL",
    "fatal": "CRITICAL",
}
# A web page or an editor's typographic quotes and non-breaking spaces, as the log wrote them.
_TYPOGRAPHIC_QUOTES = str.maketrans({"‘": "'", "’": "'", "“": '"', "”": '"', "\u00a0": " "})
# An HTML entity a web page's excerpt kept (&#39; &quot; &lt;).
_HTML_ENTITY = re.compile(r"&(?:#\d{1,5}|#x[0-9a-fA-F]{1,4}|quot|amp|lt|gt|apos|nbsp);")
_CARRIER_PREFIXES = (_RUNTIME_STAMP, _SYSLOG, _KUBECTL, _COMPOSE, _TAG)
_LEVEL_LETTERS = {"D": "DEBUG", "I": "INFO", "W": "WARNING", "E": "ERROR", "F": "CRITICAL"}
_LEVEL_WORDS = {"WARN": "WARNING", "FATAL": "CRITICAL"}
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
_PREFIXES = (
    _RUNTIME_STAMP,
    _SYSLOG,
    _KUBECTL,
    _PROCESS,
    _RANK,
    _VLLM_LEVEL,
    _PYTHON_LEVEL,
    _LOGURU,
    _NAMED_LOGGER,
    _RAY_PYTHON,
    _RAY_SERVE,
    _RAY_NATIVE,
    _GLOG,
    _C10_LOG,
    _DATE_STAMP,
    _UVICORN_LEVEL,
    _BRACKET_LEVEL,
    _LOCATION,
    _SERVE_LOCATION,
)
# A named group of a pattern, made plain to combine patterns whose group names repeat.
NAMED_GROUP = re.compile(r"\(\?P<\w+>")
_ANY_CARRIER = re.compile(
    "|".join(f"(?:{NAMED_GROUP.sub('(?:', p.pattern)})" for p in _CARRIER_PREFIXES)
)
_ANY_PREFIX = re.compile("|".join(f"(?:{NAMED_GROUP.sub('(?:', p.pattern)})" for p in _PREFIXES))
_FULL_DATE = re.compile(r"\b(20\d\d)-\d\d-\d\d[ T]\d\d:\d\d:\d\d")

# Lines that start something new, so a terminal wrap never produced them.
_LINE_START = re.compile(
    r"^(?:Traceback|File \"|[\[#`]|(?:[\w.]+\.)?[A-Z]\w*(?:Error|Exception|Warning)\b"
    r"|" + EXCEPTION_NAME + r"(?:\(\w+\))?:"
    r"|(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)\b|[^|]{0,80}:\s+\d+%\|"
    r"|(?:error|fatal|warning): "  # a command-line program's own message
    r"|[\w.-]+ exited with code \d+"  # docker compose's report of a container's end
    # A shell's own message (bash's "NAME: line N: ", dash's "NAME: N: ", zsh's "zsh: "), its
    # job report and its "command not found" (see _SIGKILL and the vllm-not-installed entry).
    r"|(?:\S*/)?(?:ba|z|da|k|fi)?sh: |\S+: line \d+: |\S+: \d+: "
    r"|[\w./-]+: (?:command )?not found\b"
    r"|(?:\(\S+\)\s+)?[\w.-]+@[\w.-]+:)"  # the last one: a shell prompt after the log
)
# Shell comments and provenance notes pasted around a log; vLLM's own "# GPU blocks" line
# always follows a prefix, so it never starts a line.
_COMMENT = re.compile(r"^# ")
# A Markdown heading of a pasted issue keeps its text: issue templates put "### ..." above
# each answer, and reporters type the error they got on that line.
_HEADING = re.compile(r"^#{2,6} ")
_MIN_WRAP_WIDTH = 60
_FRAME = re.compile(r"^\s+File \"")
# Python 3.11+ marks the failing expression of a frame with a line of ^ and ~ only.
_MARKERS_ONLY = re.compile(r"[\^~\s]+")

# vLLM's process prefix inside a line ("...)(APIServer pid=9) ..."): where a paste lost the
# line breaks of a log whose every line carried it.
_INNER_PROCESS = re.compile(r"(?<=\S)(?=\([A-Za-z_][\w ]{0,40} pid=\d+(?:, ip=[\d.]+)?\))")


# Ascend CANN's error message, printed indented under its own "TraceBack (most recent call
# last):" inside an exception's text: each line ends in the place that reported it
# ("[FUNC:%s][FILE:%s][LINE:%d]", as vllm-project/vllm-ascend#3017 and #1736 show it), so it
# is the runtime's message, not a traceback's source line.
_CANN_PLACE = re.compile(r"\[FUNC:\w+\]\[FILE:[\w.]+\]\[LINE:\d+\]\s*$")


_EXCEPTION_LINE = re.compile(r"^" + EXCEPTION_NAME + r"(?:\(\w+\))?(?::|$)")
_NOT_A_CAUSE = re.compile(r"^(?:Traceback \(most recent call last\)|During handling of|The above)")

_TRACEBACK = re.compile(r"^Traceback \(most recent call last\)")


def _clean(line: str) -> str:
    """ANSI codes, carriage-return redraws and markdown quoting removed; indentation kept."""
    if line.startswith('{"'):
        line = _json_record(line)
    line = _ANSI.sub("", line)
    if "\r" in line:
        line = _last_redraw(line)
    if "&" in line and _HTML_ENTITY.search(line):
        line = html.unescape(line)
    if not line.isascii():
        line = line.translate(_TYPOGRAPHIC_QUOTES)
    line = _VIEWER_BORDER.sub("", line)
    line = _CODE_SPAN.sub(r"\1", line, count=1)
    marked = False
    while True:
        found = _MARKUP_START.match(line)
        if found is None or not found.end():
            break
        line, marked = line[found.end() :], True
    if marked:
        line = _MARKUP_END.sub("", line).lstrip()
    return _without_indent_before_prefix(line)


def _quoted_exception(text: str) -> str:
    """A reporter's sentence that quotes an exception ("and the error is: ValueError: ...",
    "I get `KeyError: 'x'` when ...") reads as the exception; anything else unchanged."""
    if not text or text[0].isspace() or _EXCEPTION_LINE.match(text):
        return text
    found = _QUOTED_EXCEPTION.search(text)
    return found.group("exception").rstrip("`").rstrip() if found else text


def _json_record(line: str) -> str:
    """The message of a structured log record (docker's json-file driver: ``{"log": ...}``;
    JSON loggers: ``{"level": ..., "message": ...}``) as ``LEVEL:  message``; any other
    line unchanged."""
    try:
        record = json.loads(line)
    except ValueError:
        return line
    if not isinstance(record, dict):
        return line
    text = next(
        (record[key] for key in _JSON_MESSAGE_KEYS if isinstance(record.get(key), str)), None
    )
    if text is None:
        return line
    message = " ".join(part for part in text.rstrip("\n").split("\n"))
    level = next((record[key] for key in _JSON_LEVEL_KEYS if isinstance(record.get(key), str)), "")
    level = _JSON_LEVELS.get(level.lower(), "")
    # Ray Serve's message opens with its location (no level of its own): the record's level
    # still goes before it.
    own_prefix = _has_prefix(message) and not _SERVE_LOCATION.match(message)
    return f"{level}:  {message}" if level and not own_prefix else message


def _without_indent_before_prefix(line: str) -> str:
    # Indentation before a process or level prefix is a quoting artefact (a paste into a
    # list, a space the reporter typed): the prefix starts the line. Indentation before
    # anything else stays (it tells a traceback's source lines from its messages).
    if not line[:1].isspace():
        return line
    bare = line.lstrip()
    return bare if _has_prefix(bare) else line


def _last_redraw(line: str) -> str:
    # Progress bars redraw with "\r": what a terminal finally showed is the last segment,
    # behind the prefix the first segment may carry.
    head, *redraws = line.split("\r")
    last = next((part for part in reversed(redraws) if part.strip()), "")
    if not _strip_prefixes(head, PLACEHOLDER_YEAR)[0].strip():
        return head + last
    return last or head


def _strip_prefixes(line: str, year: int) -> tuple[str, str | None, datetime | None, str | None]:
    level: str | None = None
    stamp: datetime | None = None
    process: str | None = None
    # What the log's carrier adds (a runtime's time, journald's, a container's name) comes
    # first, in any order; then the log's own prefixes. One combined expression says whether
    # any prefix is left (most lines' last look finds none).
    for prefixes, gate in ((_CARRIER_PREFIXES, _ANY_CARRIER), (_PREFIXES, _ANY_PREFIX)):
        while gate.match(line):
            found = None
            for pattern in prefixes:
                found = pattern.match(line)
                if found and found.end():
                    break
            if found is None or not found.end():
                break
            groups = found.groupdict()
            found_level = groups.get("level")
            if found_level:
                level = _level_name(found_level)
            process = groups.get("process") or process
            if groups.get("time"):
                stamp = _stamp(groups, year) or stamp
            line = line[found.end() :]
    return line, level, stamp, process


def _level_name(found: str) -> str:
    # glog's letter, a word in any case ("Error", "warn"): the names vLLM's logger uses.
    upper = found.upper()
    return _LEVEL_LETTERS.get(upper) or _LEVEL_WORDS.get(upper, upper)


def _stamp(groups: dict[str, str | None], year: int) -> datetime | None:
    try:
        hour, minute, second = (int(part) for part in (groups["time"] or "").split(":"))
        month = groups.get("month") or _MONTHS.index((groups.get("monthname") or "")[:3]) + 1
        return datetime(
            int(groups.get("year") or year),
            int(month),
            int(groups["day"] or 0),
            hour,
            minute,
            second,
        )
    except ValueError:
        return None


def _year_in(line: str) -> int | None:
    found = _FULL_DATE.search(line)
    return int(found.group(1)) if found else None


def _has_prefix(line: str) -> bool:
    return any(p.match(line) for p in _PREFIXES) or bool(_COMPOSE.match(line) or _TAG.match(line))


def _wrap_candidate(line: str) -> bool:
    if not line or line[0].isspace():
        return False
    return not _has_prefix(line) and not _LINE_START.match(line)


def _continues(previous: str, line: str, width: int | None) -> bool:
    if width is not None and len(previous) == width and line.strip():
        # The cut can fall on a space, so the piece may start with one; a traceback frame
        # of its own still starts a new line.
        return _wrap_candidate(line.lstrip()) and not _FRAME.match(line)
    # The cheap tests first: this runs for every pair of lines of a log.
    if line[:1].isspace() and line.strip() and not _FRAME.match(line) and _bare_prefix(previous):
        # A page or a narrow view broke the line after its prefix: the message follows,
        # indented, with no prefix of its own.
        return not _has_prefix(line.lstrip())
    if not _wrap_candidate(line):
        return False
    # A single wrapped line: the piece has no prefix of its own although its neighbour does,
    # and it starts mid-word or mid-sentence.
    return _has_prefix(previous) and len(previous) >= _MIN_WRAP_WIDTH and _starts_mid_word(line)


def _bare_prefix(line: str) -> bool:
    # A prefix with a level and no message after it.
    if not _has_prefix(line):
        return False
    message, level, _, _ = _strip_prefixes(line, PLACEHOLDER_YEAR)
    return level is not None and not message.strip()


def _starts_mid_word(line: str) -> bool:
    return line[0].islower() or line[0].isdigit()


_SIZE = re.compile(r"^([\d.]+) ?(bytes|[KMGT]?i?B)$")


_SIZE_POWERS = {"bytes": 0, "B": 0, "K": 1, "M": 2, "G": 3, "T": 4}


# A parsed value: an integer, a decimal, a size with its unit ("2.5 GiB", "512 bytes").
_INTEGER = re.compile(r"\d+")
_DECIMAL = re.compile(r"\d+\.\d+")


def number_of_text(value: str) -> Any:
    """A parsed value as a number when it is one, else its text stripped."""
    if _INTEGER.fullmatch(value):
        return int(value)
    if _DECIMAL.fullmatch(value):
        return float(value)
    return value.strip()


def gib_of_text(value: str) -> float | None:
    """A size's value in GiB, None when the text is no size."""
    found = _SIZE.match(value.strip())
    if not found:
        return None
    unit = found.group(2)
    power = _SIZE_POWERS["bytes" if unit == "bytes" else unit[0]]
    return round(float(found.group(1)) * 1024.0 ** (power - 3), 6)


# A traceback's source line that raises with a literal message: ``raise RuntimeError("...``
# or an f-string, whose text up to its first placeholder is the message's fixed stem.
RAISE_LITERAL = re.compile(r"^raise (?P<name>[\w.]+)\(\s*[fr]?(?P<q>[\"'])(?P<literal>[^\"'{]*)")


def exception_line_of(name: str) -> re.Pattern[str]:
    """The line of an exception named ``name`` (qualified or not) with its message."""
    return re.compile(r"^(?:[\w.]+\.)?" + re.escape(name) + r": \S")


# What the engine runs with, as vLLM logs it at start-up (vllm 0.32.0): the engine's config
# line ``kv_cache_dtype=fp8, `` (vllm/config/vllm.py, VllmConfig.__str__), and the attention
# backend chosen, ``Using FLASH_ATTN backend.`` when asked for or ``Using FLASHINFER attention
# backend out of potential backends: [...]`` (vllm/platforms/cuda.py, get_attn_backend_cls).
KV_CACHE_DTYPE_SAID = re.compile(r"\bkv_cache_dtype=(?P<dtype>[\w.]+)")
ATTENTION_BACKEND_SAID = re.compile(
    r"\bUsing (?:AttentionBackendEnum\.)?(?P<backend>[A-Z][A-Z0-9_]+) (?:attention )?backend\b"
)
# Fixed parts of those lines, for a host to pick them out of a large log before they are read.
ENGINE_LINE_MARKS = ("kv_cache_dtype=", " backend", "KV cache size: ")

# What vLLM says of its memory once it sized the KV cache, read by the capacity plan
# (opsbook.steps.plan): 0.32.0 vllm/v1/core/kv_cache_utils.py update_kv_cache_capacity ("%s KV
# cache size: %s tokens, Maximum concurrency for %s tokens per request: %.2fx", one line there,
# two in 0.20), vllm/v1/worker/gpu_worker.py ("Available KV cache memory: %s GiB"),
# gpu_model_runner.py ("Model loading took %s GiB memory"); the banner's "version X".
# An engine's start-up, before it loads and sizes anything: 0.10.2-0.34.0 vllm/v1/engine/core.py
# "Initializing a V1 LLM engine (v%s) with config: ..." (V0: "an LLM engine"); not the same
# config dumped after an error ("Dumping input data for V1 LLM engine", dump_input.py).
ENGINE_START_SAID = re.compile(r"\bInitializing an? (?:V1 )?LLM engine \(v")
KV_CACHE_SIZE_SAID = re.compile(r"\b[A-Z]+(?: \+ host)? KV cache size: (?P<tokens>[\d,]+) tokens")
MAX_CONCURRENCY_SAID = re.compile(
    r"\bMaximum concurrency for (?P<max_model_len>[\d,]+) tokens per request: "
    r"(?P<concurrency>[\d.]+)x"
)
KV_MEMORY_SAID = re.compile(r"Available KV cache memory: (?P<gib>-?[\d.]+) ?GiB")
WEIGHTS_MEMORY_SAID = re.compile(r"Model loading took (?P<gib>[\d.]+) ?GiB")
VLLM_VERSION_SAID = re.compile(r"(?:\bversion |LLM engine \(v)(?P<version>\d+\.\d+\.\d+[\w.+-]*)")
NON_DEFAULT_ARGS_SAID = re.compile(r"non-default args: (?P<args>\{.*\})")
# The same lines' fixed parts, for 06_qualify's read of a log's startup facts.
KV_LINE_MARKS = ("KV cache size: ", "Maximum concurrency for")
# The memory lines besides, for the capacity figures 04's record keeps (opsbook.steps.host_side).
MEMORY_LINE_MARKS = ("Available KV cache memory", "Model loading took")
