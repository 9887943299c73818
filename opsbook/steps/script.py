"""03_launch_script: render the server's launch script, upload it, check its syntax.

The incident's inline ``ssh host 'pkill ...; nohup python3 -m vllm ... &'`` line failed
silently; what worked was a script on the host started with ``nohup``. :func:`render_script`
writes that script from the deployment, with every value quoted so that nothing in it (a model
path with spaces and quotes, an argument containing ``$(...)``) reaches bash as code.
:func:`upload_script` puts it on the host over SFTP and runs ``bash -n`` on it.

Serve arguments (``server.args`` in the deployment file) become flags, in the file's order:

- ``name: value`` -> ``--name value`` (numbers and strings as written);
- ``name: true`` -> ``--name`` (a bare flag);
- ``name: false`` or ``null`` -> omitted; to turn off a feature that vLLM enables by default,
  write its negative flag: ``no-enable-prefix-caching: true``;
- ``name: [a, b]`` -> ``--name a b`` (one flag, the values after it, as vLLM's ``nargs='+'``
  options expect); an empty list is omitted;
- ``name: {key: value}`` -> ``--name '{"key":"value"}'`` (compact JSON, as vLLM parses dict
  options such as ``--compilation-config``); dicts or lists inside a list become JSON too.

Flag names are lower case letters, digits and dashes; dotted sub-keys such as
``compilation-config.pass_config.fuse_allreduce_rms`` may also hold underscores. ``model`` and
``port`` are not serve arguments: they come from ``model.path`` and ``server.port``.

Secrets: variables named in the deployment's ``secrets`` are never written into the script.
At start the script sources ``<script>.env`` (e.g. ``launch.sh.env``), the file next to it
holding ``export NAME=value`` lines, if that file exists; it refuses to start if that file is
readable by group or others. :func:`upload_secrets` writes it with mode 0600, and
:func:`upload_script` calls it when there is a secret to deliver, and removes the file when
there is none (a file left by an earlier deployment would still be sourced). A ``server.env``
entry whose name says it is a secret (``VLLM_API_KEY``, ``*_TOKEN``, ``*_PASSWORD``) goes to
that file too, never into the script.

A serve argument whose name says it holds a secret (``api-key``, ``hf-token``, see
``opsbook.core.deployment.is_secret_flag``) is never written into the script either, even when its
value sits in the deployment file: the value goes to the secrets file. ``api-key`` and
``hf-token`` become the variables vLLM reads by itself (``VLLM_API_KEY``, ``HF_TOKEN``), so the
value is not on the server's command line, which every user of the host can read in ``ps``;
any other such flag is written as a reference, ``--flag "$OPSBOOK_SECRET_FLAG"``. The script
refuses to start when such a variable is unset.
"""

from __future__ import annotations

import difflib
import enum
import html
import json
import os
import posixpath
import re
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from opsbook.core.deployment import ENV_NAME, Deployment, check_flag_name
from opsbook.core.diffs import Diff
from opsbook.core.exceptions import DeploymentError
from opsbook.core.redact import Redactor
from opsbook.core.results import Finding, Result
from opsbook.remote.protocol import RemoteHost
from opsbook.steps.cluster import with_cluster_settings

ENTRYPOINTS = ("serve", "module")
API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"
SECRETS_SUFFIX = ".env"
SCRIPT_MODE = 0o755
NEW_FILE = "new file"
CONTINUATION = " \\\n  "
# Secret serve arguments that vLLM also reads from an environment variable of its own.
SECRET_FLAG_VARIABLES = {"api-key": "VLLM_API_KEY", "hf-token": "HF_TOKEN"}
SECRET_VARIABLE_PREFIX = "OPSBOOK_SECRET_"


class _NotRead(enum.Enum):
    """The caller has not read the script on the host (a sentinel: None means "no file")."""

    NOT_READ = "not read"


NOT_READ = _NotRead.NOT_READ


