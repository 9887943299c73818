"""Read a vLLM log of any version and say what state the server reached and why.

Logs come from many vLLM versions (V0 ``INFO 10-12 00:26:58 launcher.py:27]``, V1
``(EngineCore_DP0 pid=N) INFO 03-12 10:11:12 [core.py:123]``, ``[rank0]:``, Ray
``(RayWorkerWrapper pid=N)``) and arrive mangled: raw ANSI colour codes, ``> `` quoting and
``**`` from pasted issues, lines wrapped by a terminal, a truncated tail. Every log line is
normalised first (``LogLine.text``) while its original text is kept (``LogLine.raw``), so a
reported line can always be found again with ``grep -F``.

The failure catalogue is data (``opsbook/knowledge/data/failures.yaml``); this module only reads
lines,
finds the startup phases, matches the catalogue and decides the state:

    failure after the last "ready" line  -> failed   (specific cause > wrapper > generic)
    shared-memory stall persists / last  -> hung
    "Application startup complete."      -> ready
    otherwise, process known running     -> loading  (at the furthest phase seen)
    otherwise                            -> no-conclusion (stopped during a phase, with a suspect)
"""

from __future__ import annotations

import html
import io
import json
import re
from bisect import bisect_left
from collections import Counter, deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from functools import lru_cache, partial
from importlib import resources
from itertools import accumulate
from typing import Any, BinaryIO

import yaml

from opsbook.core.exceptions import OpsbookError
from opsbook.core.results import SEVERITIES, Finding, Result, Table
from opsbook.knowledge.logread import LineScreen, screened_lines

READY = "ready"
LOADING = "loading"
FAILED = "failed"
HUNG = "hung"
NO_CONCLUSION = "no-conclusion"

KINDS = ("cause", "wrapper", "stall", "generic", "note")
_STATE_WORDS = {NO_CONCLUSION: "stopped without an error"}

# vLLM's V1/V0 prefix has no year: year 2000 stands in (a leap year, so 02-29 parses) unless
# a line with a full date (Python logging format) says which year it is.
PLACEHOLDER_YEAR = 2000

PHASE_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (name, re.compile(pattern))
    for name, pattern in (
        ("args", r"non-default args: |args: Namespace\(|vLLM API server version "),
        ("engine-config", r"Initializing an? (?:V1 )?LLM engine"),
        ("backend", r"\bUsing [\w. ]*?backend\b|Valid backends: "),
        (
            "weights",
            r"Starting to load model|Loading (?:safetensors|pt) checkpoint shards"
            r"|Loading weights took|Model loading took|Loading model weights took",
        ),
        (
            "compile",
            r"torch\.compile takes|Dynamo bytecode transform time|Compiling a graph for"
            r"|Directly load the compiled graph|torch_compile_cache",
        ),
        (
            "kv-cache",
            r"Available KV cache memory|GPU KV cache size|Maximum concurrency for"
            r"|# (?:GPU|gpu) blocks: |Memory profiling (?:results|takes)",
        ),
        (
            "graphs",
            r"Capturing (?:CUDA ?graphs?|cudagraphs?|the model for CUDA graphs)"
            r"|Graph capturing finished",
        ),
        (
            "engine-ready",
            r"init engine \(profile, create kv cache, warmup model\) took"
            r"|Core engine process \d+ ready",
        ),
        (
            "http",
            r"Starting vLLM (?:API )?server|Starting \S+ (?:API )?server(?: \d+)? on "
            r"|Available routes are|Route: /|Started server process",
        ),
        # uvicorn's lines; vLLM 0.14.1-0.34.0's gRPC server (entrypoints/grpc_server.py,
        # launchers/grpc_server.py), logged once server.start() has bound the port.
        (
            "ready",
            r"Application startup complete|Uvicorn running on"
            r"|vLLM gRPC server started on|Server is ready to accept requests",
        ),
    )
)
PHASE_NAMES = tuple(name for name, _ in PHASE_PATTERNS)

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
# Group names repeat across the prefixes: the combined gates drop them.
_PREFIX_GROUP = re.compile(r"\(\?P<\w+>")
_ANY_CARRIER = re.compile(
    "|".join(f"(?:{_PREFIX_GROUP.sub('(?:', p.pattern)})" for p in _CARRIER_PREFIXES)
)
_ANY_PREFIX = re.compile("|".join(f"(?:{_PREFIX_GROUP.sub('(?:', p.pattern)})" for p in _PREFIXES))
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

_VERSION_PATTERNS = (
    re.compile(r"vLLM API server version v?(\d[\w.+-]*)"),
    re.compile(r"Initializing an? (?:V1 )?LLM engine \(v(\d[\w.+-]*)\)"),
    re.compile(r"[█▄▀]\s+version v?(\d+\.\d+[\w.+-]*)"),
    re.compile(r"\b[vV][lL][lL][mM]\b[^\n]{0,20}?\bversion:? v?(\d+\.\d+[\w.+-]*)"),
    re.compile(r"\bvllm==(\d+\.\d+[\w.+-]*)"),
)
_NCCL_INIT = re.compile(r"vLLM is using nccl==|\bNCCL INFO \S|Found nccl from")
_WEIGHTS_DONE = re.compile(r"Loading weights took|Model loading took|Loading model weights took")
_SIZE = re.compile(r"^([\d.]+) ?(bytes|[KMGT]?i?B)$")
_SIZE_POWERS = {"bytes": 0, "B": 0, "K": 1, "M": 2, "G": 3, "T": 4}
_PERSISTENT_STALLS = 3


# How far back a pattern's ``after`` context is looked for: a traceback's last frames.
CONTEXT_WINDOW = 12


@dataclass(frozen=True)
class LogLine:
    """One logical log line (terminal-wrapped pieces joined).

    Args:
        number: 1-based line number of its first physical line (as ``grep -n`` counts).
        raw: the original text; wrapped pieces joined with newlines.
        text: the message with ANSI codes, quote markers and prefixes removed.
        level: the log level when the line has one (``INFO``, ``ERROR``...).
        timestamp: when the line's prefix carries a time (see ``PLACEHOLDER_YEAR``).
        is_code: a traceback's frame or source line, never a message.
        process: the process prefix (``EngineCore_DP0 pid=7``, ``rank0``) when there is one.
        exception: an exception's line (``Name: message``): a known exception name, or any
            name on the line that ends a traceback's frames.
    """

    number: int
    raw: str
    text: str
    level: str | None = None
    timestamp: datetime | None = None
    is_code: bool = False
    process: str | None = None
    exception: bool = False


@dataclass(frozen=True)
class Phase:
    """A startup phase and the first line that shows it."""

    name: str
    first_line_no: int
    timestamp: datetime | None


@dataclass(frozen=True)
class CatalogueEntry:
    """One failure class of ``opsbook/knowledge/data/failures.yaml``."""

    id: str
    title: str
    kind: str
    severity: str
    priority: int
    patterns: tuple[re.Pattern[str], ...]
    remedy: str
    source: str
    parse: tuple[re.Pattern[str], ...] = ()
    remedy_parsed: str = ""
    stems: tuple[str, ...] = ()
    # Per pattern: a text that must be on one of the CONTEXT_WINDOW lines before (None: any).
    after: tuple[re.Pattern[str] | None, ...] = ()
    # The shared failure id this class is reported under, when its own id is not one of them.
    family: str | None = None
    # A stall logged on a timer while a normal startup waits too: a hang only when this many
    # end the log in a row, with no other line between them.
    hang_after: int | None = None

    @property
    def failure(self) -> str:
        """The failure id a diagnosis of this class reports."""
        return self.family or self.id

    @property
    def error_class(self) -> str | None:
        """The class's own id when it is reported under a family's failure id."""
        return self.id if self.family else None


