"""Download check on one host: every shard of the checkpoint against its index, in one probe."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from opsbook.core.deployment import Deployment
from opsbook.core.results import Result, State
from opsbook.remote.probes import Prober
from opsbook.stages.base import Report
from opsbook.steps import shard_check


@dataclass(kw_only=True)
class DownloadReport(Report):
    """The download check's report, with the check of the checkpoint as it stands (a cluster
    compares its nodes' checkpoints by it)."""

    check: shard_check.CheckResult


def run(
    host: Prober,
    deployment: Deployment,
    *,
    model_path: str = "",
    full_hash: bool = False,
    manifest: str = "",
    hash_cache: str = "",
    watch: bool = False,
    watch_timeout: float = 600.0,
) -> Report:
    """Check the checkpoint's shards, sizes and headers (and with ``full_hash`` their sha256);
    changes nothing.

    Args:
        host: the host.
        deployment: its deployment.
        model_path: the checkpoint (default: the deployment's ``model.path``).
        full_hash: also hash every shard on the host.
        manifest: a local JSON file ``{"shard": "sha256"}`` to compare the hashes with.
        hash_cache: a file on the host remembering hashes by size and mtime.
        watch: follow a download in progress until it completes (or ``watch_timeout``).
        watch_timeout: seconds to follow it.
    """
    path = model_path or deployment.model_path
    check = shard_check.check_download(host, path)
    # The host's heading shows the check's message and problems; the rest is counted there.
    shows: list[object] = []
    verdict: Result = check
    if watch and not check.ok:
        verdict = shard_check.watch_download(host, path, timeout=watch_timeout)
        check = shard_check.check_download(host, path)
        shows = [verdict, check]
    if full_hash and check.ok:
        known = json.loads(Path(manifest).read_text()) if manifest else None
        verdict = shard_check.hash_shards(host, path, manifest=known, cache_path=hash_cache or None)
        shows.append(verdict)
    state = State.OK if verdict.ok else State.FAILED
    failure = failure_id(check) if state is State.FAILED else ""
    return DownloadReport(state, verdict, shows, failure, check=check)


def failure_id(check: shard_check.CheckResult) -> str:
    """The failure vLLM would meet on this checkpoint (ids of
    opsbook/knowledge/data/failures.yaml)."""
    counts = shard_check.shard_counts(check)
    if counts.missing:
        return "weights-missing"
    if counts.truncated or counts.corrupt:
        return "safetensors-corrupt"
    return ""