@dataclass(frozen=True)
class SecretArg:
    """A secret serve argument and the variable that carries its value to the server.

    Args:
        flag: the flag name without ``--``.
        variable: the variable the secrets file sets.
        value: the secret.
        on_command_line: False when vLLM reads ``variable`` itself and the flag is left out.
    """

    flag: str
    variable: str
    value: str
    on_command_line: bool


@dataclass(frozen=True)
class Html:
    """HTML for a notebook cell; prints as the plain text it shows."""

    html: str
    text: str

    def _repr_html_(self) -> str:
        return self.html

    def __str__(self) -> str:
        return self.text

    def __repr__(self) -> str:
        # A notebook's text/plain output (and nbval) then holds the script, not its markup.
        return self.text


# -- rendering -------------------------------------------------------------------------------


def render_script(deployment: Deployment, *, entrypoint: str = "serve") -> str:
    """The bash launch script of ``deployment``.

    The text depends only on the deployment (no date, no host facts), so rendering twice gives
    the same bytes and an upload of an unchanged deployment changes nothing.

    Args:
        deployment: the deployment to launch.
        entrypoint: ``serve`` runs ``vllm serve MODEL`` with the ``vllm`` executable next to the
            deployment's python (``vllm`` from PATH when python is a bare name); ``module`` runs
            ``python -m vllm.entrypoints.openai.api_server --model MODEL`` (the older form the
            incident used, deprecated upstream).

    Returns:
        The script text, ending with a newline.

    Raises:
        DeploymentError: an unknown entrypoint, a bad flag or environment variable name, or a
            serve argument that must be set elsewhere (``model``, ``port``).
    """
    if entrypoint not in ENTRYPOINTS:
        raise DeploymentError(
            f"unknown entrypoint {entrypoint!r}",
            remedy=f"use one of {', '.join(ENTRYPOINTS)}",
        )
    # Served across nodes: the parallel sizes, the Ray executor and RAY_ADDRESS join in.
    deployment = with_cluster_settings(deployment)
    parts = [
        _header(deployment),
        "set -euo pipefail\n",
        _env_lines(deployment),
        _secrets_loader(deployment),
        _secret_checks(deployment),
        _exec_line(deployment, entrypoint),
    ]
    return "\n".join(part for part in parts if part)


def serve_flags(args: Mapping[str, Any]) -> list[list[str]]:
    """The serve arguments as flag groups (``["--flag", "value", ...]``), unquoted.

    Raises:
        DeploymentError: a flag name is invalid or reserved.
    """
    groups = []
    for name, value in args.items():
        flag = check_flag_name(str(name))
        values = _flag_values(value)
        if values is not None:
            groups.append([f"--{flag}", *values])
    return groups


def secret_args(deployment: Deployment) -> list[SecretArg]:
    """The deployment's secret serve arguments and the variables that carry them, in order.

    Raises:
        DeploymentError: a flag name is invalid or reserved.
    """
    found = []
    for flag, values in deployment.secret_args().items():
        flag = check_flag_name(flag)
        if len(values) == 1 and flag in SECRET_FLAG_VARIABLES:
            found.append(SecretArg(flag, SECRET_FLAG_VARIABLES[flag], values[0], False))
            continue
        stem = SECRET_VARIABLE_PREFIX + re.sub(r"[^A-Z0-9]", "_", flag.upper())
        for number, value in enumerate(values, start=1):
            variable = stem if len(values) == 1 else f"{stem}_{number}"
            found.append(SecretArg(flag, variable, value, True))
    return found


def server_api_key(deployment: Deployment, environ: Mapping[str, str] | None = None) -> str | None:
    """The API key the server will require (the ``api-key`` serve argument, else
    ``VLLM_API_KEY`` from ``environ`` or ``server.env``), for clients such as a smoke test;
    None when it requires none.

    Raises:
        DeploymentError: a flag name is invalid or reserved.
    """
    keys = [arg.value for arg in secret_args(deployment) if arg.flag == "api-key"]
    return keys[0] if keys else _secret_values(deployment, environ).get("VLLM_API_KEY")