@dataclass(frozen=True)
class Hit:
    """A catalogue entry found on a log line; ``pattern_index`` says which pattern matched."""

    entry: CatalogueEntry
    line: LogLine
    pattern_index: int


@dataclass(frozen=True)
class OomKill:
    """A process the kernel's OOM killer ended, from ``dmesg`` text."""

    pid: int
    process: str
    line_no: int
    line: str
    anon_rss_kb: int | None = None


@dataclass
class LogDiagnosis:
    """What a vLLM log says: state, failure class, the identifying line and the remedy.

    Args:
        state: ``ready``, ``loading``, ``failed``, ``hung`` or ``no-conclusion``.
        phase: the furthest startup phase the log reached.
        failure: the catalogue id of the failure, when failed or hung.
        title: one line for people.
        severity: as ``opsbook.core.results.Finding``.
        line: the line that identifies the state (its ``raw`` text is as in the log).
        wrapper: the wrapper error below the reported root cause, if any.
        remedy: what to do.
        source: where the signature and the remedy come from.
        numbers: values parsed from the identifying lines.
        version: the vLLM version when the log states it.
        phases: the startup phases seen.
        notes: lines worth pointing out that are not failures.
        suspect: for a log that stops without an error, the catalogue id that likely explains it.
        error_class: the catalogue class of the failure when it is reported under a shared
            failure id (an error the catalogue knows, reported as ``unrecognised-error`` with
            its own remedy).
        first_line: where the diagnosed (last) startup begins in the file.
        skipped_lines: lines of interest of that startup left out to bound memory.
        earlier: the startups before it in the same file (the last ``EARLIER_LISTED``).
        earlier_counts: how many earlier startups ended in each state.
    """

    state: str
    phase: str | None
    failure: str | None
    title: str
    severity: str
    line: LogLine | None
    remedy: str
    source: str
    wrapper: LogLine | None = None
    numbers: dict[str, Any] = field(default_factory=dict)
    version: str | None = None
    phases: list[Phase] = field(default_factory=list)
    notes: list[Hit] = field(default_factory=list)
    suspect: str | None = None
    root_cause: LogLine | None = None
    first_line: int = 1
    skipped_lines: int = 0
    earlier: list[EarlierStartup] = field(default_factory=list)
    earlier_counts: dict[str, int] = field(default_factory=dict)
    error_class: str | None = None

    @property
    def ok(self) -> bool:
        return self.state in (READY, LOADING)

    @property
    def summary(self) -> str:
        what = f"{self.state}: {self.title}"
        return what + (f" [{self.failure}]" if self.failure else "")

    def to_dict(self) -> dict[str, Any]:
        """Everything as JSON-ready values (for ``opsbook diagnose --json``)."""
        return {
            "state": self.state,
            "phase": self.phase,
            "failure": self.failure,
            "error_class": self.error_class,
            "title": self.title,
            "severity": self.severity,
            "line": _line_dict(self.line),
            "wrapper": _line_dict(self.wrapper),
            "root_cause": _root_dict(self.root_cause),
            "remedy": self.remedy,
            "source": self.source,
            "numbers": self.numbers,
            "version": self.version,
            "phases": [
                {"name": p.name, "line_no": p.first_line_no, "timestamp": _iso(p.timestamp)}
                for p in self.phases
            ],
            "notes": [
                {"id": n.entry.id, "title": n.entry.title, "line": _line_dict(n.line)}
                for n in self.notes
            ],
            "suspect": self.suspect,
            "startup_first_line": self.first_line,
            "skipped_lines": self.skipped_lines,
            "earlier_startups": {
                "count": sum(self.earlier_counts.values()),
                "states": self.earlier_counts,
                "summary": self.earlier_summary,
                "startups": [startup.to_dict() for startup in self.earlier],
            },
        }

    @property
    def earlier_summary(self) -> str | None:
        """``3 earlier startups in this file: 2 failed, 1 ready``, or None when there are none."""
        total = sum(self.earlier_counts.values())
        if not total:
            return None
        counts = sorted(self.earlier_counts.items(), key=lambda item: (-item[1], item[0]))
        states = ", ".join(f"{count} {_STATE_WORDS.get(state, state)}" for state, count in counts)
        noun = "startup" if total == 1 else "startups"
        return f"{total} earlier {noun} in this file: {states}"

    def to_result(self) -> Result:
        """The diagnosis as an opsbook ``Result`` with findings."""
        subject = self.failure or self.state
        message = self.title + (f" (line {self.line.number})" if self.line else "")
        findings = [Finding(self.severity, subject, message, self.remedy, self.source)]
        findings += [
            Finding(
                n.entry.severity,
                n.entry.id,
                f"{n.entry.title} (line {n.line.number})",
                n.entry.remedy,
                n.entry.source,
            )
            for n in self.notes
        ]
        if self.earlier_summary:
            findings.append(
                Finding(
                    "info",
                    "earlier startups",
                    f"{self.earlier_summary}; this diagnosis is about the last one (from line "
                    f"{self.first_line})",
                )
            )
        return Result(self.ok, self.summary, self.to_dict(), findings)

    def __str__(self) -> str:
        rows = [f"state:   {self.state}" + (f" (phase: {self.phase})" if self.phase else "")]
        if self.failure:
            known = f" ({self.error_class})" if self.error_class else ""
            rows.append(f"failure: {self.failure}{known} - {self.title}")
        else:
            rows.append(f"summary: {self.title}")
        if self.line:
            rows.append(f"line {self.line.number}: {self.line.raw}")
        if self.root_cause:
            process = f" ({self.root_cause.process})" if self.root_cause.process else ""
            rows.append(f"root cause at line {self.root_cause.number}{process}")
        if self.wrapper:
            rows.append(f"wrapper at line {self.wrapper.number}: {self.wrapper.text}")
        if self.numbers:
            rows.append("numbers: " + ", ".join(f"{k}={v}" for k, v in self.numbers.items()))
        rows.append(f"remedy:  {self.remedy}")
        rows.append(f"source:  {self.source}")
        if self.version:
            rows.append(f"vLLM:    {self.version}")
        if self.earlier_summary:
            rows.append(
                f"startup: the last one, from line {self.first_line}; {self.earlier_summary}"
            )
        rows += [f"note line {n.line.number}: {n.entry.title}" for n in self.notes]
        return "\n".join(rows)

    def _repr_html_(self) -> str:
        colour = {READY: "#1a7f37", LOADING: "#9a6700"}.get(self.state, "#cf222e")
        head = f'<p style="color:{colour}"><b>{html.escape(self.summary)}</b></p>'
        rows = [["phase", self.phase], ["vLLM version", self.version]]
        rows.append(["earlier startups", self.earlier_summary])
        if self.line:
            rows.append([f"line {self.line.number}", self.line.raw])
        if self.wrapper:
            rows.append([f"wrapper (line {self.wrapper.number})", self.wrapper.text])
        rows += [[key, value] for key, value in self.numbers.items()]
        rows += [["remedy", self.remedy], ["source", self.source]]
        rows += [[f"note (line {n.line.number})", n.entry.title] for n in self.notes]
        table = Table(["", ""], [row for row in rows if row[1] not in (None, "")])
        return head + table._repr_html_()


