"""Which nodes of a cluster answer, before a cluster stage acts on them together.

A cluster stage asks its nodes one after another (the head about the workers, a worker about
the head); one node out of reach would otherwise end the whole stage as a tool failure. Each
node is reached once, all at once: one that does not answer is reported unreachable (exit 4,
as on one host), and the others go on to what the stage can still say without it.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from opsbook.core.exceptions import HostUnreachable
from opsbook.core.results import Finding, Result, State
from opsbook.remote.protocol import RemoteHost
from opsbook.stages.base import Report


def split(hosts: Sequence[RemoteHost]) -> tuple[list[RemoteHost], dict[str, Report]]:
    """The hosts that answer a command, and an unreachable report for each that does not."""
    if not hosts:
        return [], {}
    with ThreadPoolExecutor(max_workers=len(hosts)) as pool:
        errors = list(pool.map(_unreachable, hosts))
    reached = [h for h, e in zip(hosts, errors, strict=True) if e is None]
    lost = {
        h.name: Report(State.UNREACHABLE, _unreachable_verdict(h, e))
        for h, e in zip(hosts, errors, strict=True)
        if e is not None
    }
    return reached, lost


def _unreachable_verdict(host: RemoteHost, error: HostUnreachable) -> Result:
    finding = Finding("error", host.name, error.message, error.remedy or "")
    return Result(False, error.message, findings=[finding])


def _unreachable(host: RemoteHost) -> HostUnreachable | None:
    try:
        host.run("true", label="reach the node")
    except HostUnreachable as e:
        return e
    return None


def without(lost: dict[str, Report], doing: str) -> Result:
    """The verdict of a node that took no part because others were out of reach."""
    names = ", ".join(lost)
    return Result(
        False,
        f"not {doing}: the cluster needs every node, and {names} is unreachable",
        findings=[Finding("error", name, "unreachable") for name in lost],
    )


__all__ = ["split", "without"]
