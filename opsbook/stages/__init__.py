"""The stages of the runbook, each a unit over the hosts of a deployment.

One module per stage wraps its library functions in a per-host function; :data:`STAGES` is the
registry, in the order ``opsbook run deploy`` goes through them (diagnose comes last, on every
host). :func:`run_stage` fans a stage out over the hosts::

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
    HostHeading,
    Note,
    Report,
    Stage,
    StageFunction,
    StageRun,
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

# The per-host modules of the runbook's stages, in its order, then the cluster ones.
_RUNBOOK_MODULES = (
    "preflight",
    "download_check",
    "config_patch",
    "launch_script",
    "launch_server",
    "diagnose",
)
_MODULES = (*_RUNBOOK_MODULES, "cluster_preflight", "cluster_download", "cluster_launch")


def import_runbook() -> None:
    """Import the runbook's per-host stage modules now (a deploy's shared kernel does, while
    the run prepares its first stage) rather than on each stage's first call."""
    for name in _RUNBOOK_MODULES:
        importlib.import_module(f"opsbook.stages.{name}")


def _per_host(module: str, function: str = "run") -> StageFunction:
    """The stage module's ``run`` (or ``function``), imported on the first call: a health
    check that runs only the diagnose stage does not pay for the config patch's vLLM tables."""

    def run(host: RemoteHost, deployment: Any, **options: Any) -> Report:
        module_ = importlib.import_module(f"opsbook.stages.{module}")
        stage_run: StageFunction = getattr(module_, function)
        return stage_run(host, deployment, **options)

    run.__qualname__ = run.__name__ = f"{module}.{function}"
    return run


def _on_cluster(module: str, function: str = "run") -> ClusterFunction:
    """The cluster module's function (a deployment served across its hosts), imported on the
    first call, like :func:`_per_host`."""

    def run(hosts: Sequence[RemoteHost], deployment: Any, **options: Any) -> dict[str, Report]:
        call: ClusterFunction = getattr(
            importlib.import_module(f"opsbook.stages.{module}"), function
        )
        return call(hosts, deployment, **options)

    run.__qualname__ = run.__name__ = f"{module}.{function}"
    return run


def __getattr__(name: str) -> Any:
    # ``stages.preflight`` and the others, as before the registry became lazy.
    if name in _MODULES:
        return importlib.import_module(f"opsbook.stages.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


STAGES = (
    Stage(
        "preflight", "00_preflight", False, _per_host("preflight"), _on_cluster("cluster_preflight")
    ),
    Stage(
        "download",
        "01_download_check",
        False,
        _per_host("download_check"),
        _on_cluster("cluster_download"),
    ),
    Stage("config-patch", "02_config_patch", True, _per_host("config_patch")),
    Stage("launch-script", "03_launch_script", True, _per_host("launch_script")),
    Stage("launch", "04_launch", True, _per_host("launch_server"), _on_cluster("cluster_launch")),
    Stage(
        "diagnose",
        "05_diagnose",
        False,
        _per_host("diagnose"),
        _on_cluster("cluster_launch", "diagnose"),
    ),
)
# Not a stage of the runbook: 04_launch's "Stop" button, run over the hosts like one.
STOP = Stage("stop", "04_launch", True, _per_host("launch_server", "stop"))
# The stages a deploy runs in order; diagnose follows on every host.
DEPLOY = tuple(s for s in STAGES if s.name != "diagnose")
DIAGNOSE = STAGES[-1]


def get(name: str) -> Stage:
    """A stage by its name (``preflight``) or its notebook's (``00_preflight``).

    Raises:
        RunError: no such stage.
    """
    for stage in STAGES:
        if name in (stage.name, stage.notebook):
            return stage
    known = ", ".join(s.name for s in STAGES)
    raise RunError(f"no stage named {name!r}", remedy=f"the stages are: {known}")


def for_notebook(notebook: str) -> Stage | None:
    """The stage a notebook (by its stem) runs, if it is one of the runbook's."""
    return next((s for s in STAGES if s.notebook == notebook), None)


__all__ = [
    "DEPLOY",
    "DIAGNOSE",
    "STAGES",
    "STOP",
    "HostHeading",
    "Note",
    "Report",
    "Stage",
    "StageRun",
    "for_notebook",
    "get",
    "import_runbook",
    "run_stage",
]
