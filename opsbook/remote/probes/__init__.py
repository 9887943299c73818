"""Probes: stdlib-only Python programs sent to a host's ``python3`` over stdin.

A probe module defines ``main(args: dict) -> object``. :func:`assemble` appends a footer that
calls it with the given arguments and prints one JSON document, so a check that needs many
facts from a host costs one round trip. The same program runs locally in unit tests.
"""

from __future__ import annotations

import ast
import base64
import functools
import hashlib
import io
import json
import re
import subprocess
import threading
import zlib
from importlib import resources
from typing import Any

from opsbook.core.exceptions import ProbeError

# The answer leaves in one write: ``json.dump`` writes piece by piece, and with an unbuffered
# stdout (PYTHONUNBUFFERED in the login environment) each piece is a write and an SSH packet:
# 36,000 of them for the download check of 1,190 shards.
#
# The answer is framed by marker lines: a login shell's banner (an `echo` in ~/.zshenv) or
# anything else printed around it does not break it.
BEGIN = "--- opsbook probe answer begins ---"
END = "--- opsbook probe answer ends ---"
# A large answer leaves compressed (zlib, then base64 for the text channel), marked by a prefix
# no JSON text begins with: the download check of 11,900 shards answers 977 kB of JSON, 61 kB
# so, and carrying the 977 kB over SSH cost 50 ms; compressing costs 2 ms, expanding 2 ms.
COMPRESSED = "z:"
COMPRESS_OVER = 64 * 1024

# The program sent: a loader, the probe's text as one string, and the call with its arguments.
# The loader keeps the probe's compiled code on the host (~/.cache/opsbook/remote/probes, one file a
# probe version and interpreter, in a folder only the user may write to): compiling a probe
# (50 KB for the download check) is most of a small probe's CPU, and every look at a starting
# server runs one. Without a usable folder it compiles, as before.
_PROGRAM = """
import marshal as _marshal, os as _os, sys as _sys
import _frozen_importlib_external as _external


def _probe_code(name, key, body):
    tag = "%s-%s" % (_sys.implementation.cache_tag, _external.MAGIC_NUMBER.hex())
    base = _os.environ.get("XDG_CACHE_HOME") or _os.path.join(_os.path.expanduser("~"), ".cache")
    folder = _os.path.join(base, "opsbook", "probes")
    kept = _os.path.join(folder, "%s-%s.%s.bin" % (name, key, tag))
    try:
        info = _os.stat(folder)
        trusted = info.st_uid == _os.getuid() and not info.st_mode & 0o022
    except OSError:
        trusted = None  # not made yet
    if trusted:
        try:
            with open(kept, "rb") as f:
                return _marshal.load(f)
        except Exception:
            pass
    code = compile(body, "<opsbook probe %s>" % name, "exec")
    if trusted is not False:
        try:
            _os.makedirs(folder, mode=0o700, exist_ok=True)
            partial = "%s.%d.tmp" % (kept, _os.getpid())
            with open(partial, "wb") as f:
                _marshal.dump(code, f)
            _os.replace(partial, kept)
            for old in _os.listdir(folder):  # this probe's earlier versions, same interpreter
                if old.startswith(name + "-") and old.endswith("." + tag + ".bin") and (
                    old != _os.path.basename(kept)
                ):
                    _os.unlink(_os.path.join(folder, old))
        except OSError:
            pass
    return code


_probe = {{"__name__": "opsbook_probe_{name}", "__builtins__": __builtins__}}
exec(_probe_code({name!r}, {key!r}, {body!r}), _probe)

import json as _json

_answer = _json.dumps(_probe["main"](_json.loads({args!r})))
if len(_answer) > {compress_over}:
    import base64 as _base64, zlib as _zlib
    _answer = "{compressed}" + _base64.b64encode(_zlib.compress(_answer.encode(), 1)).decode()
_sys.stdout.write("\\n{begin}\\n" + _answer + "\\n{end}\\n")
_sys.stdout.flush()
_sys.stderr.flush()
# Answered: the interpreter's teardown (freeing every object the probe made, one by one) is
# time the caller waits for and nobody needs, 4-6 ms of every probe. Nothing is left to run:
# a probe joins its threads and writes its files before it answers.
_os._exit(0)
"""


def source(name: str) -> str:
    """The text of probe ``name`` (``opsbook/remote/probes/<name>.py``)."""
    try:
        return resources.files(__name__).joinpath(f"{name}.py").read_text()
    except FileNotFoundError:
        raise ProbeError(f"there is no probe named {name!r}") from None


