"""When the launch (re)starts a server: only when it is not ready, or when what it runs changed
since it started (as Ansible's handlers restart a service only when a task changed it).

What a server runs is four inputs: the launch script, its secrets file (the env the script
sources), the configs 02_config_patch patches, and the engine (the interpreter and the vLLM it
imports). The launch probe notes a digest of each in the launch record when it starts the
server, and a status compares them on the host (``inputs``, one round trip); the verdicts
cross, the digests stay on the host. A dry run and an apply decide with the same
:func:`decide`, so the dry run says what the apply will do; a deploy's dry run also tells it
the inputs its earlier stages would change (``pending``: 02 would patch the configs, 03 would
write the script), which its apply will find changed.
"""

from __future__ import annotations

import posixpath
import time
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from opsbook.core.deployment import Deployment
from opsbook.steps.server import LaunchPaths
from opsbook.steps.triage import ServerState

# The launch's ``restart`` option: restart only a server that is not ready or whose inputs
# changed, or restart it on every apply.
RESTART_WHEN = ("changed", "always")
# The inputs, in the order a message names them, with the words it uses.
INPUT_NAMES = {
    "script": "launch script",
    "env": "env file",
    "configs": "patched configs",
    "engine": "engine",
}
# What a dry run says of an input an earlier stage of the same deploy would change.
PENDING_WORDS = {
    "script": "03_launch_script would write the launch script",
    "env": "03_launch_script would write the env file",
    "configs": "02_config_patch would patch the configs",
    "engine": "an earlier stage would change the engine",
}


def run_inputs(deployment: Deployment, paths: LaunchPaths) -> dict[str, dict[str, Any]]:
    """What the server of ``deployment`` runs, as the launch probe digests it."""
    # Imported here: a health check that reads this module needs neither the script's flag
    # tables nor the compat rules behind the patch.
    from opsbook.steps.patch import PATCHABLE_FILES
    from opsbook.steps.script import secrets_path

    configs = [posixpath.join(deployment.model_path, name) for name in PATCHABLE_FILES]
    return {
        "script": {"files": [paths.script]},
        "env": {"files": [secrets_path(paths.script)]},
        "configs": {"files": configs},
        "engine": {"python": deployment.python},
    }


@dataclass(frozen=True)
class RestartDecision:
    """Whether the launch restarts the server, and why (or why it leaves it alone).

    Args:
        restart: whether an apply stops and starts the server.
        reason: why it does, or why nothing is done (the whole "ok" message then).
        state: the server's state as found.
        pending: the inputs an earlier stage of the run would change, that the restart is
            (also) for.
    """

    restart: bool
    reason: str
    state: str
    pending: tuple[str, ...] = ()

    @property
    def was_ready(self) -> bool:
        return self.state == "ready"

    def dry_run_message(self) -> str:
        """What a dry run says: what the apply would do."""
        if not self.restart:
            return self.reason
        if not self.was_ready:
            return f"would (re)start the server (now {self.state}); apply=True does it"
        message = f"would restart the server: {self.reason}; apply=True does it"
        if self.pending:
            message += f" (as {listed([PENDING_WORDS[name] for name in self.pending])} first)"
        return message

    def applied_message(self, outcome: str) -> str:
        """An apply's message after the restart: its outcome, then why a ready server was
        restarted (a server that was not ready needs no reason)."""
        return f"{outcome}; restarted: {self.reason}" if self.was_ready else outcome


def decide(
    state: ServerState, restart: str = "changed", pending: Collection[str] = ()
) -> RestartDecision:
    """Restart when ``restart`` is "always", when the server is not ready, or when an input
    changed or was not noted at its start; otherwise leave it alone (pure, for tests).

    ``pending`` names the inputs an earlier stage of the same run would change (a deploy's dry
    run): one that is the same as at the start now will have changed when the apply's launch
    looks, so it counts as changed, and the reason reads as the apply's will."""
    if state.state != "ready":
        return RestartDecision(True, f"the server is {state.state}: {state.message}", state.state)
    if restart == "always":
        return RestartDecision(True, "restart=always", state.state)
    since = _when(state.started_at)
    found = dict(state.inputs)
    # An input not noted at the start stays unknown, changed or not; one that already changed
    # may be written back as it was: only a "same" one is sure to change.
    pending_now = tuple(
        name for name in INPUT_NAMES if name in pending and found.get(name) == "same"
    )
    found |= dict.fromkeys(pending_now, "changed")
    changed = [label for name, label in INPUT_NAMES.items() if found.get(name) == "changed"]
    if changed:
        reason = f"{listed(changed)} changed since {since}"
        return RestartDecision(True, reason, state.state, pending_now)
    unnoted = [label for name, label in INPUT_NAMES.items() if found.get(name) != "same"]
    if unnoted:
        reason = (
            f"the {listed(unnoted)} it runs were not noted at its start ({since}; an earlier "
            "opsbook started it), so whether they changed is unknown"
        )
        return RestartDecision(True, reason, state.state)
    reason = f"already running and ready; script, env, configs and engine unchanged since {since}"
    return RestartDecision(False, reason, state.state)


def _when(started_at: float | None) -> str:
    if started_at is None:
        return "its start"
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(started_at))


def listed(labels: list[str]) -> str:
    """Labels as a message lists them: "a", "a and b", "a, b and c"."""
    return labels[0] if len(labels) == 1 else f"{', '.join(labels[:-1])} and {labels[-1]}"
