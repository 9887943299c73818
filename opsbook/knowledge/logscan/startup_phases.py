"""The startup phases a log shows, and the vLLM version it states."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from opsbook.knowledge.logscan.log_lines import LineMemo, LogLine, read_log_lines

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


_VERSION_PATTERNS = (
    re.compile(r"vLLM API server version v?(\d[\w.+-]*)"),
    re.compile(r"Initializing an? (?:V1 )?LLM engine \(v(\d[\w.+-]*)\)"),
    re.compile(r"[█▄▀]\s+version v?(\d+\.\d+[\w.+-]*)"),
    re.compile(r"\b[vV][lL][lL][mM]\b[^\n]{0,20}?\bversion:? v?(\d+\.\d+[\w.+-]*)"),
    re.compile(r"\bvllm==(\d+\.\d+[\w.+-]*)"),
)

_WEIGHTS_DONE = re.compile(r"Loading weights took|Model loading took|Loading model weights took")


@dataclass(frozen=True)
class Phase:
    """A startup phase and the first line that shows it."""

    name: str
    first_line_no: int
    timestamp: datetime | None


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
