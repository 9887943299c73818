"""The hazards the command linter knows, by code, and how a hazard becomes a finding.

Each code is the ``code`` of its findings (:class:`opsbook.core.results.Finding`); the subject
shown starts with it too (``pattern-kill: pkill -f vllm``), as the linter has always printed.
"""

from __future__ import annotations

from opsbook.core.results import Finding

PATTERN_KILL = "pattern-kill"
ZSH_GLOB = "zsh-glob"
BACKGROUND_JOB = "background-job"
UNQUOTED_SPACE = "unquoted-space"
SIGKILL_FIRST = "sigkill-first"
SLEEP_WAIT = "sleep-wait"
PARSE = "parse"
RULES = (PATTERN_KILL, ZSH_GLOB, BACKGROUND_JOB, UNQUOTED_SPACE, SIGKILL_FIRST, SLEEP_WAIT, PARSE)


def hazard(
    severity: str, rule: str, subject: str, message: str, remedy: str, source: str = ""
) -> Finding:
    """A finding of ``rule`` (one of :data:`RULES`) about ``subject`` (the words concerned)."""
    return Finding(severity, f"{rule}: {subject}", message, remedy, source, code=rule)
