"""Download check on one host: every shard of the checkpoint against its index, in one probe."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from opsbook.core.deployment import Deployment
from opsbook.core.results import Result, State
from opsbook.knowledge.logscan import failure_for
from opsbook.remote.protocol import RemoteHost
from opsbook.stages.base import Report, limited
from opsbook.steps import record_facts, shard_check


@dataclass(kw_only=True)
class DownloadReport(Report):
    """The download check's report, with the check of the checkpoint as it stands (a cluster
    compares its nodes' checkpoints by it)."""

    check: shard_check.CheckResult


@dataclass(frozen=True)
class Options:
    """The download check's options.

    Args:
        model_path: the checkpoint (empty: the deployment's ``model.path``).
        full_hash: also hash every shard on the host.
        manifest: a local JSON file ``{"shard file name": "sha256"}`` to compare the hashes with.
        hash_cache: a file on the host remembering hashes by size and mtime.
        watch: follow a download in progress until it completes (or ``watch_timeout``).
        watch_timeout: seconds to follow it.
    """

    model_path: str = ""
    full_hash: bool = False
    manifest: str = ""
    hash_cache: str = ""
    watch: bool = False
    watch_timeout: int = limited(600, low=1)


def run(host: RemoteHost, deployment: Deployment, options: Options) -> Report:
    """Check the checkpoint's shards, sizes and headers (and with ``full_hash`` their sha256);
    changes nothing."""
    path = options.model_path or deployment.model_path
    check = shard_check.check_download(host, path)
    # The host's heading shows the check's message and problems; the rest is counted there.
    shows: list[object] = []
    verdict: Result = check
    if options.watch and not check.ok:
        verdict = shard_check.watch_download(host, path, timeout=options.watch_timeout)
        check = shard_check.check_download(host, path)
        shows = [verdict, check]
    if options.full_hash and check.ok:
        manifest = options.manifest
        known = json.loads(Path(manifest).read_text()) if manifest else None
        cache = options.hash_cache or None
        verdict = shard_check.hash_shards(host, path, manifest=known, cache_path=cache)
        shows.append(verdict)
    state = State.OK if verdict.ok else State.FAILED
    record_facts.note_download(host.name, deployment, check)
    failure = failure_id(check) if state is State.FAILED else ""
    return DownloadReport(state, verdict, shows, failure, check=check)


def failure_id(check: shard_check.CheckResult) -> str:
    """The failure vLLM would meet on this checkpoint (ids of
    opsbook/knowledge/data/failures.yaml)."""
    counts = shard_check.shard_counts(check)
    if counts.missing:
        return failure_for("shards-missing")
    if counts.truncated or counts.corrupt:
        return failure_for("shards-damaged")
    return ""
