"""The stages of the runbook, each a unit over the hosts of a deployment.

One module per stage wraps its library functions in a per-host function that takes the module's
``Options`` (the stage's options, spelled there once: :mod:`opsbook.stages.base`);
:data:`STAGES` is the registry, in the order ``opsbook run deploy`` goes through them (diagnose
comes last, on every host). :func:`run_stage` fans a stage out over the hosts::

    from opsbook import load_deployment, stages

    fleet = stages.run_stage(stages.get("preflight"), load_deployment("fleet.yml"), forks=10)
    fleet.results   # one HostResult per host: ok / changed / would change / skipped /
                    # failed / unreachable
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from opsbook.core.exceptions import RunError
from opsbook.remote.protocol import RemoteHost
from opsbook.stages.base import (
    ClusterFunction,
    HostChoice,
    HostHeading,
    HostsFunction,
    Note,
    Parameter,
    Report,
    Stage,
    StageFunction,
    StageRun,
    Targets,
    Together,
    parameters_of,
    run_stage,
)

if TYPE_CHECKING:
    from opsbook.stages import cluster_download as cluster_download
    from opsbook.stages import cluster_launch as cluster_launch
    from opsbook.stages import cluster_preflight as cluster_preflight
    from opsbook.stages import config_patch as config_patch
    from opsbook.stages import diagnose as diagnose
    from opsbook.stages import download_check as download_check
    from opsbook.stages import launch_script as launch_script
    from opsbook.stages import launch_server as launch_server
    from opsbook.stages import preflight as preflight
    from opsbook.stages import qualify as qualify
    from opsbook.stages import upgrade as upgrade

# The per-host modules of the runbook's stages, in its order, then the cluster ones.
_RUNBOOK_MODULES = (
    "preflight",
    "download_check",
    "config_patch",
    "launch_script",
    "launch_server",
    "diagnose",
    "qualify",
)
_MODULES = (
    *_RUNBOOK_MODULES,
    "upgrade",
    "cluster_preflight",
    "cluster_download",
    "cluster_launch",
)


def import_runbook() -> None:
    """Import the runbook's per-host stage modules now (a deploy's shared kernel does, while
    the run prepares its first stage) rather than on each stage's first call."""
    for name in _RUNBOOK_MODULES:
        importlib.import_module(f"opsbook.stages.{name}")


def _per_host(module: str, function: str = "run") -> StageFunction:
    """The stage module's ``run`` (or ``function``), imported on the first call: a health
    check that runs only the diagnose stage does not pay for the config patch's vLLM tables."""

    def run(host: RemoteHost, deployment: Any, options: Any) -> Report:
        module_ = importlib.import_module(f"opsbook.stages.{module}")
        stage_run: StageFunction = getattr(module_, function)
        return stage_run(host, deployment, options)

    run.__qualname__ = run.__name__ = f"{module}.{function}"
    return run


def _on_cluster(module: str, function: str = "run") -> ClusterFunction:
    """The cluster module's function (a deployment served across its hosts), imported on the
    first call, like :func:`_per_host`."""

    def run(hosts: Sequence[RemoteHost], deployment: Any, options: Any) -> dict[str, Report]:
        call: ClusterFunction = getattr(
            importlib.import_module(f"opsbook.stages.{module}"), function
        )
        return call(hosts, deployment, options)

    run.__qualname__ = run.__name__ = f"{module}.{function}"
    return run


def _across(module: str, function: str = "side_by_side") -> HostsFunction:
    """The stage module's look across its hosts, imported on the first call."""

    def run(hosts: Sequence[RemoteHost], deployment: Any, reports: dict[str, Report]) -> Together:
        call: HostsFunction = getattr(importlib.import_module(f"opsbook.stages.{module}"), function)
        return call(hosts, deployment, reports)

    run.__qualname__ = run.__name__ = f"{module}.{function}"
    return run


def __getattr__(name: str) -> Any:
    # ``stages.preflight`` and the others, as before the registry became lazy.
    if name in _MODULES:
        return importlib.import_module(f"opsbook.stages.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _stage(
    name: str,
    notebook: str,
    changes_host: bool,
    module: str,
    cluster: ClusterFunction | None = None,
    function: str = "run",
    across: HostsFunction | None = None,
    across_fleet: bool = True,
) -> Stage:
    """A stage whose per-host function and options are those of ``opsbook.stages.<module>``."""
    run = _per_host(module, function)
    return Stage(name, notebook, changes_host, run, cluster, module, across, across_fleet)


# 00 and 05 show a deployment's hosts side by side (opsbook.steps.host_compare); a cluster's
# launch compares its nodes again, after they joined.
STAGES = (
    _stage(
        "preflight",
        "00_preflight",
        False,
        "preflight",
        _on_cluster("cluster_preflight"),
        across=_across("preflight"),
    ),
    _stage(
        "download", "01_download_check", False, "download_check", _on_cluster("cluster_download")
    ),
    _stage("config-patch", "02_config_patch", True, "config_patch"),
    _stage("launch-script", "03_launch_script", True, "launch_script"),
    _stage(
        "launch",
        "04_launch",
        True,
        "launch_server",
        _on_cluster("cluster_launch"),
        across=_across("diagnose", "nodes_side_by_side"),
        across_fleet=False,
    ),
    _stage(
        "diagnose",
        "05_diagnose",
        False,
        "diagnose",
        _on_cluster("cluster_launch", "diagnose"),
        across=_across("diagnose"),
    ),
    _stage("qualify", "06_qualify", False, "qualify"),
)
# Not a stage of a deploy (nor of its record's columns): a new engine beside the old one,
# predicted, switched, qualified and rolled back by itself (`opsbook run 07_upgrade`).
UPGRADE = _stage("upgrade", "07_upgrade", True, "upgrade")
# Not a stage of the runbook: 04_launch's "Stop" button, run over the hosts like one (with the
# launch's options: the button uses its stop_grace).
STOP = _stage("stop", "04_launch", True, "launch_server", function="stop")
# The stages a deploy runs in order; diagnose follows on every host. Qualify is the last of
# a deploy's stages when its `qualify` parameter names a profile (QUALIFY).
DEPLOY = tuple(s for s in STAGES if s.name not in ("diagnose", "qualify", "upgrade"))
DIAGNOSE = next(s for s in STAGES if s.name == "diagnose")
QUALIFY = next(s for s in STAGES if s.name == "qualify")


def get(name: str) -> Stage:
    """A stage by its name (``preflight``) or its notebook's (``00_preflight``).

    Raises:
        RunError: no such stage.
    """
    for stage in (*STAGES, UPGRADE):
        if name in (stage.name, stage.notebook):
            return stage
    known = ", ".join(s.name for s in (*STAGES, UPGRADE))
    raise RunError(f"no stage named {name!r}", remedy=f"the stages are: {known}")


def for_notebook(notebook: str) -> Stage | None:
    """The stage a notebook (by its stem) runs, if it is one of the runbook's."""
    return next((s for s in (*STAGES, UPGRADE) if s.notebook == notebook), None)


__all__ = [
    "DEPLOY",
    "DIAGNOSE",
    "QUALIFY",
    "STAGES",
    "STOP",
    "UPGRADE",
    "HostChoice",
    "HostHeading",
    "Note",
    "Parameter",
    "Report",
    "Stage",
    "StageRun",
    "Targets",
    "Together",
    "for_notebook",
    "get",
    "import_runbook",
    "parameters_of",
    "run_stage",
]
