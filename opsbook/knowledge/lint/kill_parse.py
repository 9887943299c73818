"""Read the ``kill``, ``pkill``, ``pgrep`` and ``killall`` commands of a line: the signal
each sends and the pattern or name it matches, with the options that change the match."""

from __future__ import annotations

import dataclasses
import signal
from collections.abc import Sequence
from dataclasses import dataclass

from opsbook.knowledge.lint.shell_words import SimpleCommand, command_name

SIGNAL_NAMES = {s.name[3:] for s in signal.Signals} | {"0"}
SIGNAL_NUMBERS = {str(int(s)): s.name[3:] for s in signal.Signals}
# Options of pkill/pgrep, killall and kill that take a value (the next word when not attached).
PGREP_VALUE_OPTIONS = set("dgGPstuUFrq") | {
    "--delimiter", "--pgroup", "--group", "--parent", "--session", "--terminal", "--euid",
    "--uid", "--pidfile", "--runstates", "--queue", "--ns", "--nslist", "--signal", "--env",
    "--cgroup",
}  # fmt: skip
KILLALL_VALUE_OPTIONS = set("sunoyYZ") | {
    "--signal",
    "--user",
    "--context",
    "--older-than",
    "--younger-than",
    "--ns",
}


@dataclass(frozen=True)
class KillCall:
    """A ``kill``/``pkill``/``pgrep``/``killall`` command and what it sends to what."""

    index: int
    tool: str
    signal: str
    pattern: str | None
    full: bool
    ignore_ancestors: bool
    ignore_case: bool
    source: str
    # Where the command lies in the line (start, end), when known.
    span: tuple[int, int] | None = None


def kill_calls(commands: Sequence[SimpleCommand]) -> list[KillCall]:
    """The ``kill``, ``pkill``, ``pgrep`` and ``killall`` commands of a line."""
    calls = []
    for index, cmd in enumerate(commands):
        argv, _ = cmd.unwrapped()
        if argv and command_name(argv) == "xargs":
            argv = _xargs_command(argv)
        tool = command_name(argv)
        span = (cmd.words[0].start, cmd.words[-1].end) if cmd.words else None
        if tool in ("pkill", "pgrep"):
            call = _parse_pgrep(index, tool, argv[1:], cmd.source)
        elif tool == "killall":
            call = _parse_killall(index, argv[1:], cmd.source)
        elif tool == "kill":
            call = KillCall(
                index, "kill", _kill_signal(argv[1:]), None, False, False, False, cmd.source
            )
        else:
            continue
        calls.append(dataclasses.replace(call, span=span))
    return calls


def _xargs_command(argv: list[str]) -> list[str]:
    i = 1
    while i < len(argv) and argv[i].startswith("-"):
        i += 1 + (argv[i] in ("-n", "-P", "-I", "-L", "-d", "-s", "-a", "-E"))
    return argv[i:]


def _normalize_signal(word: str) -> str | None:
    name = word.upper().removeprefix("SIG")
    if name.isdigit():
        return SIGNAL_NUMBERS.get(name, name)
    return name if name in SIGNAL_NAMES else None


def _signal_option(word: str) -> str | None:
    """The signal of ``-9``/``-KILL``/``-SIGTERM``, None for other words."""
    if not word.startswith("-") or len(word) < 2 or word.startswith("--"):
        return None
    body = word[1:]
    if not (body.isdigit() or (body.isupper() and len(body) >= 2)):
        return None
    return _normalize_signal(body)


def _kill_signal(args: Sequence[str]) -> str:
    for i, word in enumerate(args):
        if word in ("-s", "-n", "--signal") and i + 1 < len(args):
            return _normalize_signal(args[i + 1]) or args[i + 1]
        if word.startswith("--signal="):
            return _normalize_signal(word.split("=", 1)[1]) or word
        found = _signal_option(word)
        if found:
            return found
        if word == "--" or not word.startswith("-"):
            break
    return "TERM"


def _parse_pgrep(index: int, tool: str, args: Sequence[str], source: str) -> KillCall:
    sig, full, ancestors, icase, pattern = "TERM", False, False, False, None
    i = 0
    while i < len(args):
        word = args[i]
        i += 1
        if word == "--":
            pattern = args[i] if i < len(args) else None
            break
        if not word.startswith("-") or word == "-":
            pattern = word
            break
        found = _signal_option(word)
        if found:
            sig = found
            continue
        if word.startswith("--"):
            name, _, value = word.partition("=")
            full = full or name == "--full"
            ancestors = ancestors or name == "--ignore-ancestors"
            icase = icase or name == "--ignore-case"
            if name in PGREP_VALUE_OPTIONS and not value:
                value, i = (args[i] if i < len(args) else ""), i + 1
            if name == "--signal":
                sig = _normalize_signal(value) or value
            continue
        for pos, flag in enumerate(word[1:], start=1):
            full = full or flag == "f"
            ancestors = ancestors or flag == "A"
            icase = icase or flag == "i"
            if flag in PGREP_VALUE_OPTIONS:
                if pos == len(word) - 1:
                    i += 1
                break
    return KillCall(index, tool, sig, pattern, full, ancestors, icase, source)


def _parse_killall(index: int, args: Sequence[str], source: str) -> KillCall:
    sig, icase, pattern = "TERM", False, None
    i = 0
    while i < len(args):
        word = args[i]
        i += 1
        if not word.startswith("-") or word == "--":
            pattern = word if word != "--" else (args[i] if i < len(args) else None)
            break
        found = _signal_option(word)
        if found:
            sig = found
        elif word in ("-s", "--signal") and i < len(args):
            sig, i = _normalize_signal(args[i]) or args[i], i + 1
        elif word in KILLALL_VALUE_OPTIONS or (len(word) == 2 and word[1] in KILLALL_VALUE_OPTIONS):
            i += 1
        else:
            icase = icase or word in ("-I", "--ignore-case")
    return KillCall(index, "killall", sig, pattern, False, False, icase, source)
