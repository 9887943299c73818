"""The hazards of how a line is written: unquoted globs under zsh, background jobs started
inline, and paths with spaces left unquoted."""

from __future__ import annotations

import posixpath
import shlex
from collections.abc import Sequence

from opsbook.core.results import Finding
from opsbook.knowledge.lint.hazard_codes import (
    BACKGROUND_JOB,
    UNQUOTED_SPACE,
    ZSH_GLOB,
    hazard,
)
from opsbook.knowledge.lint.shell_words import SimpleCommand, Token, command_name

# surely one path split at a space. Elsewhere (cp /etc/hosts backup/hosts) it is normal.
ONE_PATH_COMMANDS = {
    "cd", "ls", "du", "df", "stat", "cat", "head", "tail", "less", "realpath", "readlink",
    "file", "wc", "sha256sum", "md5sum", "mkdir", "rmdir", "touch", "source", ".", "vllm",
}  # fmt: skip
SAFE_LAUNCH = "setsid nohup ./launch.sh > launch.log 2>&1 < /dev/null &"


def glob_findings(commands: Sequence[SimpleCommand]) -> list[Finding]:
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
    return hazard(
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


def background_findings(commands: Sequence[SimpleCommand]) -> list[Finding]:
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
            hazard(
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


def unquoted_space_findings(
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
    return hazard(
        severity,
        UNQUOTED_SPACE,
        path,
        f"{what} ({path!r}) is not quoted: the shell splits it into separate arguments",
        f"quote it: {shlex.quote(path)}",
    )