def load_catalogue() -> list[CatalogueEntry]:
    """Read the failure catalogue shipped with opsbook.

    Returns:
        The entries in file order.

    Raises:
        OpsbookError: when the catalogue file is malformed.
    """
    return list(_catalogue())


@lru_cache(maxsize=1)
def _catalogue() -> tuple[CatalogueEntry, ...]:
    text = (
        resources.files("opsbook.knowledge")
        .joinpath("data/failures.yaml")
        .read_text(encoding="utf-8")
    )
    # libyaml's parser when PyYAML has it: the pure-Python one takes most of a small log's
    # diagnosis (opsbook diagnose starts in well under half a second).
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return tuple(_entry(raw) for raw in yaml.load(text, Loader=loader))


def _entry(raw: dict[str, Any]) -> CatalogueEntry:
    try:
        entry = CatalogueEntry(
            id=raw["id"],
            title=raw["title"],
            kind=raw["kind"],
            severity=raw["severity"],
            priority=int(raw["priority"]),
            patterns=tuple(re.compile(_regex(p)) for p in raw["patterns"]),
            remedy=raw["remedy"],
            source=raw["source"],
            parse=tuple(re.compile(p) for p in raw.get("parse", ())),
            remedy_parsed=raw.get("remedy_parsed", ""),
            stems=tuple(raw.get("stems", ())),
            after=tuple(_after(p) for p in raw["patterns"]),
            family=raw.get("family"),
            hang_after=raw.get("hang_after"),
        )
    except (KeyError, TypeError, re.error) as exc:
        raise OpsbookError(
            f"failure catalogue entry {raw!r:.80} is malformed: {exc}",
            remedy="fix opsbook/knowledge/data/failures.yaml (fields are described at its top)",
        ) from exc
    if entry.kind not in KINDS or entry.severity not in SEVERITIES:
        raise OpsbookError(
            f"failure catalogue entry {entry.id!r} has kind {entry.kind!r} / severity "
            f"{entry.severity!r}",
            remedy=f"use a kind of {KINDS} and a severity of {SEVERITIES}",
        )
    return entry


def _regex(pattern: str | dict[str, str]) -> str:
    # "<EXCEPTION>" in a pattern stands for any exception name (EXCEPTION_NAME).
    text = pattern["regex"] if isinstance(pattern, dict) else pattern
    return text.replace("<EXCEPTION>", EXCEPTION_NAME)


def _after(pattern: str | dict[str, str]) -> re.Pattern[str] | None:
    """A pattern's context: a text one of the lines just before must hold (a traceback's
    frame), for a message that means different things from different kernels."""
    return re.compile(pattern["after"]) if isinstance(pattern, dict) else None


def normalise_line(line: str) -> str:
    """Strip ANSI codes, quote markers and every known prefix from one physical line.

    Args:
        line: a line as it appears in a log or a pasted issue.

    Returns:
        The bare message, e.g. ``ValueError: ...`` for
        ``> (EngineCore_DP0 pid=7) ERROR 03-12 10:11:12 [core.py:1] ValueError: ...``.
    """
    return _strip_prefixes(_clean(line), PLACEHOLDER_YEAR)[0].strip()


def read_log_lines(text: str) -> list[LogLine]:
    """Split a log into logical lines, joining pieces a terminal wrapped.

    Args:
        text: the whole log.

    Returns:
        One ``LogLine`` per logical line, numbered like ``grep -n``.
    """
    return logical_lines(list(enumerate(text.split("\n"), 1)))


def logical_lines(
    physical: Sequence[tuple[int, str]], memo: LineMemo | None = None
) -> list[LogLine]:
    """Logical lines from numbered physical lines (a gap in the numbers breaks any joining).

    Args:
        physical: ``(line number, text)`` in file order, e.g. from
            :func:`opsbook.knowledge.logread.screened_lines`.
        memo: what earlier looks at the same growing log read each text as (see
            :class:`LineMemo`); the lines come out the same with it or without.

    Returns:
        One ``LogLine`` per logical line.
    """
    memo = memo or LineMemo()
    pieces = [piece for number, text in physical for piece in _lost_breaks(number, text)]
    numbers = [number for number, _ in pieces]
    raws = [text.rstrip("\r") for _, text in pieces]
    cleaned = [memo.cleaned.get(line, _clean) for line in raws]
    year = _first_year(raws, memo)
    lines: list[LogLine] = []
    after_frame = after_code = False
    for members in _wrapped_groups(numbers, cleaned, memo):
        joined = "".join(cleaned[i] for i in members)
        read = memo.read.get((joined, year), _read_message)
        body = read.body
        is_code = (
            read.code
            or (after_frame and read.indented)
            or (len(members) == 1 and read.relayed_source)
        ) and not read.cann_place
        after_frame = read.frame
        exception = not is_code and (read.exception or (after_code and read.bare_exception))
        if body:
            after_code = is_code
        raw = "\n".join(raws[i] for i in members)
        lines.append(
            LogLine(
                numbers[members[0]], raw, body, read.level, read.stamp, is_code, read.process,
                exception,
            )
        )  # fmt: skip
    return _roll_years(lines)


@dataclass(frozen=True)
class _ReadMessage:
    """What one logical line's text says on its own, whatever lines surround it."""

    body: str
    level: str | None
    stamp: datetime | None
    process: str | None
    code: bool  # a frame, a ``raise`` or a marker line: code wherever it stands
    indented: bool  # code when it follows a frame
    relayed_source: bool  # code when it is a single physical line
    cann_place: bool  # never code
    frame: bool
    exception: bool
    bare_exception: bool  # an exception line when it follows code


def _read_message(key: tuple[str, int]) -> _ReadMessage:
    joined, year = key
    if _COMMENT.match(joined) or _FENCE.match(joined.strip()):
        joined = ""
    joined = _HEADING.sub("", joined, count=1)
    message, level, stamp, process = _strip_prefixes(joined, year)
    body = _EXCEPTION_REPR.sub(r"\g<name>: \g<message>", message.strip(), count=1)
    if level is None and process is None:
        body = _quoted_exception(body)
    return _ReadMessage(
        body=body,
        level=level,
        stamp=stamp,
        process=process,
        code=body.startswith(("raise ", 'File "')) or bool(_MARKERS_ONLY.fullmatch(body) and body),
        indented=message[:1].isspace(),
        relayed_source=_relayed_source_line(message, level, body),
        cann_place=bool(_CANN_PLACE.search(body)),
        frame=body.startswith('File "'),
        exception=bool(_EXCEPTION_LINE.match(body)),
        bare_exception=bool(_BARE_EXCEPTION_LINE.match(body)),
    )


# vLLM's process prefix inside a line ("...)(APIServer pid=9) ..."): where a paste lost the
# line breaks of a log whose every line carried it.
_INNER_PROCESS = re.compile(r"(?<=\S)(?=\([A-Za-z_][\w ]{0,40} pid=\d+(?:, ip=[\d.]+)?\))")


def _lost_breaks(number: int, text: str) -> list[tuple[int, str]]:
    """A physical line that holds several lines of a prefixed log (a paste that lost its
    line breaks) as those lines, all with its number; any other line as it is."""
    if text.count("pid=") < 2:
        return [(number, text)]
    inner = [found.start() for found in _INNER_PROCESS.finditer(text)]
    if not inner:
        return [(number, text)]
    bounds = [0, *inner, len(text)]
    return [(number, text[start:end]) for start, end in zip(bounds, bounds[1:], strict=False)]