# A probe that hands another stdlib-only module of this folder to a second interpreter declares
# it (``INCLUDES = ("vllm_source",)``) and finds its text in ``INCLUDED_SOURCES`` on the host.
_INCLUDES = re.compile(r"^INCLUDES = \(([^)]*)\)", re.M)


def includes(text: str) -> list[str]:
    """The modules a probe's source declares in ``INCLUDES``."""
    found = _INCLUDES.search(text)
    return re.findall(r"[\"']([a-z_]+)[\"']", found.group(1)) if found else []


# How the host's interpreter runs the program sent on its standard input. Not ``python3 -``:
# CPython tokenizes a program read from a stream line by line, and the probe's source, carried
# as one string literal of tens of kB, then costs 30 ms of the host's CPU at every probe (82
# against 54 ms for the download check of 119 shards, 3.11); compiled from bytes it does not.
LAUNCHER = 'import sys; exec(compile(sys.stdin.buffer.read(), "<opsbook probe>", "exec"))'


def interpreter_argv(python: str) -> list[str]:
    """The command line that runs a program given on standard input with ``python``."""
    return [python, "-c", LAUNCHER]


def assemble(name: str, args: dict[str, Any] | None = None) -> str:
    """The program to send: a loader, the probe's source and the text of the modules it
    includes (compiled on the host once per version, see ``_PROGRAM``), and the call that runs
    it on ``args``."""
    body, key = probe_body(name)
    return _PROGRAM.format(
        name=name,
        key=key,
        body=body,
        args=json.dumps(args or {}),
        begin=BEGIN,
        end=END,
        compressed=COMPRESSED,
        compress_over=COMPRESS_OVER,
    )


# A stage's hosts assemble their probes in threads at once, and CPython 3.11's ast.parse is not
# safe in concurrent threads ("SystemError: AST constructor recursion depth mismatch",
# python/cpython issue 106905, seen on a 4-host fleet's preflight): one assembly at a time.
_ASSEMBLY = threading.Lock()


def probe_body(name: str) -> tuple[str, str]:
    """Probe ``name``'s source joined with its parts, with the modules it includes, and a
    digest naming that text."""
    with _ASSEMBLY:
        return _assembled(name)


@functools.cache
def _assembled(name: str) -> tuple[str, str]:
    text = joined(name)
    carried = {dep: source(dep) for dep in includes(text)}
    if carried:
        text += f"\n\nINCLUDED_SOURCES.update({carried!r})\n"
    return text, hashlib.sha256(text.encode()).hexdigest()[:16]


# A probe too long for one module is split by job into parts: stdlib-only modules of this folder
# that it imports relatively (``from .shard_read import locate``), so that each is a module
# mypy and the unit tests see. The host gets one program: the probe's text, then each part's,
# once, in the order first imported, with the relative imports and the parts' own
# ``from __future__`` lines (allowed only at a program's top) cut out. All share one namespace
# there, so two of them may not bind one name differently.


def joined(name: str) -> str:
    """Probe ``name``'s source followed by the parts it imports, as one program."""
    texts: dict[str, str] = {}
    bound: dict[str, tuple[str, str]] = {}
    waiting = [name]
    while waiting:
        module = waiting.pop(0)
        if module in texts:
            continue
        texts[module], parts = _unlinked(module, source(module), part=module != name)
        _bind_once(module, texts[module], bound)
        waiting += parts
    return "\n\n".join(texts.values())


def _unlinked(module: str, text: str, *, part: bool) -> tuple[str, list[str]]:
    """``text`` without its imports of parts (nor, for a part, its ``__future__`` line), and
    the parts it imports."""
    lines = text.split("\n")
    parts: list[str] = []
    for node in ast.parse(text).body:
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level == 1 and node.module and "." not in node.module:
            parts.append(node.module)
        elif node.level:
            raise ProbeError(
                f"probe module {module!r} imports {'.' * node.level}{node.module or ''}: a probe"
                " joins only its folder's modules, imported as `from .name import ...`"
            )
        elif not (part and node.module == "__future__"):
            continue
        end = node.end_lineno or node.lineno
        lines[node.lineno - 1 : end] = [""] * (end - node.lineno + 1)
    return "\n".join(lines), parts


