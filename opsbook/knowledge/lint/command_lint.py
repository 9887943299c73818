"""Lint a command line: every hazard rule over the line and over the lines it hands to another
shell, as findings or as one :class:`LintResult`."""

from __future__ import annotations

import contextlib
import dataclasses
import gc
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from opsbook.core.results import Finding, Result
from opsbook.knowledge.lint.hazard_codes import PARSE, hazard
from opsbook.knowledge.lint.kill_hazards import (
    pattern_kill_findings,
    sigkill_findings,
    sleep_findings,
)
from opsbook.knowledge.lint.kill_parse import kill_calls
from opsbook.knowledge.lint.shell_hazards import (
    background_findings,
    glob_findings,
    unquoted_space_findings,
)
from opsbook.knowledge.lint.shell_words import (
    SimpleCommand,
    indirect_commands,
    nested_commands,
    parse,
)

MAX_NESTING = 4


@dataclass(frozen=True)
class LintEvidence:
    """What was linted and which rules fired (their codes, sorted)."""

    command: str
    rules: list[str] = field(default_factory=list)


@dataclass(repr=False)
class LintResult(Result):
    """:func:`lint_result`'s verdict, with its :class:`LintEvidence`."""

    evidence: LintEvidence = field(kw_only=True)


def lint_command(
    command: str, *, paths: Sequence[str] = (), depth: int = 0, zsh: bool = True
) -> list[Finding]:
    """The hazards of ``command``, run as ``ssh host '<command>'`` or ``bash -c``.

    This is for commands typed or pasted by hand: :meth:`opsbook.remote.hosts.Host.run` sends its
    commands base64-encoded, so their text never appears in a process's argv.

    Args:
        command: the command line as it would be typed.
        paths: paths known to contain spaces (e.g. the deployment's model path); one of them
            appearing unquoted in the command is reported.
        depth: how deep this line is nested in ``ssh host '...'``/``bash -c '...'`` (the
            nested lines are linted too, down to :data:`MAX_NESTING`).
        zsh: whether the line may run under zsh (a login shell may be zsh; ``bash -c`` is not),
            where an unmatched glob stops the command.

    Returns:
        One finding per hazard, in rule order; the rule is its ``code`` (see :func:`rule_of`).
        Empty when nothing was found.
    """
    try:
        commands = parse(command)
    except ValueError as e:
        return [
            hazard(
                "error",
                PARSE,
                command,
                f"the command does not parse: {e}",
                "close the quote or remove the stray backslash",
                "shlex",
            )
        ]
    kills = kill_calls(commands)
    return [
        *pattern_kill_findings(command, commands, kills),
        *(glob_findings(commands) if zsh else []),
        *background_findings(commands),
        *unquoted_space_findings(command, commands, paths),
        *sigkill_findings(kills),
        *sleep_findings(commands, kills),
        *_nested_findings(commands, paths, depth, zsh),
    ]


def lint_result(command: str, *, paths: Sequence[str] = ()) -> LintResult:
    """:func:`lint_command` as a :class:`LintResult`: ``ok`` when no finding is a warning or
    error; its evidence names the command and the rules that fired.
    """
    with _no_cyclic_gc():
        findings = lint_command(command, paths=paths)
    rules = sorted({rule_of(f) for f in findings})
    serious = [f for f in findings if f.severity in ("warning", "error")]
    if not findings:
        message = "no hazards found"
    else:
        message = f"{len(findings)} hazard(s): {', '.join(rules)}"
    evidence = LintEvidence(command, rules)
    return LintResult(not serious, message, findings=findings, evidence=evidence)


@contextlib.contextmanager
def _no_cyclic_gc() -> Iterator[None]:
    # A long line makes hundreds of thousands of small acyclic objects (tokens, commands):
    # the cyclic collector's passes over them grow with the heap and made the time superlinear.
    # Reference counting frees them all the same.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def rule_of(finding: Finding) -> str:
    """The rule that produced ``finding`` (one of :data:`~.hazard_codes.RULES`)."""
    return finding.code


def _nested_findings(
    commands: Sequence[SimpleCommand], paths: Sequence[str], depth: int, zsh: bool
) -> list[Finding]:
    """The hazards of the lines given to ``ssh host '...'``, ``bash -c '...'``, ``su -c`` (the
    incident's line was such a one), and of those this shell runs from text (``eval``, an
    alias, a command in a variable: run by the same shell, zsh or not as this line is)."""
    if depth >= MAX_NESTING:
        return []
    inner_lines = [line for cmd in commands for line in nested_commands(cmd)]
    inner_lines += [(how, line, zsh) for how, line in indirect_commands(commands)]
    findings = []
    for how, inner, inner_zsh in inner_lines:
        for found in lint_command(inner, paths=paths, depth=depth + 1, zsh=inner_zsh):
            findings.append(dataclasses.replace(found, message=f"inside {how}: {found.message}"))
    return findings
