"""How a notebook tells its runner what its checks found.

A notebook ends with ``outcome.record(result)``. Under ``opsbook run`` the environment variable
``OPSBOOK_OUTCOME`` names a file; the verdicts are appended there, and the runner turns a
problem into its exit code. Stepping through in JupyterLab, nothing is written.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from opsbook.results import Result

OUTCOME_ENV = "OPSBOOK_OUTCOME"


def record(result: Result, stage: str = "") -> Result:
    """Note ``result`` as a verdict of this notebook run; returns it for display."""
    path = os.environ.get(OUTCOME_ENV)
    if path:
        entry = {"stage": stage, "ok": result.ok, "message": result.message}
        with Path(path).open("a") as f:
            f.write(json.dumps(entry) + "\n")
    return result


def read(path: Path) -> list[dict[str, Any]]:
    """The verdicts a run recorded, in order (none when the file is missing)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