def vllm_executable(python: str) -> str:
    """The ``vllm`` console script installed next to ``python`` (``vllm`` if it has no folder)."""
    folder = posixpath.dirname(python)
    return posixpath.join(folder, "vllm") if folder else "vllm"


def secrets_path(script_path: str) -> str:
    """Where the secrets file of the script at ``script_path`` lives."""
    return script_path + SECRETS_SUFFIX


def shell_word(path: str) -> str:
    """``path`` quoted for bash; a leading ``~/`` keeps meaning the home folder."""
    if path == "~":
        return '"$HOME"'
    if path.startswith("~/"):
        return '"$HOME"/' + shlex.quote(path[2:])
    return shlex.quote(path)


# The second line of every launch script opsbook writes: how it knows a file at the script's
# path is its own to replace.
HEADER_START = "# Launch script of deployment "
HEADER_MARK = ", written by opsbook ("


def written_by_opsbook(text: str) -> bool:
    """Whether ``text`` is a launch script opsbook rendered (its second line says so)."""
    lines = text.split("\n", 2)
    return len(lines) > 1 and lines[1].startswith(HEADER_START) and HEADER_MARK in lines[1]


@dataclass(kw_only=True, repr=False)
class UploadResult(Result):
    """The launch script's upload.

    Args:
        path: where the script is, absolute.
        diff: the unified diff against the script that was there, ``"new file"``, or ``""``
            when unchanged.
        syntax_ok: ``bash -n`` accepts the script (False too when it was not checked: a file
            opsbook did not write is left as it is).
        unchanged: the file already held the script.
        written: the file was written (its text or its mode differed).
        secrets: the variable names written to the secrets file; empty when it was not
            written.
    """

    path: str
    diff: str = ""
    syntax_ok: bool = False
    unchanged: bool = False
    written: bool = False
    secrets: list[str] = field(default_factory=list)


def not_ours(path: str) -> UploadResult:
    """The refusal to replace a file at the script's path that opsbook did not write."""
    finding = Finding(
        "error",
        path,
        f"{path} exists and opsbook did not write it (its second line does not say so): "
        "it is left as it is",
        remedy="set paths.script in the deployment to a file of opsbook's own, or move that "
        "file away",
    )
    message = f"{path} is not opsbook's launch script: left as it is"
    return UploadResult(False, message, findings=[finding], path=path)


def _header(deployment: Deployment) -> str:
    name = " ".join(deployment.name.split())
    return (
        "#!/bin/bash\n"
        f"{HEADER_START}{name!r}{HEADER_MARK}03_launch_script).\n"
        "# Re-render it from the deployment file rather than editing it here: edits are lost.\n"
    )


def _env_lines(deployment: Deployment) -> str:
    secret = set(deployment.secrets)
    lines = []
    for name, value in deployment.env.items():
        if not ENV_NAME.match(name):
            raise DeploymentError(
                f"{name!r} is not a valid environment variable name",
                remedy="use letters, digits and underscores, not starting with a digit",
            )
        if name not in secret and not deployment.is_secret_variable(name):
            lines.append(f"export {name}={shlex.quote(str(value))}\n")
    return "".join(lines)


def _secrets_loader(deployment: Deployment) -> str:
    names = ", ".join(dict.fromkeys([*deployment.secrets, *_secret_variables(deployment)]))
    # The path is derived at run time so the script keeps working when moved with its env file.
    return (
        f"# Secret variables ({names}) are not written here: they are read from this\n"
        f"# script's path + {SECRETS_SUFFIX}, a file only its owner may read (mode 0600).\n"
        f'secrets_file="${{BASH_SOURCE[0]}}{SECRETS_SUFFIX}"\n'
        "if [[ -f $secrets_file ]]; then\n"
        '  if [[ -n $(find "$secrets_file" -maxdepth 0 -perm /077) ]]; then\n'
        '    echo "opsbook: $secrets_file is readable by other users;'
        ' run: chmod 600 \\"$secrets_file\\"" >&2\n'
        "    exit 1\n"
        "  fi\n"
        '  source "$secrets_file"\n'
        "fi\n"
    )


