"""The download check across the nodes of a cluster: every node must hold the same checkpoint.

Each node gets the single-host check; then the checkpoints' fingerprints are compared: the
sha256 of every shard's name, size, safetensors header length and tensor count, as the check
read them (the paths may differ between nodes, the checkpoint may not). A node whose checkpoint
differs fails, and so does every node: the ranks of one model must load the same weights.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence

from opsbook.core.deployment import Deployment
from opsbook.core.results import Finding, Result, State
from opsbook.remote.protocol import RemoteHost
from opsbook.stages import cluster_reach, download_check
from opsbook.stages.base import Report
from opsbook.steps import shard_check


def run(
    hosts: Sequence[RemoteHost], deployment: Deployment, options: download_check.Options
) -> dict[str, Report]:
    """The download check on each node, then the fingerprints compared."""
    hosts, lost = cluster_reach.split(hosts)
    reports = {h.name: download_check.run(h, deployment.for_host(h.spec), options) for h in hosts}
    if lost:
        verdict = cluster_reach.without(lost, "compared")
        failed = {n: Report(State.FAILED, verdict, [verdict, *r.shows]) for n, r in reports.items()}
        return lost | failed
    prints = {
        name: fingerprint(r.check)
        for name, r in reports.items()
        if isinstance(r, download_check.DownloadReport)
    }
    if len(set(prints.values())) <= 1:
        return reports
    each = ", ".join(f"{name}: {value[:12]}" for name, value in prints.items())
    finding = Finding(
        "error",
        "checkpoint",
        f"the nodes hold different checkpoints (fingerprints {each})",
        remedy="copy the head's checkpoint to every node (the same files, byte for byte)",
    )
    verdict = Result(False, finding.message, findings=[finding])
    return {name: Report(State.FAILED, verdict, [verdict, *r.shows]) for name, r in reports.items()}


def fingerprint(check: shard_check.CheckResult) -> str:
    """sha256 of the shards' names, sizes, header lengths and tensor counts."""
    rows = sorted(
        [str(s.file), str(s.size), str(s.header_len), str(s.tensors)] for s in check.shards
    )
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()


__all__ = ["fingerprint", "run"]
