"""Flag the hazards of an ad-hoc remote command before it runs, each with a safer form.

The incident's stop-and-relaunch one-liner (DESIGN.md section 1) failed silently because of
hazards that are visible in its text:

- ``pattern-kill``: ``pkill -f PAT`` (or ``pgrep -f PAT | xargs kill``, ``killall``) kills by
  pattern. Sent as ``ssh host '...'`` a compound command (``;``, ``&&``, ``|``, ``&``) keeps a
  shell alive whose own argv contains the pattern, so the pattern matches that shell and the
  line kills itself; vLLM's renamed children (``VLLM::EngineCore``) are missed by
  ``api_server`` patterns.
- ``zsh-glob``: an unquoted glob that matches nothing is an error under zsh: the command does
  not run at all (``rm -f a* b*`` removes nothing when ``a*`` matches nothing) and fails,
  which stops an ``&&`` chain.
- ``background-job``: ``cmd &`` started inline: with its output not redirected the ssh
  command waits for it and its output is lost; without ``nohup``/``setsid`` a hangup kills it;
  without ``setsid`` it cannot be stopped as one process group.
- ``unquoted-space``: a path with spaces left unquoted becomes two arguments.
- ``sigkill-first``: ``kill -9`` before any SIGTERM skips the server's own shutdown.
- ``sleep-wait``: ``sleep N`` after a kill guesses when the process is gone.

Modules: :mod:`.shell_words` (the line's words and commands), :mod:`.kill_parse` (what each
kill command sends to what), :mod:`.kill_hazards` and :mod:`.shell_hazards` (the rules),
:mod:`.hazard_codes` (the rules' codes), :mod:`.command_lint` (the line and its nested lines).
"""

from opsbook.knowledge.lint.command_lint import (
    MAX_NESTING,
    LintEvidence,
    LintResult,
    lint_command,
    lint_result,
    rule_of,
)
from opsbook.knowledge.lint.hazard_codes import (
    BACKGROUND_JOB,
    PARSE,
    PATTERN_KILL,
    RULES,
    SIGKILL_FIRST,
    SLEEP_WAIT,
    UNQUOTED_SPACE,
    ZSH_GLOB,
)
from opsbook.knowledge.lint.kill_hazards import (
    bracketed,
    shell_outlives,
)
from opsbook.knowledge.lint.kill_parse import (
    KillCall,
    kill_calls,
)
from opsbook.knowledge.lint.shell_hazards import (
    has_unquoted_glob,
)
from opsbook.knowledge.lint.shell_words import (
    Redirect,
    SimpleCommand,
    Token,
    command_name,
    is_empty,
    nested_commands,
    parse,
    tokenize,
    unwrap,
)

__all__ = [
    "BACKGROUND_JOB",
    "KillCall",
    "LintEvidence",
    "LintResult",
    "MAX_NESTING",
    "PARSE",
    "PATTERN_KILL",
    "RULES",
    "Redirect",
    "SIGKILL_FIRST",
    "SLEEP_WAIT",
    "SimpleCommand",
    "Token",
    "UNQUOTED_SPACE",
    "ZSH_GLOB",
    "bracketed",
    "command_name",
    "has_unquoted_glob",
    "is_empty",
    "kill_calls",
    "lint_command",
    "lint_result",
    "nested_commands",
    "parse",
    "rule_of",
    "shell_outlives",
    "tokenize",
    "unwrap",
]
