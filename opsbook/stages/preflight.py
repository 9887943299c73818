"""Preflight on one host: its facts in one probe, and the verdict on them."""

from __future__ import annotations

from dataclasses import dataclass

from opsbook.core.deployment import Deployment
from opsbook.core.results import State
from opsbook.remote.protocol import RemoteHost
from opsbook.stages.base import Note, Report
from opsbook.steps import host_facts, plots


@dataclass(frozen=True)
class Options:
    """Preflight's options: none of its own (it reads the host and changes nothing)."""


@dataclass(kw_only=True)
class PreflightReport(Report):
    """Preflight's report, with the host's facts (a cluster's preflight compares its nodes')."""

    facts: host_facts.HostFacts


def run(host: RemoteHost, deployment: Deployment, options: Options) -> PreflightReport:
    """Gather the host's facts (GPUs, processes, driver, interconnect, python, vLLM, disk,
    ports, servers) and judge them; changes nothing."""
    found = host_facts.gather_facts(host, deployment)
    verdict = host_facts.check_facts(found)
    shows = [
        Note(f"{len(found.gpus)} GPU(s); interconnect: {found.topology.interconnect}"),
        host_facts.summary_table(found),
        host_facts.gpu_table(found),
        plots.gpu_memory(found.gpus, found.processes),
        host_facts.process_table(found),
        host_facts.server_table(found),
    ]
    return PreflightReport(State.OK if verdict.ok else State.FAILED, verdict, shows, facts=found)
