"""The plain ways the benches measure opsbook against: ssh as an operator types it (with or
without a reused connection), and ``grep -E`` of the failure catalogue's fatal patterns.

The catalogue's patterns are Python regexes searched in each normalised log line; grep searches
the raw line. :func:`ere_of` turns one into a POSIX extended regex GNU grep takes, matching at
least what the Python one matches on vLLM's own lines: non-capturing and named groups become
plain groups, lookarounds are dropped, ``^`` (the message's start) allows vLLM's line prefix
before it, lazy quantifiers become greedy, ``\\d`` becomes ``[0-9]``.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from opsbook.core.deployment import HostSpec

LOOKAROUND = ("(?=", "(?!", "(?<=", "(?<!")
# Where a vLLM log line's message begins, as an operator writes it for grep: an optional
# process prefix ``(EngineCore_DP0 pid=N)``, rank ``[rank0]:`` and ``INFO 03-12 10:11:12
# [core.py:123]`` (the catalogue's ``^`` means the message's start: logscan removes these).
MESSAGE_START = (
    r"^(\([^)]* pid=[0-9]+\) *)?(\[rank[0-9]+\]: *)?"
    r"([A-Z]+ [0-9-]+ [0-9:.]+ (\[[^]]*\] *)?)?"
)
# GNU grep -E knows \s \S \w \W \b \B; \d is Python's alone.
DIGIT = "0-9"


def fatal_patterns() -> list[str]:
    """The catalogue's patterns of its error classes (causes, wrappers, stalls, generic), as
    Python regexes (``<EXCEPTION>`` expanded)."""
    from opsbook.knowledge.logscan import catalogue

    return [
        p.pattern for e in catalogue.load_catalogue() if e.severity == "error" for p in e.patterns
    ]


def fatal_ere() -> str:
    """One ``grep -E`` pattern: any of the catalogue's fatal patterns."""
    return "|".join(dict.fromkeys(ere_of(p) for p in fatal_patterns()))


def ere_of(pattern: str) -> str:
    """A Python regex as a GNU ERE matching at least the same lines (see the module)."""
    out: list[str] = []
    i, in_class = 0, False
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            escaped = pattern[i : i + 2]
            if escaped == r"\d":
                out.append(DIGIT if in_class else f"[{DIGIT}]")
            else:
                out.append(escaped)
            i += 2
            continue
        if in_class:
            out.append(c)
            in_class = c != "]"  # a leading ] was taken with the [
            i += 1
            continue
        if c == "[":
            in_class = True
            out.append(c)
            if pattern[i + 1 : i + 2] == "^":
                out.append("^")
                i += 1
            if pattern[i + 1 : i + 2] == "]":  # a leading ] is a member
                out.append("]")
                i += 1
            i += 1
            continue
        if pattern.startswith(LOOKAROUND, i):
            i = _group_end(pattern, i)
            continue
        if pattern.startswith("(?:", i):
            out.append("(")
            i += 3
            continue
        if pattern.startswith("(?P<", i):
            out.append("(")
            i = pattern.index(">", i) + 1
            continue
        if c == "?" and out and out[-1] in ("*", "+", "?", "}"):
            i += 1  # lazy: greedy matches the same lines
            continue
        if c == "^":
            out.append(MESSAGE_START)
            i += 1
            continue
        out.append(c)
        i += 1
    return "".join(out)


def _group_end(pattern: str, start: int) -> int:
    """The index after the group that opens at ``start`` (escapes and classes skipped)."""
    depth, i, in_class = 0, start, False
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            i += 2
            continue
        if in_class:
            in_class = c != "]"
        elif c == "[":
            in_class = True
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    raise ValueError(f"unbalanced group in {pattern!r}")


def grep_fatal(path: Path) -> list[str]:
    """``grep -E`` of the fatal patterns, every matching line (what an operator pipes to
    ``tail`` to see the last failure). ``LC_ALL=C``: the patterns are ASCII, and GNU grep in a
    UTF-8 locale takes 20-100x longer on them (50 MB of real logs: 100 s against 5 s), which
    an operator grepping big logs knows to avoid; ``-a``: a stray binary byte leaves it text."""
    return ["env", "LC_ALL=C", "grep", "-a", "-E", "-e", fatal_ere(), str(path)]


def ssh_argv(spec: HostSpec, control: Path | None = None) -> list[str]:
    """``ssh`` to a host as an operator's config would have it; with ``control``, over the
    master connection at that socket (``ControlMaster``/``ControlPath``)."""
    argv = ["ssh", "-i", str(spec.key), "-o", f"UserKnownHostsFile={spec.known_hosts}"]
    argv += ["-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-p", str(spec.port)]
    if control is not None:
        argv += ["-o", "ControlMaster=auto", "-o", f"ControlPath={control}"]
        argv += ["-o", "ControlPersist=300"]
    return [*argv, f"{spec.user}@{spec.address}"]


def open_master(spec: HostSpec, control: Path) -> None:
    """Open the master connection at ``control`` (it persists in the background)."""
    subprocess.run([*ssh_argv(spec, control), "true"], check=True, capture_output=True)


def close_master(spec: HostSpec, control: Path) -> None:
    """Stop the master connection at ``control`` (``ssh -O exit``: the master's own way)."""
    argv = ssh_argv(spec, control)
    subprocess.run([*argv[:-1], "-O", "exit", argv[-1]], capture_output=True)


def check_ere_compiles(ere: str) -> None:
    """GNU grep refuses a bad ERE with exit 2: a conversion gone wrong is an error here, not a
    baseline that silently matches nothing."""
    done = subprocess.run(["grep", "-E", "-e", ere, "/dev/null"], capture_output=True, text=True)
    if done.returncode == 2:
        raise ValueError(f"grep -E refuses the fatal patterns: {done.stderr.strip()}")


def matches(ere: str, line: str) -> bool:
    """Whether ``grep -E`` matches ``line`` (for checks of the conversion)."""
    done = subprocess.run(["grep", "-q", "-E", "-e", ere], input=line, text=True)
    return done.returncode == 0