def _secret_variables(deployment: Deployment) -> list[str]:
    return [arg.variable for arg in secret_args(deployment)]


def _secret_checks(deployment: Deployment) -> str:
    # Without this, a missing secrets file would start a server without its API key.
    blocks = []
    for arg in secret_args(deployment):
        blocks.append(
            f"if [[ -z ${{{arg.variable}:-}} ]]; then\n"
            f'  echo "opsbook: {arg.variable} (serve argument --{arg.flag}) is not set by'
            ' $secrets_file; write it with upload_secrets (notebook 03_launch_script)" >&2\n'
            "  exit 1\n"
            "fi\n"
        )
    return "".join(blocks)


def _exec_line(deployment: Deployment, entrypoint: str) -> str:
    if entrypoint == "serve":
        vllm = shell_word(vllm_executable(deployment.python))
        lines = [f"{vllm} serve", shell_word(deployment.model_path)]
    else:
        lines = [
            f"{shell_word(deployment.python)} -m {API_SERVER_MODULE}",
            f"--model {shell_word(deployment.model_path)}",
        ]
    lines += _flag_lines(deployment)
    lines.append(f"--port {deployment.server_port}")
    return "exec " + CONTINUATION.join(lines) + "\n"


def _flag_lines(deployment: Deployment) -> list[str]:
    """One line per serve argument, in the file's order; secrets as variable references."""
    secret: dict[str, list[SecretArg]] = {}
    for arg in secret_args(deployment):
        secret.setdefault(arg.flag, []).append(arg)
    lines = []
    for name, value in deployment.serve_args.items():
        flag = check_flag_name(str(name))
        if flag in secret:
            shown = [f'"${arg.variable}"' for arg in secret[flag] if arg.on_command_line]
            if shown:
                lines.append(" ".join([f"--{flag}", *shown]))
            continue
        group = serve_flags({flag: value})
        lines += [" ".join(shlex.quote(word) for word in words) for words in group]
    return lines


def _flag_values(value: Any) -> list[str] | None:
    if value is None or value is False:
        return None
    if value is True:
        return []
    if isinstance(value, (list, tuple)):
        return [_scalar(v) for v in value] or None
    return [_scalar(value)]


def _scalar(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, (bool, dict, list, tuple)) or value is None:
        return json.dumps(value, separators=(",", ":"))
    return str(value)


# -- uploading -------------------------------------------------------------------------------


