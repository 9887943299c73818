"""The hazards of stopping processes: killing by pattern (which may kill the line itself),
SIGKILL as the first resort, and ``sleep`` as a wait for a process to exit."""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence

from opsbook.core.results import Finding
from opsbook.knowledge.lint.hazard_codes import (
    PATTERN_KILL,
    SIGKILL_FIRST,
    SLEEP_WAIT,
    hazard,
)
from opsbook.knowledge.lint.kill_parse import KillCall
from opsbook.knowledge.lint.shell_words import KEYWORDS, SimpleCommand, command_name

KILL_TOOLS = ("kill", "pkill", "killall")
# Kill patterns searched for in the whole line (each search is a pass over the line): past
# this many distinct ones, a pattern is assumed to match the line, which keeps the time linear.
MAX_PATTERN_SCANS = 64
# A pattern without these matches the line wherever it matches a piece of it.
CONTEXT_SENSITIVE = re.compile(r"[\\^$]|\(\?")
VLLM_PROCESS_TITLES = ("VLLM::EngineCore", "VLLM::Worker_TP0")
STOP_BY_PID = (
    "stop the server by the PID or process group recorded when it was started "
    "(kill -TERM -- -PGID), wait for it to exit, and only then SIGKILL what is left"
)
SOURCE_SELF_KILL = (
    "vllm-facts section 8: solana-labs/solana#7603, Ikalus1988/MisakaNet#1899, "
    "indexable-inc/index#2309"
)


def pattern_kill_findings(
    command: str, commands: Sequence[SimpleCommand], kills: Sequence[KillCall]
) -> list[Finding]:
    own_text = f"bash -c {command}"
    has_kill = any(k.tool in KILL_TOOLS for k in kills)
    nested = _has_compound(commands)
    scans = _LineSearch(own_text, command)
    findings = []
    for call in kills:
        if call.pattern is None or call.tool == "kill":
            continue
        if call.tool == "pgrep" and not (call.full and has_kill):
            continue
        if call.tool == "killall" or not call.full:
            findings.append(_name_kill_finding(call))
            continue
        self_match = (
            shell_outlives(commands, call.index, nested)
            and not call.ignore_ancestors
            and scans.matches(call)
        )
        findings.append(_full_kill_finding(call, scans, self_match))
    return findings


class _LineSearch:
    """Searches of kill patterns in the line, each distinct one at most once, and at most
    :data:`MAX_PATTERN_SCANS` passes over the whole line (then the worst is assumed)."""

    def __init__(self, own_text: str, command: str):
        self.own_text = own_text
        self.command = command
        self._found: dict[tuple[str, bool], bool] = {}
        self._bracket: dict[tuple[str, bool], bool] = {}

    def matches(self, call: KillCall) -> bool:
        pattern = call.pattern or ""
        # Inside its own command the pattern usually matches its own text: found without a
        # pass over the line, and a match in a piece is a match in the whole when the pattern
        # has no anchor, boundary or look-around.
        if call.span is not None and not CONTEXT_SENSITIVE.search(pattern):
            piece = self.command[call.span[0] : call.span[1]]
            if _search(pattern, piece, call.ignore_case):
                return True
        key = (pattern, call.ignore_case)
        if key not in self._found:
            if len(self._found) >= MAX_PATTERN_SCANS:
                return True
            self._found[key] = _search(pattern, self.own_text, call.ignore_case)
        return self._found[key]

    def bracket_fails(self, call: KillCall) -> bool:
        """Whether the bracket trick still matches the line (it holds the target text)."""
        pattern = call.pattern or ""
        key = (pattern, call.ignore_case)
        if key not in self._bracket:
            if len(self._bracket) >= MAX_PATTERN_SCANS:
                return False
            bracket = bracketed(pattern)
            text = self.own_text.replace(pattern, bracket)
            self._bracket[key] = _search(bracket, text, call.ignore_case)
        return self._bracket[key]


def _name_kill_finding(call: KillCall) -> Finding:
    return hazard(
        "warning",
        PATTERN_KILL,
        call.source,
        f"{call.tool} kills every process named {call.pattern!r} (any user's server, any "
        "script), not only the one opsbook started; and vLLM's children rename themselves "
        "VLLM::EngineCore and VLLM::Worker_TP*, so the server's name misses them",
        STOP_BY_PID,
        "vllm-facts sections 6 and 8",
    )