def _relayed_source_line(message: str, level: str | None, body: str) -> bool:
    """A traceback's indented source line relayed line by line at ERROR level (vLLM's
    ``logger.exception`` of a worker's or an engine core's failure prefixes every line of
    the traceback): code even in an excerpt that starts below its ``File`` line."""
    return (
        level in ("ERROR", "CRITICAL")
        and message.startswith("  ")
        and not _EXCEPTION_LINE.match(body)
        and not _NOT_A_CAUSE.match(body)
    )


# Ascend CANN's error message, printed indented under its own "TraceBack (most recent call
# last):" inside an exception's text: each line ends in the place that reported it
# ("[FUNC:%s][FILE:%s][LINE:%d]", as vllm-project/vllm-ascend#3017 and #1736 show it), so it
# is the runtime's message, not a traceback's source line.
_CANN_PLACE = re.compile(r"\[FUNC:\w+\]\[FILE:[\w.]+\]\[LINE:\d+\]\s*$")


def _wrapped_groups(numbers: list[int], cleaned: list[str], memo: LineMemo) -> list[list[int]]:
    # Indexes of the physical lines that make up each logical line.
    width = _wrap_width(cleaned, memo)
    groups: list[list[int]] = []
    for index, line in enumerate(cleaned):
        adjacent = index > 0 and numbers[index] == numbers[index - 1] + 1
        if (
            groups
            and adjacent
            and memo.continues.get((cleaned[index - 1], line, width), _continues_key)
        ):
            groups[-1].append(index)
        else:
            groups.append([index])
    return groups


def _continues_key(key: tuple[str, str, int | None]) -> bool:
    return _continues(*key)


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


# A traceback's source line that raises with a literal message: ``raise RuntimeError("...``
# or an f-string, whose text up to its first placeholder is the message's fixed stem.
_RAISE_LITERAL = re.compile(r"^raise (?P<name>[\w.]+)\(\s*[fr]?(?P<q>[\"'])(?P<literal>[^\"'{]*)")


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
    found = _RAISE_LITERAL.match(before.text.strip())
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


def parse_backend_reasons(text: str) -> dict[str, list[str]]:
    """Read ``Reasons: {BACKEND: [reason, ...], ...}`` of a "No valid attention backend" line.

    Args:
        text: the error line; a truncated tail keeps the backends that are complete.

    Returns:
        Backend name to its reasons.
    """
    start = text.find("Reasons: {")
    if start < 0:
        return {}
    reasons: dict[str, list[str]] = {}
    for name, body in re.findall(r"(\w+): \[((?:[^\[\]]|\[[^\[\]]*\])*)\]", text[start + 10 :]):
        reasons[name] = _split_reasons(body)
    return reasons


def _split_reasons(body: str) -> list[str]:
    # Reasons are joined with ", " but may hold a bracketed list and a ", but got N" clause.
    parts: list[str] = []
    for part in re.split(r",\s*(?![^\[]*\])", body):
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
    entry = _entry_by_id("host-oom-killer")
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


def diagnose_log(
    text: str, *, running: bool | None = None, kernel_log: str | None = None
) -> LogDiagnosis:
    """Say what state a vLLM log shows, the failure class and what to do.

    Args:
        text: the log, of any vLLM version, possibly mangled by pasting.
        running: whether the server process is known to be alive; a log that stops without
            an error is ``loading`` when True, ``no-conclusion`` otherwise.
        kernel_log: ``dmesg`` text of the host, to recognise an OOM kill.

    Returns:
        The diagnosis of the last startup in the text (see :func:`diagnose_stream`).
    """
    stream = io.BytesIO(text.encode("utf-8", "surrogateescape"))
    return diagnose_stream(stream, running=running, kernel_log=kernel_log)


def diagnose_stream(
    stream: BinaryIO, *, running: bool | None = None, kernel_log: str | None = None
) -> LogDiagnosis:
    """Diagnose a log read as a stream, in bounded memory whatever its size.

    A file that several launches appended to (``>> vllm.log``) holds several startups: the
    diagnosis is about the last one; the earlier ones are counted with their verdicts.

    Args:
        stream: the log, opened in binary mode.
        running: as for :func:`diagnose_log`.
        kernel_log: as for :func:`diagnose_log`.

    Returns:
        The diagnosis.

    Raises:
        LogError: when the stream is not a text log or cannot be read.
    """
    splitter = _StartupSplitter()
    for number, text in screened_lines(stream):
        splitter.add(number, text)
    last = splitter.finish()
    diagnosis = _diagnose_lines(logical_lines(last.lines()), running, kernel_log)
    diagnosis.first_line = last.first_line
    diagnosis.skipped_lines = last.skipped
    diagnosis.earlier = splitter.earlier
    diagnosis.earlier_counts = dict(splitter.earlier_counts)
    return diagnosis


class _Kept:
    """Values computed from a key, kept from one look at a growing log to the next: a look
    computes only those of keys it has not met. Each look keeps only the values it used
    (:meth:`turn`), so what is kept never outgrows the lines the follower itself keeps."""

    def __init__(self) -> None:
        self._used: dict[Any, Any] = {}
        self._earlier: dict[Any, Any] = {}

    def get(self, key: Any, compute: Any) -> Any:
        value = self._used.get(key, _UNSET)
        if value is _UNSET:
            value = self._earlier.pop(key, _UNSET)
            if value is _UNSET:
                value = compute(key)
            self._used[key] = value
        return value

    def turn(self) -> None:
        self._earlier, self._used = self._used, {}


_UNSET = object()


class LineMemo:
    """What each text of a log was read as: how it was cleaned, its prefixes and message,
    whether it continues the line above, which catalogue patterns and phase it matches. All
    of these depend on the text alone, so a follower that keeps them between looks reads each
    new line once and the lines it has seen at the cost of a lookup; the diagnosis is the same
    with the memo or without it."""

    def __init__(self) -> None:
        self.cleaned = _Kept()
        self.read = _Kept()
        self.wrap_candidate = _Kept()
        self.continues = _Kept()
        self.matches = _Kept()
        self.caseless = _Kept()
        self.phase = _Kept()
        self.year = _Kept()

    def turn(self) -> None:
        """End a look: forget what it did not use."""
        for kept in vars(self).values():
            kept.turn()


class LogFollower:
    """A growing log diagnosed look after look, as a watcher sees it: each look pushes only
    the bytes written since the last (:meth:`feed`); they are screened once and the lines of
    interest kept per startup, and each text is read once (:class:`LineMemo`), so a look costs
    about the same whether the log holds 10 kB or 1 GB of routine lines, early in the startup
    or late.
    """

    def __init__(self) -> None:
        self._screen = LineScreen()
        self._splitter = _StartupSplitter()
        self.size = 0
        self._last: tuple[tuple[object, ...], LogDiagnosis] | None = None
        self._memo = LineMemo()

    def feed(self, data: bytes) -> None:
        """Take the bytes the log grew by.

        Raises:
            LogError: the log runs over ``MAX_RUN_WITHOUT_NEWLINE`` bytes without a line break.
        """
        self.size += len(data)
        for number, text in self._screen.feed(data):
            self._splitter.add(number, text)

    def diagnose(
        self, *, running: bool | None = None, kernel_log: str | None = None
    ) -> LogDiagnosis:
        """The diagnosis of the last startup so far (as :func:`diagnose_stream` of the log).

        A look that brought no line of interest (a serving server's routine lines only) gets
        the last answer again: it is the same lines' diagnosis.
        """
        last = self._splitter.current
        pending = self._screen.pending()
        key = (
            id(last), last.last_line, len(last.head), len(last.tail), last.skipped,
            tuple(pending), len(self._splitter.earlier), running, kernel_log,
        )  # fmt: skip
        if self._last is None or self._last[0] != key:
            self._last = (key, self._diagnosed(last, pending, running, kernel_log))
        kept = self._last[1]
        # The caller's own copy: the kept one answers the next quiet look.
        return replace(kept, earlier=list(kept.earlier), earlier_counts=dict(kept.earlier_counts))

    def _diagnosed(
        self,
        startup: _Startup,
        pending: list[tuple[int, str]],
        running: bool | None,
        kernel_log: str | None,
    ) -> LogDiagnosis:
        lines = logical_lines(startup.lines() + pending, self._memo)
        diagnosis = _diagnose_lines(lines, running, kernel_log, self._memo)
        self._memo.turn()
        diagnosis.first_line = startup.first_line
        diagnosis.skipped_lines = startup.skipped
        diagnosis.earlier = list(self._splitter.earlier)
        diagnosis.earlier_counts = dict(self._splitter.earlier_counts)
        return diagnosis