def upload_script(
    host: RemoteHost,
    deployment: Deployment,
    text: str,
    *,
    environ: Mapping[str, str] | None = None,
    previous: str | None | _NotRead = NOT_READ,
) -> UploadResult:
    """Write the launch script to ``deployment.script_path`` on the host and check its syntax;
    write its secrets file too when there is a secret to deliver.

    The folder is created if missing; the file is replaced atomically over SFTP with mode
    0755 (nothing passes through a shell's quoting) unless it already holds ``text`` with that
    mode; then ``bash -n`` checks it on the host. A relative or ``~/`` path is taken from the
    remote home folder. When the deployment has secret serve arguments, or a secret variable
    has a value in ``environ``, :func:`upload_secrets` writes the secrets file the script reads
    (a script whose secrets stay behind would start without them, or not at all).

    Args:
        host: the host (an :class:`opsbook.remote.hosts.Host`).
        deployment: where the script goes.
        text: the script, usually from :func:`render_script`.
        environ: where secret variables' values come from (default: ``os.environ``).
        previous: the script the caller has just read at the path (None: no file there), so
            that it is not read twice; read here when not given, or when the host's answer
            about the file disagrees.

    A file at the path that opsbook did not write (:func:`written_by_opsbook`) is left as it
    is, and so is a secrets file beside it: the answer is then not ok, naming it.

    Returns:
        An :class:`UploadResult`, ``ok`` when bash accepts the syntax.

    Raises:
        HostError: the folder could not be created or the host could not be reached.
        TransferError: the upload failed.
    """
    path = resolve_remote_path(host, deployment.script_path)
    has_secrets = bool(_secret_values(deployment, environ))
    # A secrets file left by an earlier deployment would still be sourced (an old API key):
    # with no secret to deliver, it goes in the same round trip that prepares the folder.
    stale = None if has_secrets else secrets_path(path)
    previous, mode, stale_found = _previous_script(host, path, stale, previous)
    if previous is not None and not written_by_opsbook(previous):
        return not_ours(path)
    if stale and stale_found:
        host.run(f"rm -f -- {shlex.quote(stale)}", check=True, label=f"remove {stale}")
    unchanged = previous == text
    written = not (unchanged and mode == SCRIPT_MODE)
    if written:
        host.upload(path, text, mode=SCRIPT_MODE)
    check = host.run(f"bash -n -- {shlex.quote(path)}", label=f"bash -n {path}")
    syntax_ok = check.exit_code == 0
    delivered: list[str] = []
    if syntax_ok and has_secrets:
        delivered = upload_secrets(host, deployment, environ).names
    findings: list[Finding] = []
    if syntax_ok:
        done = (
            "unchanged" if unchanged else ("written (new file)" if previous is None else "updated")
        )
        message = f"launch script {path} {done}; bash -n: syntax OK"
        if delivered:
            message += f"; secrets file written ({', '.join(delivered)})"
    else:
        message = f"launch script {path} has a syntax error"
        findings.append(
            Finding(
                "error",
                path,
                f"bash -n rejects the script: {check.stderr.strip()}",
                remedy="re-render the script with render_script; do not edit it by hand",
                source="bash -n",
            )
        )
    return UploadResult(
        syntax_ok,
        message,
        findings=findings,
        path=path,
        diff=script_diff(previous, text, path),
        syntax_ok=syntax_ok,
        unchanged=unchanged,
        written=written,
        secrets=delivered,
    )


@dataclass(kw_only=True, repr=False)
class SecretsResult(Result):
    """The secrets file written: its path and the variables in it (never their values)."""

    path: str
    names: list[str]


def upload_secrets(
    host: RemoteHost, deployment: Deployment, environ: Mapping[str, str] | None = None
) -> SecretsResult:
    """Write the script's secrets file (mode 0600) from the local environment.

    Values of the secret variables come from ``environ`` (default: ``os.environ``), else from
    the deployment's ``server.env``; values of secret serve arguments (:func:`secret_args`)
    from the deployment, after them, so that an explicit ``hf-token`` wins over ``HF_TOKEN``.
    They travel on the command's standard input, never on a command line, and the file is
    created under ``umask 077`` before being renamed into place.

    Returns:
        ``ok`` with the file's ``path`` and ``names`` (the variables written; never their
        values).

    Raises:
        HostError: the file could not be written.
    """
    present = _secret_values(deployment, environ)
    path = secrets_path(resolve_remote_path(host, deployment.script_path))
    folder = posixpath.dirname(path)
    temp = f"{path}.opsbook-tmp"
    body = "".join(f"export {n}={shlex.quote(v)}\n" for n, v in present.items())
    host.run(
        f"umask 077 && mkdir -p -- {shlex.quote(folder)} && rm -f -- {shlex.quote(temp)}"
        f" && cat > {shlex.quote(temp)}"
        f" && chmod 600 -- {shlex.quote(temp)} && mv -f -- {shlex.quote(temp)} {shlex.quote(path)}",
        stdin=body,
        check=True,
        label=f"write secrets file {path} ({', '.join(present) or 'empty'})",
    )
    names = sorted(present)
    message = f"secrets file {path} written with {len(names)} variable(s)"
    return SecretsResult(True, message, path=path, names=names)


