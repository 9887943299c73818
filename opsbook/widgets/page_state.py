"""What this kernel's page holds from cell to cell: the session it records, the buttons and
live outputs shown on it, the hosts a step is busy on; and whether someone is at it.

Kept in one module so that the form, the buttons and the live outputs read the same values as
a notebook's ``widgets.SESSION`` does, and a test stands in for :func:`has_frontend` once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from opsbook.runner import session as session_records
from opsbook.runner.progress import has_frontend

if TYPE_CHECKING:
    from opsbook.widgets.gates import Gate
    from opsbook.widgets.live import Live

__all__ = ["BUSY", "GATES", "LIVE", "SESSION", "has_frontend"]

# The session this kernel records, started by the first deployment form shown in JupyterLab.
SESSION: session_records.Session | None = None
LIVE: dict[str, Live] = {}
# The buttons shown in this kernel, so that each click re-checks them all.
GATES: list[Gate] = []
# The hosts a button's step is acting on right now, and what it is doing there.
BUSY: dict[str, str] = {}
