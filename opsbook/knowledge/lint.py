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

Commands are tokenized with :mod:`shlex` (POSIX rules, punctuation characters as operators)
and each token keeps its source text, so quoting is known where it matters.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import posixpath
import re
import shlex
import signal
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from opsbook.core.results import Finding, Result

PATTERN_KILL = "pattern-kill"
ZSH_GLOB = "zsh-glob"
BACKGROUND_JOB = "background-job"
UNQUOTED_SPACE = "unquoted-space"
SIGKILL_FIRST = "sigkill-first"
SLEEP_WAIT = "sleep-wait"
PARSE = "parse"
RULES = (PATTERN_KILL, ZSH_GLOB, BACKGROUND_JOB, UNQUOTED_SPACE, SIGKILL_FIRST, SLEEP_WAIT, PARSE)

PUNCTUATION = "();<>|&\n"
# Longest first: a run of punctuation characters is split greedily into these.
OPERATORS = (
    "&>>", "<<<", "&&", "||", "|&", ";;", ">>", ">&", "&>", "<&", "<<", "<>", ">|",
    ";", "&", "|", "(", ")", "<", ">", "\n",
)  # fmt: skip
REDIRECTIONS = {"&>>", "<<<", ">>", ">&", "&>", "<&", "<<", "<>", ">|", "<", ">"}
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\+?=")
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
KILL_TOOLS = ("kill", "pkill", "killall")
SHELLS = ("bash", "sh", "zsh", "dash", "ksh")
# ssh options that take a value (the next word when not attached): OpenSSH's ssh(1).
SSH_VALUE_OPTIONS = set("BbcDEeFIiJLlmOopQRSWw")
MAX_NESTING = 4
# Kill patterns searched for in the whole line (each search is a pass over the line): past
# this many distinct ones, a pattern is assumed to match the line, which keeps the time linear.
MAX_PATTERN_SCANS = 64
# A pattern without these matches the line wherever it matches a piece of it.
CONTEXT_SENSITIVE = re.compile(r"[\\^$]|\(\?")
WRAPPERS = {
    "sudo": {"-u", "-g", "-C", "-D", "-h", "-p", "-r", "-t", "-U", "--user", "--group"},
    "nohup": set(),
    "setsid": set(),
    "env": {"-u", "-C", "-S", "--unset", "--chdir"},
    "nice": {"-n", "--adjustment"},
    "ionice": {"-c", "-n", "-p"},
    "exec": {"-a"},
    "command": set(),
    "time": set(),
    "noglob": set(),
    "nocorrect": set(),
    "timeout": {"-k", "-s", "--kill-after", "--signal"},
    "stdbuf": {"-i", "-o", "-e"},
}
# Shell keywords that may start a simple command as this parser splits it (``do kill ...``).
KEYWORDS = {"do", "then", "else", "elif", "while", "until", "if", "!", "{"}
# Commands that take one path, where an absolute path followed by a relative one is almost
# surely one path split at a space. Elsewhere (cp /etc/hosts backup/hosts) it is normal.
ONE_PATH_COMMANDS = {
    "cd", "ls", "du", "df", "stat", "cat", "head", "tail", "less", "realpath", "readlink",
    "file", "wc", "sha256sum", "md5sum", "mkdir", "rmdir", "touch", "source", ".", "vllm",
}  # fmt: skip
VLLM_PROCESS_TITLES = ("VLLM::EngineCore", "VLLM::Worker_TP0")
SAFE_LAUNCH = "setsid nohup ./launch.sh > launch.log 2>&1 < /dev/null &"
STOP_BY_PID = (
    "stop the server by the PID or process group recorded when it was started "
    "(kill -TERM -- -PGID), wait for it to exit, and only then SIGKILL what is left"
)
SOURCE_SELF_KILL = (
    "vllm-facts section 8: solana-labs/solana#7603, Ikalus1988/MisakaNet#1899, "
    "indexable-inc/index#2309"
)


@dataclass(frozen=True)
class Token:
    """One word or operator of a command line.

    Attributes:
        text: the value after quote removal (what the program receives).
        raw: the source text, quotes included.
        start: offset of ``raw`` in the command line.
        end: offset just after ``raw``.
        operator: True for an unquoted operator (``;``, ``&&``, ``>``...).
    """

    text: str
    raw: str
    start: int
    end: int
    operator: bool = False


@dataclass
class Redirect:
    fd: str
    op: str
    target: str