def _diagnose_lines(
    lines: list[LogLine],
    running: bool | None,
    kernel_log: str | None,
    memo: LineMemo | None = None,
) -> LogDiagnosis:
    # A "# " line (a pasted report's markdown title) is a comment, never read as the log: the
    # diagnosis reads what the server wrote.
    return _diagnose_body(lines, running, kernel_log, memo or LineMemo())


def _diagnose_body(
    lines: list[LogLine], running: bool | None, kernel_log: str | None, memo: LineMemo
) -> LogDiagnosis:
    events = _phase_events(lines, memo)
    found = match_catalogue(lines, memo=memo)
    found = _optional_import_dropped(_tool_parser_dropped(_debug_dropped(found)))
    hits = _survived_dropped(_after_launch(found, lines), events)
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
        if failure.entry.kind == "wrapper" or failure.entry.id in _WRAPPER_CAUSES:
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
            entry = _entry_by_id("host-oom-killer")
            return _failed(FAILED, Hit(entry, killed, 0), [], events, base)
        loop_death = _engine_loop_death(hits, ready_at) if stopped is None else None
        if loop_death is not None:
            entry = _entry_by_id("unrecognised-error")
            diagnosis = _failed(FAILED, Hit(entry, loop_death, 0), [], events, base)
            _report_root_cause(diagnosis, RootCause(_chained_cause(loop_death, lines), None))
            return diagnosis
        bind_error = _error_before_shutdown(lines, ready_at) if stopped is None else None
        if bind_error is not None:
            entry = _entry_by_id("unrecognised-error")
            return _failed(FAILED, Hit(entry, bind_error, 0), [], events, base)
        if stats is not None:
            return _ready(lines, stats.number, base, serving_stats=True, stopped=stopped)
        return _ready(lines, _ready_line(lines, events, ready_at), base, stopped=stopped)
    kills = classify_kernel_log(kernel_log) if kernel_log else []
    if kills:
        return _killed(kills[-1], kernel_log or "", base)
    signalled = _killed_by_signal(lines)
    if signalled is not None and not running:
        entry = _entry_by_id("host-oom-killer")
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
        return _failed(FAILED, Hit(_entry_by_id("unrecognised-error"), logged, 0), [], events, base)
    return _unfinished(lines, events, running, base)


# The server-stopped note's patterns that are uvicorn's (Server.serve logs them only after
# its startup succeeded and its main loop ended): the server had served.
_SERVED_STOP_PATTERNS = (0, 1)
# uvicorn's default log format ("%(levelprefix)s %(message)s": "INFO:     Shutting down"),
# not another program's line of the same words.
_UVICORN_RECORD = re.compile(r"\bINFO:\s+(?:Shutting down|Finished server process)")
_STOPPED = "server-stopped"


def _stop_requested(hits: list[Hit], ready_at: int | None) -> Hit | None:
    """The first line, after the server was up, that says it was asked to stop."""
    if ready_at is None:
        return None
    return next(
        (hit for hit in hits if hit.entry.id == _STOPPED and hit.line.number > ready_at), None
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
            if hit.entry.id == _STOPPED
            and hit.pattern_index in _SERVED_STOP_PATTERNS
            and _UVICORN_RECORD.search(hit.line.raw)
        ),
        None,
    )


# vLLM's API server states its version first thing (vllm/entrypoints/openai/api_server.py
# run_server, vLLM 0.10.2-0.34.0: logger.info("vLLM API server version %s", ...)).
_SERVER_START = re.compile(r"^vLLM API server version ")


def _after_launch(hits: list[Hit], lines: list[LogLine]) -> list[Hit]:
    """The hits of the text from vLLM's own start, when an error of the program that launches
    it (a platform's worker, a wrapper script) comes before that start: the launcher went on
    to start vLLM, so its error did not stop the launch. The start is the last API server
    version line of the text (the splitter has left one startup, whose head may hold the
    launcher's lines). Only stamped lines that carry neither a level opsbook reads nor a
    process prefix are taken for the launcher's: a line of vLLM's logger, or an error quoted
    above the log, is kept wherever it is."""
    start = next((line.number for line in reversed(lines) if _SERVER_START.match(line.text)), None)
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


# The record of a vLLM tool-call parser (vllm/entrypoints/openai/tool_parsers/*_tool_parser.py,
# its logger's location "[hermes_tool_parser.py:110]"): the parsers catch what fails while
# parsing a model's answer and log it, e.g. vLLM 0.8.3 hermes_tool_parser.py extract_tool_calls:
# logger.exception("Error in extracting tool call from response.") then return the answer as
# plain content; the request is answered, the server goes on.
_TOOL_PARSER_RECORD = re.compile(r"\[\w+_tool_parser\.py:\d+\]")


def _tool_parser_dropped(hits: list[Hit]) -> list[Hit]:
    """The hits without uncatalogued errors a tool-call parser logged: a request's handled
    error, not the server's failure."""
    return [
        hit
        for hit in hits
        if hit.entry.kind != "generic" or not _TOOL_PARSER_RECORD.search(hit.line.raw)
    ]


# The dynamic loader's refusal of DeepGEMM's extension: vLLM imports deep_gemm as an option
# and goes on without it (vLLM 0.33.0 vllm/utils/deep_gemm.py _import_deep_gemm: "except
# ImportError", which Python raises for a .so the loader refuses; then the vendored copy).
_OPTIONAL_EXTENSION = re.compile(r"/deep_gemm/[\w.-]+\.so(?:\.\d+)*: undefined symbol: ")


def _optional_import_dropped(hits: list[Hit]) -> list[Hit]:
    """The hits without an optional extension's failed import, when another error is in the
    log: vLLM went on without the extension, so the other error stopped it."""
    optional = {id(hit.line) for hit in hits if _OPTIONAL_EXTENSION.search(hit.line.text)}
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


# What a shell, a container runtime or a service manager prints when the server got SIGKILL
# (exit status 137): the process wrote nothing itself, and the kernel's OOM killer is the
# usual sender. GNU bash jobs.c (notify_of_job_status: an interactive shell's job line
# "[N]+  Killed  cmd"; a script's "NAME: line N: " then pretty_print_job's "PID Killed  cmd",
# strsignal(SIGKILL)); zsh Src/jobs.c (printjob: "zsh: killed  cmd", its lower-case sigmsg);
# a BSD/macOS shell's "Killed: 9"; docker compose ("exited with code 137") and docker ps
# ("Exited (137)"); systemd src/core/unit.c and service.c ("A process of this unit has been
# killed by the OOM killer.", "Failed with result 'oom-kill'.", "Main process exited,
# code=killed, status=9/KILL"); Kubernetes' container state reason "OOMKilled".
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
_TRACEBACK = re.compile(r"^Traceback \(most recent call last\)")


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


