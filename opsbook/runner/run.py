"""Running the runbook headless with papermill: the runner's public face.

The work is done by the modules of :mod:`opsbook.runner` this one gathers: finding notebooks and
typing ``-p`` values (:mod:`~opsbook.runner.parameters`), one notebook's run into its run folder
(:mod:`~opsbook.runner.execution`), the kernel a deploy's stages share
(:mod:`~opsbook.runner.shared_kernel`) and the deploy itself (:mod:`~opsbook.runner.deploy`).
``opsbook.cli``, the benchmarks and scripts call the runner through the names here.
"""

from __future__ import annotations

from typing import Any

from opsbook.core.results import (
    EXIT_OK,
    EXIT_PROBLEM,
    EXIT_TOOL_FAILED,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
)
from opsbook.runner.deploy import plan_batches, run_deploy, too_many_failed
from opsbook.runner.execution import (
    DEFAULT_FORKS,
    STATUS,
    CheckRecord,
    RunRecord,
    check_servers,
    execute_stage,
    exit_code_for,
    new_run_folder,
    redact_notebook,
    run_label,
    run_notebook,
)
from opsbook.runner.parameters import (
    NOTEBOOKS_DIR,
    check_parameters,
    find_notebook,
    plain_value,
    typed_parameters,
)
from opsbook.runner.shared_kernel import SharedKernel

__all__ = [
    "DEFAULT_FORKS",
    "EXIT_OK",
    "EXIT_PROBLEM",
    "EXIT_TOOL_FAILED",
    "EXIT_UNREACHABLE",
    "EXIT_USAGE",
    "NOTEBOOKS_DIR",
    "STATUS",
    "CheckRecord",
    "RunRecord",
    "SharedKernel",
    "check_parameters",
    "check_servers",
    "execute_stage",
    "exit_code_for",
    "find_notebook",
    "new_run_folder",
    "plain_value",
    "plan_batches",
    "redact_notebook",
    "run_deploy",
    "run_label",
    "run_notebook",
    "too_many_failed",
    "typed_parameters",
]


def __getattr__(name: str) -> Any:
    # The notebooks of the deploy stages, read from the registry on first use.
    from opsbook import stages

    if name == "DEPLOY_STAGES":
        return tuple(s.notebook for s in stages.DEPLOY)
    if name == "DIAGNOSE_STAGE":
        return str(stages.DIAGNOSE.notebook)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
