"""Launch script on one host: render it from the deployment, and with ``apply=True`` upload it
over SFTP and check it with ``bash -n``."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from opsbook.core.deployment import Deployment
from opsbook.core.exceptions import TransferError
from opsbook.core.results import Result, State
from opsbook.remote.protocol import RemoteHost
from opsbook.stages.base import HostChoice, Note, Report, StageRun, limited
from opsbook.steps import script


def script_sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class Options:
    """The launch script's options.

    Args:
        entrypoint: ``"serve"`` (``vllm serve MODEL``) or ``"module"`` (``python -m
            vllm.entrypoints...``).
        apply: upload the script (a dry run otherwise).
    """

    entrypoint: str = limited("serve", choices=script.ENTRYPOINTS)
    apply: bool = False


def upload_choice(run: StageRun) -> HostChoice:
    """The hosts of a dry run that the notebook's upload button may act on (the reachable
    ones), chosen by default when their script differs from the rendered one."""
    return run.choice(run.hosts_in(State.WOULD_CHANGE))


def run(host: RemoteHost, deployment: Deployment, options: Options) -> Report:
    """Render the script; ok when the host already has it, would change (dry run) or changed
    (uploaded and accepted by ``bash -n``) when it differs, failed when bash rejects it."""
    text = script.render_script(deployment, entrypoint=options.entrypoint)
    digest = script_sha256(text)
    path = script.resolve_remote_path(host, deployment.script_path)
    previous = _current(host, path)
    if previous is not None and not script.written_by_opsbook(previous):
        # Not shown, nor diffed: a file of the operator's own may hold anything.
        return Report(State.FAILED, script.not_ours(path), [], "", digest)
    diff = script.script_diff(previous, text, path)
    shows: list[object] = [Note(f"script {path}, sha256 {digest[:12]}")]
    if previous != text:
        shows.append(script.diff_html(diff, path))
    if not options.apply:
        if previous == text:
            return Report(State.OK, Result(True, f"{path} is up to date"), shows, "", digest)
        verdict = Result(True, f"would write {path} (sha256 {digest[:12]}); apply=True to upload")
        return Report(State.WOULD_CHANGE, verdict, shows, "", digest)
    uploaded = script.upload_script(host, deployment, text, previous=previous)
    if not uploaded.ok:
        return Report(State.FAILED, uploaded, shows, "", digest)
    state = State.OK if previous == text else State.CHANGED
    return Report(state, uploaded, shows, "", digest)


def _current(host: RemoteHost, path: str) -> str | None:
    try:
        return host.read_bytes(path).decode(errors="replace")
    except TransferError:
        return None