# Where a startup begins: vLLM's banner (or argparse's usage line), the API server's version
# line, its arguments line (vllm/entrypoints/openai/api_server.py, vllm/entrypoints/utils.py).
# A marker that the current startup has already passed, or a new API-server PID, begins the
# next one.
_STARTUP_MARKERS = (
    re.compile(r"^usage: vllm |[█▄▀]\s+version v?\d"),
    re.compile(r"vLLM API server version "),
    re.compile(r"\bnon-default args: |\bargs: Namespace\("),
)
_API_SERVER_PID = re.compile(r"\(APIServer pid=(\d+)\)")
# A run that has failed prints no startup marker: one after its error begins the next run
# (a reporter's second attempt pasted below the first, whose own start the excerpt cut).
_RUN_ERROR = re.compile(
    r"Traceback \(most recent call last\)|\b[A-Z]\w*(?:Error|Exception)\b: |^\S+: error: "
)
# Bounds on what one startup keeps: its first and its last lines of interest.
STARTUP_HEAD_LINES = 10_000
STARTUP_TAIL_LINES = 10_000
EARLIER_LISTED = 1_000


@dataclass(frozen=True)
class EarlierStartup:
    """The verdict on a startup that a later one in the same file followed."""

    first_line: int
    last_line: int
    state: str
    failure: str | None
    line: int | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "first_line": self.first_line,
            "last_line": self.last_line,
            "state": self.state,
            "failure": self.failure,
            "line": self.line,
        }


class _Startup:
    """The lines of interest of one startup: the first ones and, bounded, the last ones."""

    def __init__(self, first_line: int) -> None:
        self.first_line = first_line
        self.last_line = first_line
        self.head: list[tuple[int, str]] = []
        self.tail: deque[tuple[int, str]] = deque(maxlen=STARTUP_TAIL_LINES)
        self.skipped = 0
        self.marker = -1
        self.api_pid: str | None = None
        self.errored = False

    def add(self, number: int, text: str) -> None:
        self.last_line = number
        if len(self.head) < STARTUP_HEAD_LINES:
            self.head.append((number, text))
            return
        if len(self.tail) == self.tail.maxlen:
            self.skipped += 1
        self.tail.append((number, text))

    def lines(self) -> list[tuple[int, str]]:
        return self.head + list(self.tail)


def _may_be_error(text: str) -> bool:
    # Substring tests first: the splitter sees every screened line of a long log.
    return "rror" in text or "xception" in text or "Traceback" in text


class _StartupSplitter:
    def __init__(self) -> None:
        self.current = _Startup(1)
        self.earlier: list[EarlierStartup] = []
        self.earlier_counts: Counter[str] = Counter()

    def add(self, number: int, text: str) -> None:
        plain = _ANSI.sub("", text) if "[" in text else text
        marker = next((i for i, p in enumerate(_STARTUP_MARKERS) if p.search(plain)), None)
        pid_found = _API_SERVER_PID.search(plain)
        pid = pid_found.group(1) if pid_found else None
        current = self.current
        restarted = marker is not None and (current.marker >= marker or current.errored)
        if restarted or self._new_api_server(pid):
            self._close(number)
            current = self.current
        if marker is not None:
            current.marker = max(current.marker, marker)
        if pid and current.api_pid is None:
            current.api_pid = pid
        # A comment pasted with the log (a shell's, a provenance note) is not a run's error.
        if (
            not current.errored
            and _may_be_error(plain)
            and not _COMMENT.match(plain)
            and _RUN_ERROR.search(plain)
        ):
            current.errored = True
        current.add(number, text)

    def _new_api_server(self, pid: str | None) -> bool:
        # One run's lines all carry the API server's PID prefix or none do: a PID prefix after
        # a started run without one, or another PID, is the next run.
        current = self.current
        if pid is None:
            return False
        return pid != current.api_pid if current.api_pid else current.marker >= 0

    def finish(self) -> _Startup:
        return self.current

    def _close(self, next_first: int) -> None:
        startup = self.current
        verdict = _diagnose_lines(logical_lines(startup.lines()), False, None)
        self.earlier_counts[verdict.state] += 1
        self.earlier.append(
            EarlierStartup(
                startup.first_line,
                startup.last_line,
                verdict.state,
                verdict.failure,
                verdict.line.number if verdict.line else None,
            )
        )
        del self.earlier[:-EARLIER_LISTED]
        self.current = _Startup(next_first)


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
    if entry.id == "oom":
        stage = _oom_stage(events, chosen.line.number)
        if stage:
            numbers["phase"] = stage
    if entry.id in ("no-backend", "fp8kv-mla") and "Reasons: {" in chosen.line.text:
        numbers["reasons"] = parse_backend_reasons(chosen.line.text)
    wrappers = [h.line for h in hits if h.entry.kind == "wrapper"]
    wrapper = wrappers[-1] if wrappers and entry.kind != "wrapper" else None
    if entry.id == "nccl-timeout" and "rank" not in numbers:
        rank = re.fullmatch(r"rank(\d+)", chosen.line.process or "")
        if rank:
            numbers["rank"] = int(rank.group(1))
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


# Catalogue classes that only say a process died: the cause is that process's first error.
_WRAPPER_CAUSES = ("ray-node-died",)
_EXCEPTION_LINE = re.compile(r"^" + EXCEPTION_NAME + r"(?:\(\w+\))?(?::|$)")
_NOT_A_CAUSE = re.compile(r"^(?:Traceback \(most recent call last\)|During handling of|The above)")
_API_SERVER = re.compile(r"^(?:APIServer|ApiServer)")
# The engine core's dump of its state when it dies, logged at ERROR above its own record of
# the death (vLLM 0.10.2-0.34.0 vllm/logging_utils/dump_input.py _dump_engine_exception:
# "Dumping input data for V1 LLM engine (v%s) with config: %s, ", "Dumping scheduler output
# for model execution: %s", "Dumping scheduler stats: %s"; "Error preparing object to dump"
# when the dump itself fails): the inputs of the failed step, never its error.
_STATE_DUMP = re.compile(
    r"^(?:Dumping input data for V1 LLM engine|Dumping scheduler output for model execution"
    r"|Dumping scheduler stats|Error preparing object to dump)"
)


@dataclass(frozen=True)
class RootCause:
    """The first error of the process that failed, under a wrapper error."""

    line: LogLine
    entry: CatalogueEntry | None


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
    wrapper_lines |= {h.line.number for h in hits if h.entry.id in _WRAPPER_CAUSES}
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
        and not _STATE_DUMP.match(line.text)
        and (line.number in named or _is_error_line(line))
    ]
    candidates = _not_gone_past(candidates, events, wrapper)
    # An optional extension's refused import was gone past (vLLM imports it as an option).
    required = [line for line in candidates if not _OPTIONAL_EXTENSION.search(line.text)]
    candidates = required or candidates
    if not candidates:
        return None
    others = [line for line in candidates if not _API_SERVER.match(line.process or "")]
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
    if message.exception or message.level is None or _NAMES_A_VALUE.search(message.text):
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