def _bind_once(module: str, text: str, bound: dict[str, tuple[str, str]]) -> None:
    """Note the top-level names ``text`` binds; raise if another joined module binds one of
    them otherwise (the same statement in both, ``TYPE_CHECKING = False``, is no conflict)."""
    lines = io.StringIO(text, newline="").readlines()
    for node in ast.parse(text).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names = [node.name]
        elif isinstance(node, ast.Assign):
            names = [t.id for t in node.targets if isinstance(t, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names = [node.target.id]
        else:
            continue
        statement = _segment(lines, node)
        for bound_name in names:
            earlier = bound.setdefault(bound_name, (module, statement))
            if earlier[1] != statement:
                raise ProbeError(
                    f"probe modules {earlier[0]!r} and {module!r} both define {bound_name!r},"
                    " and share one namespace on the host: rename one"
                )


def _segment(lines: list[str], node: ast.stmt) -> str:
    """``ast.get_source_segment`` of a statement, from the text's lines split once: that
    function splits the whole text again for each statement it is asked about, which made a
    probe's first assembly cost 0.1-0.15 s of CPU (the launch probe's 90 statements), in every
    process that sends it."""
    first, last = node.lineno - 1, (node.end_lineno or node.lineno) - 1
    end = node.end_col_offset if node.end_col_offset is not None else len(lines[last].encode())
    # Column offsets count the UTF-8 bytes of a line, as the parser reads it.
    if first == last:
        return lines[first].encode()[node.col_offset : end].decode()
    head = lines[first].encode()[node.col_offset :].decode()
    return "".join([head, *lines[first + 1 : last], lines[last].encode()[:end].decode()])


def is_framed(stdout: str) -> bool:
    """Whether the output holds a probe's framed answer (the probe ran to its end)."""
    return BEGIN in stdout and END in stdout


def _framed_span(stdout: str) -> tuple[int, int] | None:
    """Where the text between the last answer's markers begins and ends, or None."""
    start = stdout.rfind(BEGIN)
    if start < 0:
        return None
    end = stdout.find(END, start)
    return (start + len(BEGIN), end) if end >= 0 else None


def _framed(stdout: str) -> str | None:
    """The text between the last answer's markers, or None if there is none."""
    span = _framed_span(stdout)
    return stdout[span[0] : span[1]] if span else None


def decode(name: str, stdout: str, stderr: str, exit_code: int, where: str = "localhost") -> Any:
    """Decode a probe's answer, or raise :class:`ProbeError` carrying its stderr."""
    if exit_code != 0:
        raise ProbeError(
            f"probe {name!r} failed with exit code {exit_code}: {_last_line(stderr)}",
            host=where,
            remedy="read the probe's stderr below; the host needs a python3 (3.8+) on PATH",
            stderr=stderr,
        )
    answer = _framed(stdout)
    try:
        if answer is None:
            raise json.JSONDecodeError("no framed answer", stdout, 0)
        return json.loads(_expanded(answer))
    except (ValueError, zlib.error):  # JSONDecodeError and binascii.Error are ValueErrors
        raise ProbeError(
            f"probe {name!r} did not answer JSON (got {stdout[:200]!r})",
            host=where,
            remedy="something on the host printed to stdout; check the login scripts",
            stderr=stderr,
        ) from None


def _expanded(answer: str) -> str:
    """The answer's JSON text, expanded if it left compressed."""
    text = answer.strip()
    if not text.startswith(COMPRESSED):
        return text
    return zlib.decompress(base64.b64decode(text[len(COMPRESSED) :], validate=True)).decode()


def readable(stdout: str) -> str:
    """``stdout`` with a compressed answer expanded: what the journal keeps of a command's
    output is what a reader can read, and what the redactor can mask secrets in."""
    span = _framed_span(stdout) if COMPRESSED in stdout else None
    if span is None:
        return stdout
    start, end = span
    if not stdout[start:end].strip().startswith(COMPRESSED):
        return stdout
    try:
        text = _expanded(stdout[start:end])
    except (ValueError, zlib.error):
        return stdout  # not an answer of ours: kept as it came
    return stdout[:start] + "\n" + text + "\n" + stdout[end:]


def run_local(
    name: str,
    args: dict[str, Any] | None = None,
    python: str = "/usr/bin/python3",
    env: dict[str, str] | None = None,
    timeout: float = 120.0,
) -> Any:
    """Run probe ``name`` with a local interpreter, exactly as a host would (for tests)."""
    proc = subprocess.run(
        interpreter_argv(python),
        input=assemble(name, args),
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )
    return decode(name, proc.stdout, proc.stderr, proc.returncode)


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "(no stderr)"