def _secret_values(
    deployment: Deployment, environ: Mapping[str, str] | None = None
) -> dict[str, str]:
    """What the secrets file holds: variable name -> value, for those that have one: the
    ``secrets`` variables and the ``server.env`` entries whose name says they are secret."""
    source = os.environ if environ is None else environ
    names = [*deployment.secrets, *(n for n in deployment.env if deployment.is_secret_variable(n))]
    values = {n: source.get(n) or deployment.env.get(n) for n in dict.fromkeys(names)}
    present = {n: v for n, v in values.items() if v}
    for arg in secret_args(deployment):
        present.pop(arg.variable, None)
        present[arg.variable] = arg.value
    return present


def resolve_remote_path(host: RemoteHost, path: str) -> str:
    """``path`` made absolute: ``~/x`` and relative paths are taken from the remote home.

    Raises:
        HostError: the home folder could not be read.
    """
    if path.startswith("/"):
        return posixpath.normpath(path)
    home = host.home_folder()
    relative = path[2:] if path.startswith("~/") else ("" if path == "~" else path)
    return posixpath.normpath(posixpath.join(home, relative))


def script_diff(previous: str | None, new: str, path: str) -> str:
    """A unified diff from the script on the host to ``new``; ``"new file"`` if there was none,
    ``""`` when they are the same."""
    if previous is None:
        return NEW_FILE
    lines = difflib.unified_diff(
        previous.splitlines(keepends=True),
        new.splitlines(keepends=True),
        fromfile=f"{path} (on the host)",
        tofile=f"{path} (rendered)",
    )
    return "".join(line if line.endswith("\n") else line + "\n" for line in lines)


def _previous_script(
    host: RemoteHost, path: str, stale: str | None = None, known: str | None | _NotRead = NOT_READ
) -> tuple[str | None, int | None, bool]:
    """Create the folder; the script already at ``path`` and its mode, if any, and whether a
    file ``stale`` is there. ``known`` is the script as the caller read it, used when a file is
    still there."""
    quoted = shlex.quote(path)
    look = f" && if [[ -e {shlex.quote(stale)} ]]; then echo stale=yes; fi" if stale else ""
    probe = host.run(
        f"mkdir -p -- {shlex.quote(posixpath.dirname(path))}"
        f" && if [[ -f {quoted} ]]; then echo mode=$(stat -c %a -- {quoted}); fi{look}",
        check=True,
        label=f"prepare {posixpath.dirname(path)}",
    )
    answers = dict(line.partition("=")[::2] for line in probe.stdout.splitlines() if "=" in line)
    stale_found = answers.get("stale") == "yes"
    if "mode" not in answers:
        return None, None, stale_found
    text = known if isinstance(known, str) else host.read_bytes(path).decode(errors="replace")
    mode = int(answers["mode"], 8) if answers["mode"].isdigit() else None
    return text, mode, stale_found


# -- notebook display ------------------------------------------------------------------------


def highlight(text: str, secrets: Iterable[str] = ()) -> Html:
    """``text`` as highlighted bash for a notebook (plain ``<pre>`` without pygments), with
    ``secrets`` and anything shaped like a token masked: what a notebook shows is filed in
    run records.

    Args:
        text: the script.
        secrets: values to mask, e.g. ``deployment.secret_values()``.
    """
    shown = Redactor(secrets).redact(text)
    return Html(_pygmentize(shown, "bash"), shown)


def diff_html(diff: str, path: str = "") -> Html | Diff:
    """A unified diff coloured for a notebook (and kept in the run record); ``"new file"`` and
    ``""`` shown as words."""
    if diff in ("", NEW_FILE):
        words = "no change" if diff == "" else "new file (nothing to compare with)"
        return Html(f"<p><i>{words}</i></p>", words)
    return Diff(diff, f"launch script {path}".rstrip())


def _pygmentize(text: str, language: str) -> str:
    try:
        from pygments import highlight as pyg_highlight
        from pygments.formatters import HtmlFormatter
        from pygments.lexers import get_lexer_by_name
    except ImportError:
        return f"<pre>{html.escape(text)}</pre>"
    # Inline styles: a notebook saved to HTML keeps its colours without a stylesheet.
    return pyg_highlight(text, get_lexer_by_name(language), HtmlFormatter(noclasses=True))
