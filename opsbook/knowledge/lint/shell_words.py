"""Split a shell command line into simple commands the way bash reads it, as far as the
linter needs: words with their source text (so quoting is known), redirections, the operator
after each command, precommands (``sudo``, ``nohup``...), and the lines handed to another
shell (``ssh host '...'``, ``bash -c``, ``su -c``) or to this one (``eval``, an alias's text, a
command held in a variable).

Commands are tokenized with :mod:`shlex` (POSIX rules, punctuation characters as operators).
"""

from __future__ import annotations

import posixpath
import re
import shlex
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

PUNCTUATION = "();<>|&\n"
# Longest first: a run of punctuation characters is split greedily into these.
OPERATORS = (
    "&>>", "<<<", "&&", "||", "|&", ";;", ">>", ">&", "&>", "<&", "<<", "<>", ">|",
    ";", "&", "|", "(", ")", "<", ">", "\n",
)  # fmt: skip
REDIRECTIONS = {"&>>", "<<<", ">>", ">&", "&>", "<&", "<<", "<>", ">|", "<", ">"}
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\+?=")
SHELLS = ("bash", "sh", "zsh", "dash", "ksh")
# ssh options that take a value (the next word when not attached): OpenSSH's ssh(1).
SSH_VALUE_OPTIONS = set("BbcDEeFIiJLlmOopQRSWw")
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
# Builtins that set variables from NAME=VALUE words (the value may be a command run later).
DECLARERS = {"export", "local", "declare", "typeset", "readonly"}
VARIABLE_COMMAND = re.compile(r"^\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))$")
# Commands that take one path, where an absolute path followed by a relative one is almost


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


def indirect_commands(commands: Sequence[SimpleCommand]) -> list[tuple[str, str]]:
    """The command lines this shell runs from text (how, and the line): the words of ``eval``
    joined by spaces (as eval joins them), the text of each ``alias NAME='...'`` (run wherever
    the alias is used), and a variable's value run as a command (``x='pkill -f vllm'; $x``)
    with the words after it. A hazard hidden in any of them is still a hazard of the line."""
    found: list[tuple[str, str]] = []
    variables: dict[str, str] = {}
    for cmd in commands:
        argv, _ = cmd.unwrapped()
        name = command_name(argv)
        for token in _assignments_of(cmd, name):
            variable, _, value = token.text.partition("=")
            variables[variable.rstrip("+")] = value
        if name == "eval" and len(argv) > 1:
            found.append(("eval '...'", " ".join(argv[1:])))
        elif name == "alias":
            for word in argv[1:]:
                alias, eq, text = word.partition("=")
                if eq and text.strip():
                    found.append((f"alias {alias}='...'", text))
        elif argv and (held := VARIABLE_COMMAND.match(argv[0])):
            variable = held.group(1) or held.group(2)
            if variables.get(variable, "").strip():
                line = " ".join([variables[variable], *argv[1:]])
                found.append((f"${variable}", line))
    return found


def _assignments_of(cmd: SimpleCommand, name: str) -> list[Token]:
    """The NAME=VALUE words a command sets: its leading assignments when it has no words
    (``x=1``; with words they are the command's environment), or a declarer's (``export``)."""
    if not cmd.words:
        return cmd.assignments
    if name in DECLARERS:
        return [w for w in cmd.words[1:] if ASSIGNMENT.match(w.text)]
    return []


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
        if name == "function":
            # ``function NAME { BODY; }``: the body's first command follows the brace.
            i += 2
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