@dataclass
class SimpleCommand:
    """One command of a line: its words, leading assignments, redirections, and the operator
    that ends it (``""`` at the end of the line)."""

    words: list[Token] = field(default_factory=list)
    assignments: list[Token] = field(default_factory=list)
    redirects: list[Redirect] = field(default_factory=list)
    after: str = ""

    @property
    def argv(self) -> list[str]:
        return [w.text for w in self.words]

    @property
    def source(self) -> str:
        return " ".join(w.raw for w in self.words)

    def unwrapped(self) -> tuple[list[str], set[str]]:
        """The argv without precommands (``sudo``, ``nohup``, ``setsid``...), and those found."""
        return unwrap(self.argv)


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


# -- public API ------------------------------------------------------------------------------


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
        One finding per hazard, in rule order; the rule is the start of ``subject``
        (see :func:`rule_of`). Empty when nothing was found.
    """
    try:
        commands = parse(command)
    except ValueError as e:
        return [
            _finding(
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
        *_pattern_kill_findings(command, commands, kills),
        *(_glob_findings(commands) if zsh else []),
        *_background_findings(commands),
        *_unquoted_space_findings(command, commands, paths),
        *_sigkill_findings(kills),
        *_sleep_findings(commands, kills),
        *_nested_findings(commands, paths, depth),
    ]


def is_empty(command: str) -> bool:
    """True when ``command`` holds no command at all (blank, or only comments)."""
    try:
        return not parse(command)
    except ValueError:
        return False


def nested_commands(cmd: SimpleCommand) -> list[tuple[str, str, bool]]:
    """The command lines a simple command hands to another shell, with how, and whether that
    shell may be zsh: the remote command of ``ssh [options] host CMD...`` (its words joined by
    spaces, as ssh sends them; run by the login shell), the script of ``bash -c``/``sh -c``/
    ``zsh -c`` (options such as ``-lc`` included) and of ``su -c``/``su --command`` (run by
    the user's login shell)."""
    argv, _ = cmd.unwrapped()
    name = command_name(argv)
    if name == "ssh":
        remote = _ssh_remote_command(argv[1:])
        return [("ssh host '...'", remote, True)] if remote.strip() else []
    if name in SHELLS:
        script = _shell_script(argv[1:])
        return [(f"{name} -c '...'", script, name == "zsh")] if script is not None else []
    if name == "su":
        script = _su_script(argv[1:])
        return [("su -c '...'", script, True)] if script is not None else []
    return []


def lint_result(command: str, *, paths: Sequence[str] = ()) -> Result:
    """:func:`lint_command` as a :class:`Result`: ``ok`` when no finding is a warning or error.

    Data: ``command`` and ``rules`` (the rules that fired).
    """
    with _no_cyclic_gc():
        findings = lint_command(command, paths=paths)
    rules = sorted({rule_of(f) for f in findings})
    serious = [f for f in findings if f.severity in ("warning", "error")]
    if not findings:
        message = "no hazards found"
    else:
        message = f"{len(findings)} hazard(s): {', '.join(rules)}"
    return Result(not serious, message, {"command": command, "rules": rules}, findings)


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
    """The rule that produced ``finding`` (one of :data:`RULES`)."""
    return finding.subject.split(":", 1)[0]


# -- tokenizing and parsing ------------------------------------------------------------------


class _Reader:
    """The command as the stream shlex reads one character at a time, with an O(1) ``tell``
    (``io.StringIO.tell`` after many one-character reads made long lines quadratic)."""

    def __init__(self, text: str):
        self.text = text
        self.position = 0

    def read(self, size: int = -1) -> str:
        end = len(self.text) if size < 0 else self.position + size
        piece = self.text[self.position : end]
        self.position += len(piece)
        return piece

    def readline(self) -> str:
        end = self.text.find("\n", self.position)
        end = len(self.text) if end < 0 else end + 1
        return self.read(end - self.position)

    def tell(self) -> int:
        return self.position

    def close(self) -> None:
        pass


class _Lexer(shlex.shlex):
    """POSIX shlex that also reports where each token lies in the source."""

    def __init__(self, command: str):
        self.source_stream = _Reader(command)
        super().__init__(self.source_stream, posix=True, punctuation_chars=PUNCTUATION)
        self.whitespace = " \t\r"
        self.whitespace_split = True
        # bash starts a comment only at the start of a word; handled in tokenize().
        self.commenters = ""

    def spans(self) -> Iterator[tuple[str, int, int]]:
        while True:
            start = self._offset()
            token = self.get_token()
            if token is None:
                return
            yield token, start, self._offset()

    def _offset(self) -> int:
        # A character read past a token's end waits in shlex's (private) push-back list.
        pending = len(self._pushback_chars)  # type: ignore[attr-defined]
        return self.source_stream.tell() - pending


def tokenize(command: str) -> list[Token]:
    """Split ``command`` into words and operators; comments are dropped.

    Raises:
        ValueError: an unclosed quote or a trailing backslash.
    """
    tokens: list[Token] = []
    in_comment = False
    for text, start, end in _Lexer(command).spans():
        span = command[start:end]
        raw = span.strip(" \t\r")
        start += len(span) - len(span.lstrip(" \t\r"))
        is_operator = bool(raw) and all(c in PUNCTUATION for c in raw)
        if in_comment:
            in_comment = not (is_operator and "\n" in raw)
            if in_comment:
                continue
        if not is_operator and raw.startswith("#"):
            in_comment = True
            continue
        if is_operator:
            tokens += _split_operators(raw, start)
        else:
            tokens.append(Token(text, raw, start, start + len(raw)))
    return _drop_arithmetic(tokens)


def parse(command: str) -> list[SimpleCommand]:
    """The simple commands of ``command`` in order, with their redirections and the
    operator after each.

    Raises:
        ValueError: the command does not tokenize.
    """
    commands: list[SimpleCommand] = []
    current = SimpleCommand()
    tokens = tokenize(command)
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if token.operator and token.text in REDIRECTIONS:
            fd = ""
            if (
                current.words
                and current.words[-1].text.isdigit()
                and (current.words[-1].end == token.start)
            ):
                fd = current.words.pop().text
            target = tokens[i + 1].text if i + 1 < len(tokens) else ""
            current.redirects.append(Redirect(fd, token.text, target))
            i += 2
            continue
        if token.operator:
            if current.words or current.redirects or current.assignments:
                current.after = token.text
                commands.append(current)
                current = SimpleCommand()
            elif token.text == "&" and commands:
                commands[-1].after = "&"
        elif not current.words and ASSIGNMENT.match(token.raw):
            current.assignments.append(token)
        else:
            current.words.append(token)
        i += 1
    if current.words or current.redirects or current.assignments:
        commands.append(current)
    return commands


def unwrap(argv: Sequence[str]) -> tuple[list[str], set[str]]:
    """``argv`` without leading precommands and their options (``sudo -u x``, ``nohup``,
    ``setsid``, ``env A=1``, ``timeout 5``...), and the names of those removed."""
    i, found = 0, set()
    while i < len(argv):
        name = posixpath.basename(argv[i].lstrip("`"))
        if name in KEYWORDS:
            i += 1
            continue
        if name not in WRAPPERS:
            break
        found.add(name)
        i += 1
        while i < len(argv) and (
            argv[i].startswith("-") or (name == "env" and ASSIGNMENT.match(argv[i]))
        ):
            option = argv[i]
            i += 1
            if option == "--":
                break
            if option in WRAPPERS[name]:
                i += 1
        if name == "timeout" and i < len(argv):
            i += 1
    return list(argv[i:]), found


def command_name(argv: Sequence[str]) -> str:
    return posixpath.basename(argv[0].lstrip("`")) if argv else ""


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


def _split_operators(raw: str, start: int) -> list[Token]:
    tokens, i = [], 0
    while i < len(raw):
        op = next(o for o in OPERATORS if raw.startswith(o, i))
        tokens.append(Token(op, op, start + i, start + i + len(op), operator=True))
        i += len(op)
    return tokens


def _drop_arithmetic(tokens: list[Token]) -> list[Token]:
    """Remove the inside of ``$((...))``: it is arithmetic, not words."""
    kept: list[Token] = []
    i = 0
    while i < len(tokens):
        token = tokens[i]
        kept.append(token)
        i += 1
        opens = (
            token.raw.endswith("$")
            and i + 1 < len(tokens)
            and tokens[i].operator
            and tokens[i].text == "(" == tokens[i + 1].text
            and tokens[i].start == token.end
        )
        depth = 0
        while opens and i < len(tokens):
            if tokens[i].operator and tokens[i].text in ("(", ")"):
                depth += 1 if tokens[i].text == "(" else -1
            i += 1
            if depth == 0:
                break
    return kept


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


# -- rules -----------------------------------------------------------------------------------


def _finding(
    severity: str, rule: str, subject: str, message: str, remedy: str, source: str = ""
) -> Finding:
    return Finding(severity, f"{rule}: {subject}", message, remedy, source)


def _pattern_kill_findings(
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
    return _finding(
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
    return _finding(
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


def _glob_findings(commands: Sequence[SimpleCommand]) -> list[Finding]:
    findings = []
    for cmd in commands:
        argv, wrappers = cmd.unwrapped()
        if "noglob" in wrappers or command_name(argv) in ("[[", "test", "["):
            continue
        for word in cmd.words:
            if has_unquoted_glob(word.raw):
                findings.append(_glob_finding(cmd, word, command_name(argv)))
    return findings


def _glob_finding(cmd: SimpleCommand, word: Token, name: str) -> Finding:
    """A warning for ``rm`` (a cleanup often finds nothing to remove), else information."""
    folder, base = posixpath.split(word.text)
    if name == "rm" and folder and not has_unquoted_glob(folder):
        remedy = (
            f"find {shlex.quote(folder)} -maxdepth 1 -name {shlex.quote(base)} "
            "-user \"$USER\" -delete  (or run the line under bash -c '...')"
        )
    else:
        remedy = (
            f"quote it ({shlex.quote(word.text)}) if it is meant literally, or run the line "
            "under bash -c '...' where an unmatched glob stays as it is"
        )
    return _finding(
        "warning" if name == "rm" else "info",
        ZSH_GLOB,
        word.raw,
        f"unquoted glob {word.raw!r} in {cmd.source!r}: when the login shell is zsh and "
        "nothing matches, zsh refuses to run the command ('zsh: no matches found'), so none "
        "of its other arguments are used either, and it fails, which stops an && chain",
        remedy,
        "zsh NOMATCH option (on by default)",
    )


def has_unquoted_glob(raw: str) -> bool:
    """True when ``raw`` (a word as written) holds ``*``, ``?`` or ``[...]`` outside quotes,
    outside ``${...}`` and not as part of ``$?``/``$*``."""
    quote = ""
    i = 0
    while i < len(raw):
        c = raw[i]
        if not quote and raw.startswith("${", i):
            close = raw.find("}", i)
            i = len(raw) if close < 0 else close + 1
            continue
        if quote:
            if c == quote:
                quote = ""
            elif c == "\\" and quote == '"':
                i += 1
        elif c == "\\":
            i += 1
        elif c in "'\"":
            quote = c
        elif c in "*?" and not (i > 0 and raw[i - 1] == "$"):
            return True
        elif c == "[" and "]" in raw[i + 2 :] and raw != "[[":
            return True
        i += 1
    return False


# Why each missing part matters; checked over ssh against the rehearsal host (a job holding
# the session's stdout made the ssh command wait for it to finish).
DETACH_REASONS = {
    "stdout redirection": "the ssh command waits until the job ends, as it holds the "
    "session's output open, and its output is lost with the session",
    "stderr redirection": "the same for standard error: crash messages go nowhere",
    "nohup or setsid": "a hangup at the end of a terminal session (ssh -t, an interactive "
    "shell) kills it",
    "setsid": "without its own session and process group it cannot be stopped as one group "
    "with its children (kill -TERM -- -PGID)",
    "< /dev/null": "it keeps the ssh channel's standard input",
}


def _background_findings(commands: Sequence[SimpleCommand]) -> list[Finding]:
    findings = []
    for job in _background_jobs(commands):
        missing = _missing_detachment(job)
        if not missing:
            continue
        if {"stdout redirection", "stderr redirection"} & set(missing):
            severity = "error"
        elif "nohup or setsid" in missing:
            severity = "warning"
        else:
            severity = "info"
        reasons = "; ".join(f"without {m}, {DETACH_REASONS[m]}" for m in missing)
        findings.append(
            _finding(
                severity,
                BACKGROUND_JOB,
                " | ".join(c.source for c in job) + " &",
                f"background job started inline: {reasons}",
                "write the launch command into a script on the host and start it detached: "
                + SAFE_LAUNCH,
                "DESIGN.md section 1; ssh check against the rehearsal host",
            )
        )
    return findings


def _background_jobs(commands: Sequence[SimpleCommand]) -> list[list[SimpleCommand]]:
    jobs, pipeline = [], []
    for cmd in commands:
        pipeline.append(cmd)
        if cmd.after in ("|", "|&"):
            continue
        if cmd.after == "&":
            jobs.append(pipeline)
        pipeline = []
    return jobs


def _missing_detachment(job: Sequence[SimpleCommand]) -> list[str]:
    first, last = job[0], job[-1]
    _, wrappers = first.unwrapped()
    out = {(r.fd or "1") for r in last.redirects if r.op in (">", ">>", ">|")}
    out |= {"1", "2"} if any(r.op in ("&>", "&>>") for r in last.redirects) else set()
    if any(r.op == ">&" and r.fd == "2" for r in last.redirects):
        out.add("2")
    if any(r.op == ">&" and r.fd in ("", "1") and not r.target.isdigit() for r in last.redirects):
        out |= {"1", "2"}
    has_stdin = any(r.op in ("<", "<<", "<<<") and r.fd in ("", "0") for r in first.redirects)
    missing = []
    if "1" not in out:
        missing.append("stdout redirection")
    if "2" not in out and last.after != "|&":
        missing.append("stderr redirection")
    if not wrappers & {"nohup", "setsid"}:
        missing.append("nohup or setsid")
    elif "setsid" not in wrappers:
        missing.append("setsid")
    if not has_stdin:
        missing.append("< /dev/null")
    return missing


def _unquoted_space_findings(
    command: str, commands: Sequence[SimpleCommand], paths: Sequence[str]
) -> list[Finding]:
    words = [w.text for c in commands for w in c.words]
    reported = [p for p in paths if " " in p and p in command and not any(p in w for w in words)]
    findings = [_space_finding("warning", p, "a path with spaces") for p in reported]
    for cmd in commands:
        argv, _ = cmd.unwrapped()
        if command_name(argv) not in ONE_PATH_COMMANDS:
            continue
        for first, second in zip(cmd.words, cmd.words[1:], strict=False):
            split = f"{first.text} {second.text}"
            if _looks_split(first, second) and not any(p in split for p in reported):
                findings.append(_space_finding("info", split, "what looks like a split path"))
    return findings


def _looks_split(first: Token, second: Token) -> bool:
    """An absolute path followed by a word that continues it (``/data/My`` ``Models/x``)."""
    return (
        first.raw == first.text
        and second.raw == second.text
        and first.text.startswith("/")
        and "/" in second.text
        and not second.text.startswith(("/", "~", ".", "-", "$"))
        and "=" not in second.text
        and "://" not in second.text
    )


def _space_finding(severity: str, path: str, what: str) -> Finding:
    return _finding(
        severity,
        UNQUOTED_SPACE,
        path,
        f"{what} ({path!r}) is not quoted: the shell splits it into separate arguments",
        f"quote it: {shlex.quote(path)}",
    )


def _sigkill_findings(kills: Sequence[KillCall]) -> list[Finding]:
    findings = []
    gentler_before = False
    for call in kills:
        gentle = call.tool != "pgrep" and call.signal not in ("KILL", "0")
        if call.tool == "pgrep" or call.signal != "KILL" or gentler_before:
            gentler_before = gentler_before or gentle
            continue
        findings.append(
            _finding(
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


def _sleep_findings(commands: Sequence[SimpleCommand], kills: Sequence[KillCall]) -> list[Finding]:
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
            _finding(
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


# -- commands handed to another shell --------------------------------------------------------


def _nested_findings(
    commands: Sequence[SimpleCommand], paths: Sequence[str], depth: int
) -> list[Finding]:
    """The hazards of the lines given to ``ssh host '...'``, ``bash -c '...'``, ``su -c``: the
    incident's line was such a one."""
    if depth >= MAX_NESTING:
        return []
    findings = []
    for cmd in commands:
        for how, inner, zsh in nested_commands(cmd):
            for found in lint_command(inner, paths=paths, depth=depth + 1, zsh=zsh):
                findings.append(
                    dataclasses.replace(found, message=f"inside {how}: {found.message}")
                )
    return findings


def _ssh_remote_command(args: Sequence[str]) -> str:
    """The command ``ssh`` sends (its words after the destination, joined by spaces)."""
    i = 0
    while i < len(args) and args[i].startswith("-") and args[i] != "-":
        option = args[i]
        i += 1
        if option == "--":
            break
        letters = option[1:]
        # A value option ends the cluster; its value is attached or is the next word.
        for n, letter in enumerate(letters):
            if letter in SSH_VALUE_OPTIONS:
                if n == len(letters) - 1:
                    i += 1
                break
    return " ".join(args[i + 1 :])


def _shell_script(args: Sequence[str]) -> str | None:
    """The script of ``bash [options] -c SCRIPT`` (``-c`` may sit in a cluster: ``-lc``)."""
    for n, arg in enumerate(args):
        if not arg.startswith("-") or arg in ("-", "--"):
            return None
        if not arg.startswith("--") and "c" in arg[1:]:
            return args[n + 1] if n + 1 < len(args) else None
        if arg in ("-o", "+o", "-O", "+O") and n + 1 < len(args):
            continue
    return None


def _su_script(args: Sequence[str]) -> str | None:
    """The command of ``su [options] [user] -c CMD`` or ``--command=CMD``."""
    for n, arg in enumerate(args):
        if arg.startswith("--command="):
            return arg.split("=", 1)[1]
        if arg in ("-c", "--command") and n + 1 < len(args):
            return args[n + 1]
    return None