def _full_kill_finding(call: KillCall, scans: _LineSearch, self_match: bool) -> Finding:
    pattern = call.pattern or ""
    notes = []
    if self_match:
        kills_it = "pkill kills" if call.tool == "pkill" else "pgrep lists, and the kill kills,"
        notes.append(
            f"the pattern {pattern!r} also matches this command line itself: sent as "
            "ssh host '...' (or bash -c), the shell running the line stays alive while "
            f"{call.tool} runs and its argv contains the pattern, so {kills_it} that shell too "
            "and nothing after it runs (no output, no error message)"
        )
    else:
        notes.append(
            f"kills by pattern: every process whose command line matches {pattern!r}, "
            "including processes opsbook did not start"
        )
    if _targets_vllm(pattern) and not any(_matches(call, t) for t in VLLM_PROCESS_TITLES):
        notes.append(
            "vLLM's engine and workers rename themselves VLLM::EngineCore / VLLM::Worker_TP*, "
            "which this pattern does not match: they survive as orphans holding GPU memory"
        )
    remedy = STOP_BY_PID + (
        f"; if you must match a pattern, make it unable to match its own text: "
        f"{call.tool} -f {shlex.quote(bracketed(pattern))} (the bracket trick) or "
        f"{call.tool} -A -f ... (procps-ng 4 or later)"
    )
    if self_match and scans.bracket_fails(call):
        remedy += (
            "; here even the bracket trick fails, because the line also contains the text it "
            "looks for: stop and start in separate commands"
        )
    return hazard(
        "error" if self_match else "warning",
        PATTERN_KILL,
        call.source,
        "; ".join(notes),
        remedy,
        SOURCE_SELF_KILL,
    )


def _has_compound(commands: Sequence[SimpleCommand]) -> bool:
    return any(c.argv and c.argv[0] in KEYWORDS | {"}", "fi", "done"} for c in commands)


def shell_outlives(
    commands: Sequence[SimpleCommand], index: int, nested: bool | None = None
) -> bool:
    """True when the shell running the line is still alive while command ``index`` runs.

    bash and zsh run the last simple command of a ``-c`` string in place of themselves (exec),
    unless it has redirections or sits in a pipeline, ``$(...)``, ``(...)``, a compound
    command or the background; any earlier command runs as the shell's child.
    """
    cmd = commands[index]
    last = index == len(commands) - 1 and cmd.after in ("", ";", "\n")
    piped = index > 0 and commands[index - 1].after in ("|", "|&", "(")
    if nested is None:
        nested = _has_compound(commands)
    return not last or piped or nested or bool(cmd.redirects)


def bracketed(pattern: str) -> str:
    """``pattern`` with its first letter or digit in brackets (``vllm`` -> ``[v]llm``): the
    regex still matches the target, but no longer the pattern's own text."""
    if re.match(r"^\^?\[", pattern):
        return pattern
    match = re.search(r"[A-Za-z0-9]", pattern)
    if not match or (match.start() > 0 and pattern[match.start() - 1] == "\\"):
        return pattern
    i = match.start()
    return f"{pattern[:i]}[{pattern[i]}]{pattern[i + 1 :]}"


def _targets_vllm(pattern: str) -> bool:
    return bool(re.search(r"vllm|api_server|entrypoints", pattern, re.IGNORECASE))


def _matches(call: KillCall, text: str) -> bool:
    return _search(call.pattern or "", text, call.ignore_case)


def _search(pattern: str, text: str, ignore_case: bool) -> bool:
    try:
        return re.search(pattern, text, re.IGNORECASE if ignore_case else 0) is not None
    except re.error:
        # Not a Python regex (a POSIX class, say): assume the worst, as the hazard is silent.
        return True


def sigkill_findings(kills: Sequence[KillCall]) -> list[Finding]:
    findings = []
    gentler_before = False
    for call in kills:
        gentle = call.tool != "pgrep" and call.signal not in ("KILL", "0")
        if call.tool == "pgrep" or call.signal != "KILL" or gentler_before:
            gentler_before = gentler_before or gentle
            continue
        findings.append(
            hazard(
                "warning",
                SIGKILL_FIRST,
                call.source,
                "SIGKILL as the first resort: the server cannot shut down, so vLLM's shared "
                "memory (/dev/shm/psm_*, sem.mp-*) stays behind and its children "
                "(VLLM::EngineCore) can be left holding GPU memory",
                "send SIGTERM first (kill -TERM -- -PGID), poll until the processes are gone "
                "(with a deadline), and only then SIGKILL what is left",
                "vllm-facts section 7.2",
            )
        )
    return findings


def sleep_findings(commands: Sequence[SimpleCommand], kills: Sequence[KillCall]) -> list[Finding]:
    findings = []
    signalled = {k.index for k in kills if k.tool != "pgrep" and k.signal != "0"}
    killed = False  # a signal was sent earlier in the line
    in_loop = False  # a loop keyword since the last signal
    for index, cmd in enumerate(commands):
        if index in signalled:
            killed, in_loop = True, False
        in_loop = in_loop or bool({"while", "until", "do"} & set(cmd.argv))
        argv, _ = cmd.unwrapped()
        if command_name(argv) != "sleep" or index in signalled or not killed or in_loop:
            continue
        findings.append(
            hazard(
                "warning",
                SLEEP_WAIT,
                cmd.source,
                f"{cmd.source!r} after a kill guesses how long the process takes to exit: too "
                "short and the next step meets a process still holding the port, GPU memory "
                "and /dev/shm; too long wastes time",
                "poll for the PID with a deadline: timeout 60 tail --pid=PID -f /dev/null, or "
                "for i in $(seq 60); do kill -0 PID 2>/dev/null || break; sleep 1; done",
            )
        )
    return findings
