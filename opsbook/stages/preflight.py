"""Preflight on one host: its facts in one probe, and the verdict on them."""

from __future__ import annotations

from opsbook import facts, plots
from opsbook.deployment import Deployment
from opsbook.probes import Prober
from opsbook.results import State
from opsbook.stages.base import Note, Report


def run(host: Prober, deployment: Deployment) -> Report:
    """Gather the host's facts (GPUs, processes, driver, interconnect, python, vLLM, disk,
    ports, servers) and judge them; changes nothing."""
    found = facts.gather_facts(host, deployment)
    verdict = facts.check_facts(found)
    shows = [
        Note(f"{len(found.gpus)} GPU(s); interconnect: {found.topology.interconnect}"),
        facts.summary_table(found),
        facts.gpu_table(found),
        plots.gpu_memory(found.gpus, found.processes),
        facts.process_table(found),
        facts.server_table(found),
    ]
    return Report(State.OK if verdict.ok else State.FAILED, verdict, shows, detail=found)
