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

from opsbook.exceptions import RunError
from opsbook.stages import config_patch, diagnose, download, launch, launch_script, preflight
from opsbook.stages.base import HostHeading, Note, Report, Stage, StageRun, run_stage

STAGES = (
    Stage("preflight", "00_preflight", False, preflight.run),
    Stage("download", "01_download_check", False, download.run),
    Stage("config-patch", "02_config_patch", True, config_patch.run),
    Stage("launch-script", "03_launch_script", True, launch_script.run),
    Stage("launch", "04_launch", True, launch.run),
    Stage("diagnose", "05_diagnose", False, diagnose.run),
)
# Not a stage of the runbook: 04_launch's "Stop" button, run over the hosts like one.
STOP = Stage("stop", "04_launch", True, launch.stop)
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
    "run_stage",
]
