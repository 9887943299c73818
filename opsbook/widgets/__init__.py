"""Forms and confirm buttons for stepping through the runbook in JupyterLab.

Every step that changes the host goes through :func:`confirm`. With someone at the notebook it
shows a button and runs the step only when clicked; headless (``opsbook run``, nbval) it runs
the step at once when ``apply`` is True and never otherwise, so nothing waits for a click.

The notebooks use the names below as ``widgets.X``; the parts: ``form`` (the deployment form),
``session_header`` (the header of a run and its "File this run" button), ``gates`` (the
buttons), ``live`` (outputs drawn again after a click), ``first_contact`` (finding the
deployment a new operator named), ``page_state`` (what the kernel holds from cell to cell).
"""

from __future__ import annotations

from typing import Any

from opsbook.widgets import page_state
from opsbook.widgets.form import DeploymentForm, parse_overrides
from opsbook.widgets.gates import Click, FleetGate, Gate, confirm, confirm_on_hosts
from opsbook.widgets.live import live, live_result, refresh

__all__ = [
    "Click",
    "DeploymentForm",
    "FleetGate",
    "Gate",
    "confirm",
    "confirm_on_hosts",
    "live",
    "live_result",
    "parse_overrides",
    "refresh",
]

# Read from page_state when asked for, never bound here: a copy bound at import would miss the
# session a form starts later, and a test's stand-in for them.
_KERNEL_STATE = ("BUSY", "GATES", "SESSION", "has_frontend")


def __getattr__(name: str) -> Any:
    if name in _KERNEL_STATE:
        return getattr(page_state, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