# The wrappers of a failed startup: vLLM 0.10.2-0.34.0 vllm/v1/engine/utils.py ("Engine core
# initialization failed. See root cause above."), vllm/v1/engine/core.py ("EngineCore failed
# to start."), vllm/v1/executor/multiproc_executor.py ("WorkerProc initialization failed due
# to an exception in a background process", "WorkerProc failed to start."); V0's
# vllm/entrypoints/openai/api_server.py 0.10.2 ("Engine process failed to start.").
_STARTUP_WRAPPER = re.compile(
    r"Engine core initialization failed|EngineCore failed to start"
    r"|WorkerProc initialization failed|WorkerProc failed to start|Engine process failed to start"
    r"|" + r"error raised in its creation task"
)
# Ray's wrapper of an actor whose constructor raised (ray python/ray/exceptions.py
# ActorDiedError, ray 2.58.0: "The actor died because of an error raised in its creation task,
# {cause}", the cause being the RayTaskError's text: "ray::Actor.__init__() ...", the
# traceback, the exception): the actor's own error follows it and is the failure; no node or
# process was lost.
_CREATION_TASK = re.compile(r"error raised in its creation task")


def _root_cause_below(lines: list[LogLine], hits: list[Hit], wrapper: LogLine) -> RootCause | None:
    """With no error of the failed process above a startup wrapper, the first exception below
    it: the failed process writes its traceback to the same terminal as the API server, and
    two processes' output interleaves (a reporter also often pastes the process's own error
    under the wrapper's). Only below a wrapper of the startup, when no request is in flight
    (below a dead engine's wrapper while serving, the requests' cancellations follow), and
    only an exception line (ERROR lines below a wrapper are the shutdown's)."""
    if not _STARTUP_WRAPPER.search(wrapper.text):
        return None
    wrapper_lines = {h.line.number for h in hits if h.entry.kind == "wrapper"}
    wrapper_lines |= {h.line.number for h in hits if h.entry.id in _WRAPPER_CAUSES}
    for line in lines:
        if (
            line.number > wrapper.number
            and line.number not in wrapper_lines
            and not line.is_code
            and bool(_EXCEPTION_LINE.match(line.text))
            and not _API_SERVER.match(line.process or "")
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


# Ray's exception for a task that raised (ray python/ray/exceptions.py, ray 2.60.0:
# as_instanceof_cause names the class f"RayTaskError({cause_cls.__name__})"; __str__ puts
# f"{self.proctitle}() (pid={self.pid}, ip={self.ip}" in place of the traceback's first line,
# the task's traceback and its exception line following): the header names the class only.
_RAY_TASK_HEADER = re.compile(r"RayTaskError\((?P<cause>\w+)\): ray::\S*\(\) \(pid=\d+")


def _ray_task_cause(failure: Hit, hits: list[Hit]) -> Hit:
    """For Ray's RayTaskError(X) header, the exception line X of the task's traceback under
    it (the first such line hit after it), which states the error."""
    header = _RAY_TASK_HEADER.search(failure.line.text)
    if header is None:
        return failure
    cause = re.compile(r"^(?:[\w.]+\.)?" + re.escape(header["cause"]) + r": \S")
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


# V0's multiprocessing engine's record of the error that ended its loop (vLLM 0.10.2
# vllm/engine/multiprocessing/engine.py MQLLMEngine.start: except Exception as e:
# logger.exception(repr(e)), then the loop is over): the exception's repr as the message of an
# ERROR record of engine.py. Every request after it gets MQEngineDeadError("Engine loop is not
# running. Inspect the stacktrace to find the original error: ...") (vllm/engine/
# multiprocessing/__init__.py ENGINE_DEAD_ERROR): the server no longer serves. A request's own
# error (a 400, a refused prompt) is logged by the API server, not as this record.
_ENGINE_LOOP_DEATH = re.compile(r"\bengine\.py:\d+\]\s+" + EXCEPTION_NAME + r"\([\"']")
_ENGINE_LOOP_DEAD = re.compile(r"Engine loop is not running")


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
            and _ENGINE_LOOP_DEATH.search(hit.line.raw)
        ),
        None,
    )


def _engine_loop_root(lines: list[LogLine], hits: list[Hit], wrapper: LogLine) -> RootCause | None:
    """Under V0's MQEngineDeadError, the engine loop's own record of its error, wherever it
    is: the API server's wrapper and the engine's record are two processes' output and
    interleave (the wrapper often comes first)."""
    if not _ENGINE_LOOP_DEAD.search(wrapper.text):
        return None
    death = _engine_loop_death(hits, None)
    if death is None:
        return None
    line = _chained_cause(death, lines)
    best = _best_cause(hits, line)
    return RootCause(line, best)


# The engine core's record of its own death, its traceback logged under the same prefix
# (vLLM 0.10.2-0.34.0 vllm/v1/engine/core.py run_engine_core: logger.exception("EngineCore
# encountered a fatal error."); V1 before 0.8.5: logger.error("EngineCore hit an exception:
# %s", traceback), the traceback starting on the message's line); V0's background loop's
# (vLLM 0.10.2 vllm/engine/async_llm_engine.py: logger.error("Engine background task failed",
# exc_info=e)); a worker's and a failed start's (0.10.2-0.34.0 logger.exception:
# vllm/v1/executor/multiproc_executor.py "WorkerProc hit an exception." and "WorkerProc failed
# to start.", "WorkerProc failed.", vllm/v1/engine/core.py "EngineCore failed to start.",
# vllm/worker/worker_base.py (0.10.2) and vllm/v1/worker/worker_base.py "Error executing
# method %r. ..."), and V0's multiprocessing worker's (0.10.2
# vllm/executor/multiproc_worker_utils.py "Exception in worker %s while processing method %s.").
_DEATH_RECORD = re.compile(
    r"EngineCore encountered a fatal error|EngineCore hit an exception"
    r"|Engine background task failed|WorkerProc hit an exception|WorkerProc failed to start"
    r"|EngineCore failed to start|Error executing method|WorkerProc failed\."
    r"|Exception in worker \S+ while processing method"
)


def _best_cause(hits: list[Hit], line: LogLine) -> CatalogueEntry | None:
    """The highest-priority cause entry hit on ``line``, if any."""
    causes = [hit.entry for hit in hits if hit.line is line and hit.entry.kind == "cause"]
    return max(causes, key=lambda entry: entry.priority) if causes else None


def _own_record_root(lines: list[LogLine], hits: list[Hit], wrapper: LogLine) -> RootCause | None:
    """For an engine core's record of its death, the exception that closes the record: the
    lines after it with its level, time and process (other processes' lines interleaved with
    them skipped: several workers' tracebacks often are). Nothing when an excerpt cuts the
    record before its exception (the wrapper is then all the log shows)."""
    if not _DEATH_RECORD.search(wrapper.text) or wrapper.level is None:
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
    if failure.entry.id in _WRAPPER_CAUSES:
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


def _position(lines: Sequence[LogLine], line: LogLine) -> int:
    """Where ``line`` (that very line, not an equal one) is in ``lines``."""
    return next(i for i, each in enumerate(lines) if each is line)


