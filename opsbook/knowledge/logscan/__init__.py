"""Read a vLLM log of any version and say what state the server reached and why.

Logs come from many vLLM versions (V0 ``INFO 10-12 00:26:58 launcher.py:27]``, V1
``(EngineCore_DP0 pid=N) INFO 03-12 10:11:12 [core.py:123]``, ``[rank0]:``, Ray
``(RayWorkerWrapper pid=N)``) and arrive mangled: raw ANSI colour codes, ``> `` quoting and
``**`` from pasted issues, lines wrapped by a terminal, a truncated tail. Every log line is
normalised first (``LogLine.text``) while its original text is kept (``LogLine.raw``), so a
reported line can always be found again with ``grep -F``.

What lines say is data (``opsbook/knowledge/data/failures.yaml``: the failure classes, and the
signals of phases, readiness and records); this package reads lines, finds the startup phases,
matches the catalogue and decides the state:

    failure after the last "ready" line  -> failed   (specific cause > wrapper > generic)
    shared-memory stall persists / last  -> hung
    "Application startup complete."      -> ready
    otherwise, process known running     -> loading  (at the furthest phase seen)
    otherwise                            -> no-conclusion (stopped during a phase, with a suspect)

Modules, by job: ``line_grammar`` (how a line is written), ``log_lines`` (logical lines),
``startup_phases``, ``catalogue`` (the YAML as typed entries), ``matching``, ``diagnosis`` (the
types), ``filters``, ``details``, ``readiness``, ``root_cause`` (the wrapper walk), ``decision``,
``follower`` (streams and growing logs), ``startup_shapes`` (a startup's shape; a crash loop's
repeated startup told at once), ``stream`` (the bounded line reader).
"""

from opsbook.knowledge.logscan.catalogue import (
    CONTEXT_WINDOW,
    KINDS,
    CatalogueEntry,
    Hit,
    failure_for,
    load_catalogue,
)
from opsbook.knowledge.logscan.decision import classify_kernel_log, parse_backend_reasons
from opsbook.knowledge.logscan.diagnosis import (
    FAILED,
    HUNG,
    LOADING,
    NO_CONCLUSION,
    READY,
    EarlierStartup,
    LogDiagnosis,
    OomKill,
    RootCause,
)
from opsbook.knowledge.logscan.follower import (
    EARLIER_LISTED,
    FATAL,
    STARTUP_HEAD_LINES,
    STARTUP_TAIL_LINES,
    UNDECIDED,
    WENT_ON,
    LogFollower,
    diagnose_log,
    diagnose_stream,
)
from opsbook.knowledge.logscan.line_grammar import EXCEPTION_NAME, PLACEHOLDER_YEAR
from opsbook.knowledge.logscan.log_lines import (
    LineMemo,
    LogLine,
    logical_lines,
    normalise_line,
    read_log_lines,
)
from opsbook.knowledge.logscan.matching import match_catalogue
from opsbook.knowledge.logscan.startup_phases import (
    PHASE_NAMES,
    PHASE_PATTERNS,
    Phase,
    find_version,
    phases,
)

__all__ = [
    "CONTEXT_WINDOW",
    "EARLIER_LISTED",
    "EXCEPTION_NAME",
    "FAILED",
    "FATAL",
    "HUNG",
    "KINDS",
    "LOADING",
    "NO_CONCLUSION",
    "PHASE_NAMES",
    "PHASE_PATTERNS",
    "PLACEHOLDER_YEAR",
    "READY",
    "STARTUP_HEAD_LINES",
    "STARTUP_TAIL_LINES",
    "UNDECIDED",
    "WENT_ON",
    "CatalogueEntry",
    "EarlierStartup",
    "Hit",
    "LineMemo",
    "LogDiagnosis",
    "LogFollower",
    "LogLine",
    "OomKill",
    "Phase",
    "RootCause",
    "classify_kernel_log",
    "diagnose_log",
    "diagnose_stream",
    "failure_for",
    "find_version",
    "load_catalogue",
    "logical_lines",
    "match_catalogue",
    "normalise_line",
    "parse_backend_reasons",
    "phases",
    "read_log_lines",
]
