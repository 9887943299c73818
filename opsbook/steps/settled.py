"""A deploy with nothing to do: a host is settled when its server is the one the last complete
deploy left ready, and nothing the deploy reads or writes changed since.

A complete apply leaves a note beside the launch record (``settle``, one round trip per host):
the run's name, a digest of the deployment as the host sees it, with the opsbook that renders
its script and the secrets' values (hashed on the host: the values travel as every probe's
secrets do, masked in the journal, and no digest of them is kept here), the launch's PID and
start, and a digest of the checkpoint folder's listing (each file's path, size and modification
time). The next deploy asks one status of each host (``is_settled``): the server runs and
answers ``/health``, its launch inputs (script, env file, patched configs, engine) are those it
started with, the note names this launch, and the deployment and the checkpoint folder are as
noted. Then 00-05 would each find nothing to do, and the deploy says so without running them;
anything else, and the whole runbook runs. The digests stay on the host: only the verdicts
cross.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path

from opsbook.core.deployment import Deployment
from opsbook.core.results import Finding, Result
from opsbook.remote.protocol import RemoteHost
from opsbook.steps import restart_rule, server, triage
from opsbook.steps.launch_answers import SettleAnswer, SettledAnswer

# What differs, in the words a message uses.
DIFFERS = {
    "note": "no complete deploy is noted on the host",
    "launch": "the server is not the launch the last complete deploy left",
    "deployment": "the deployment (its file, a secret's value or opsbook itself) changed",
    "model": "the checkpoint folder's files changed",
}


@dataclass(frozen=True)
class Settled:
    """Whether a deploy has nothing to do on a host, and why (or why not)."""

    settled: bool
    message: str


def opsbook_digest() -> str:
    """A digest of the installed opsbook's files (path, size, modification time): a release,
    or an edit of a working copy, can render another script or patch otherwise."""
    package = Path(__file__).resolve().parents[1]
    total = hashlib.sha256()
    for root, dirs, names in os.walk(package):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(names):
            st = os.stat(os.path.join(root, name))
            total.update(f"{root}/{name}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return total.hexdigest()


def deployment_digest(deployment: Deployment, code: str, secrets: Sequence[str]) -> str:
    """A digest of the deployment as one host sees it and opsbook's own digest ``code``: with
    the secrets' values, what 02 and 03 decide from. The values ``secrets`` are masked before
    hashing (a value written in the file as well): the host hashes them in itself."""
    skipped = {"source", "host_views"}
    view = {
        f.name: getattr(deployment, f.name) for f in fields(deployment) if f.name not in skipped
    }
    text = json.dumps({"deployment": view, "opsbook": code}, sort_keys=True, default=repr)
    for value in sorted(secrets, key=len, reverse=True):
        text = text.replace(json.dumps(value)[1:-1], "***").replace(value, "***")
    return hashlib.sha256(text.encode()).hexdigest()


def is_settled(
    host: RemoteHost, deployment: Deployment, digest: str, secrets: Sequence[str]
) -> Settled:
    """One status of the host: whether a deploy of ``deployment`` (whose digest is ``digest``,
    launched with the secrets' values ``secrets``) has nothing to do there."""
    from opsbook.steps.script import server_api_key

    paths = server.resolve_paths(host, deployment)
    state = triage.server_state(
        host,
        paths,
        deployment.server_port,
        log_when_ready=False,
        inputs=restart_rule.run_inputs(deployment, paths),
        watch_metrics=True,
        api_key=server_api_key(deployment),
        settled={"deployment": digest, "secrets": list(secrets), "model": deployment.model_path},
    )
    if state.state != "ready":
        return Settled(False, f"the server is {state.state}")
    changed = [
        label
        for name, label in restart_rule.INPUT_NAMES.items()
        if state.inputs.get(name) != "same"
    ]
    if changed:
        listed = restart_rule.listed(changed)
        return Settled(False, f"the {listed} changed since the server started")
    return _from_note(state.settled)


def _from_note(answer: SettledAnswer | None) -> Settled:
    if answer is None or answer.run is None or "note" in answer.differs:
        return Settled(False, DIFFERS["note"])
    since = f"the deploy {answer.run} ({_when(answer.at)})"
    if answer.differs:
        said = "; ".join(DIFFERS.get(name, name) for name in answer.differs)
        return Settled(False, f"{said} since {since}")
    return Settled(
        True,
        f"ready and unchanged since {since}: the same launch, script, env file, configs, "
        "engine, deployment and checkpoint files",
    )


def note_settled(
    host: RemoteHost, deployment: Deployment, run: str, digest: str, secrets: Sequence[str]
) -> Result:
    """Note on the host that its ready server is what the deploy ``run`` left; a server that
    is not ready is not noted (the result says why)."""
    paths = server.resolve_paths(host, deployment)
    asked = paths.probe_args(
        op="settle",
        port=deployment.server_port,
        health_timeout=server.HEALTH_TIMEOUT,
        settled={
            "run": run,
            "deployment": digest,
            "secrets": list(secrets),
            "model": deployment.model_path,
        },
    )
    answer = SettleAnswer.parse(host.probe(server.PROBE, asked))
    if answer.noted:
        return Result(True, "noted: the next deploy with nothing to change does nothing")
    return Result(
        True,
        "not noted: the next deploy runs every stage",
        findings=[Finding("info", "settled note", answer.why)],
    )


def _when(at: float | None) -> str:
    return (
        "at an unknown time"
        if at is None
        else time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(at))
    )