def _number_of(line: LogLine) -> int:
    return line.number


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
    if root is None and wrapper is not None and _DEATH_RECORD.search(wrapper.text):
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
    raised_in_constructor = bool(_CREATION_TASK.search(wrapper.text)) if wrapper else False
    if root.entry is not None:
        if raised_in_constructor or not (
            root.entry.family and diagnosis.failure in _WRAPPER_CAUSES
        ):
            # A known class outside the shared ids counts as an uncatalogued error: under a
            # Ray death the node or actor loss keeps its class (as below).
            diagnosis.failure = root.entry.failure
        diagnosis.error_class = root.entry.error_class
        diagnosis.title = root.entry.title
        diagnosis.remedy = root.entry.remedy
        diagnosis.source = root.entry.source
        return
    if diagnosis.failure and (
        _entry_by_id(diagnosis.failure).kind == "wrapper" or raised_in_constructor
    ):
        # The log shows the root error and the catalogue does not know it: an unrecognised
        # error (engine-dead is a wrapper with no error of the failed process above it). A
        # Ray death keeps its class: the node or actor loss is itself the finding.
        diagnosis.failure = _entry_by_id("unrecognised-error").id
    diagnosis.title = f"the process died; its first error ({where}): {root.line.text}"
    diagnosis.remedy = (
        f"The root cause is the first error of the failed process ({where}): "
        f"{root.line.text!r}. It is not in opsbook's catalogue: read its traceback and search "
        "the vLLM issues for it."
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
    if serving_stats and (_REQUEST_TAKEN.match(line.text) or _ACCESS.match(line.text)):
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
    entry = _entry_by_id("host-oom-killer")
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
    suspect = _entry_by_id("host-oom-killer")
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
    nccl = [line for line in lines if line.number > progress_at and _NCCL_INIT.search(line.text)]
    entry = _entry_by_id("nccl")
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


_STATUS_ONLY = re.compile(r"\b\d{3} (?:Client|Server) Error\b")


def _bare_message_line(line: LogLine) -> bool:
    return not (line.exception or line.level or line.timestamp or line.process)


# vLLM's own message over the error it caught, quoting it before re-raising it (vLLM
# 0.13.0-0.21.0+ vllm/v1/worker/gpu_model_runner.py load_model: logger.error(f"{msg} (original
# error: {e})") with msg "Failed to load model - not enough GPU memory. ...", then raise e).
_QUOTES_ORIGINAL = re.compile(r"\(original error: ")


def _pick_line(hits: list[Hit]) -> Hit:
    # The entry's first pattern names its most telling line; among equals, the raised error
    # rather than a message quoting it, then the earliest. A raised exception's line wins
    # over the bare lines of a message (no level, time or process of their own: the lines
    # its multi-line message goes on with, e.g. huggingface_hub's "Cannot access gated repo
    # for url ..." under transformers' "OSError: You are trying to access a gated repo.").
    # An exception line that only states an HTTP status (huggingface_hub's "404 Client
    # Error. (Request ID: ...)", requests' HTTPError) leaves the cause to the lines under it.
    raised = any(hit.line.exception and not _STATUS_ONLY.search(hit.line.text) for hit in hits)
    return min(
        hits,
        key=lambda hit: (
            raised and _bare_message_line(hit.line),
            hit.pattern_index,
            bool(_QUOTES_ORIGINAL.search(hit.line.text)),
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
    return any(_NCCL_INIT.search(line.text) for line in lines if line.number > progress_at)


def _oom_stage(events: list[tuple[LogLine, str]], at: int) -> str | None:
    before = [(line, name) for line, name in events if line.number < at]
    furthest = _furthest_phase(before)
    if furthest is None:
        return None
    if furthest in ("args", "engine-config", "backend"):
        return "loading"
    if furthest == "weights":
        done = any(_WEIGHTS_DONE.search(line.text) for line, _ in before)
        return "profiling" if done else "loading"
    if furthest in ("compile", "kv-cache"):
        return "profiling"
    return "graph capture" if furthest == "graphs" else "serving"


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


def _parse_values(entry: CatalogueEntry, lines: Sequence[LogLine]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for line in lines:
        for pattern in entry.patterns + entry.parse:
            found = pattern.search(line.text)
            if not found:
                continue
            for key, value in found.groupdict().items():
                if value is not None and key not in values:
                    values[key] = _number(value)
                    gib = _gib(value)
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


def _number(value: str) -> Any:
    if re.fullmatch(r"\d+", value):
        return int(value)
    if re.fullmatch(r"\d+\.\d+", value):
        return float(value)
    return value.strip()


def _gib(value: str) -> float | None:
    found = _SIZE.match(value.strip())
    if not found:
        return None
    unit = found.group(2)
    power = _SIZE_POWERS["bytes" if unit == "bytes" else unit[0]]
    return round(float(found.group(1)) * 1024.0 ** (power - 3), 6)


def _entry_by_id(entry_id: str) -> CatalogueEntry:
    return next(entry for entry in _catalogue() if entry.id == entry_id)


@lru_cache(maxsize=8)
def _screen(entries: tuple[CatalogueEntry, ...]) -> re.Pattern[str]:
    # One pass of all patterns at once: most lines of a long log match none of them.
    alternatives = (_NAMED_GROUP.sub("(?:", p.pattern) for e in entries for p in e.patterns)
    return re.compile("|".join(f"(?:{alternative})" for alternative in alternatives))


_NAMED_GROUP = re.compile(r"\(\?P<\w+>")


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


def _first_year(lines: Iterable[str], memo: LineMemo) -> int:
    years = (memo.year.get(line, _year_in) for line in lines)
    return next((year for year in years if year is not None), PLACEHOLDER_YEAR)


def _year_in(line: str) -> int | None:
    found = _FULL_DATE.search(line)
    return int(found.group(1)) if found else None


def _roll_years(lines: list[LogLine]) -> list[LogLine]:
    # A log that runs over New Year goes from 12-31 to 01-01; keep its times increasing. Only
    # that step adds a year: logs appended to one file also step back in time, and a stamp
    # that would leave the calendar keeps its year.
    years = 0
    previous: datetime | None = None
    rolled = []
    for line in lines:
        stamp = line.timestamp
        if stamp is not None:
            if previous is not None and previous.month == 12 and stamp.month == 1:
                years += 1
            if years:
                line = replace(line, timestamp=_add_years(stamp, years))
            previous = stamp
        rolled.append(line)
    return rolled


def _add_years(stamp: datetime, years: int) -> datetime:
    try:
        return stamp.replace(year=stamp.year + years)
    except ValueError:  # past year 9999, or 02-29 in a year that has none
        return stamp


def _has_prefix(line: str) -> bool:
    return any(p.match(line) for p in _PREFIXES) or bool(_COMPOSE.match(line) or _TAG.match(line))


def _wrap_candidate(line: str) -> bool:
    if not line or line[0].isspace():
        return False
    return not _has_prefix(line) and not _LINE_START.match(line)


def _wrap_width(cleaned: list[str], memo: LineMemo) -> int | None:
    # A terminal cuts every long line at the same column: that column, seen twice, is the width.
    widths = Counter(
        len(previous)
        for previous, line in zip(cleaned, cleaned[1:], strict=False)
        if len(previous) >= _MIN_WRAP_WIDTH and memo.wrap_candidate.get(line, _wrap_candidate)
    )
    if not widths:
        return None
    width, count = widths.most_common(1)[0]
    return width if count >= 2 else None


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


def _line_dict(line: LogLine | None) -> dict[str, Any] | None:
    if line is None:
        return None
    return {"number": line.number, "raw": line.raw, "text": line.text}


def _root_dict(line: LogLine | None) -> dict[str, Any] | None:
    found = _line_dict(line)
    if found is not None and line is not None:
        found["process"] = line.process
    return found


def _iso(stamp: datetime | None) -> str | None:
    return stamp.isoformat() if stamp else None
