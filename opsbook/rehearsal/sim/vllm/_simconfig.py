"""Settings of the simulated vLLM: which version it plays, how fast it starts, which fault.

The rehearsal host writes them to ``<venv>/opsbook-vllm-sim.json``; environment variables
override them for one launch. Standard library only: this package runs on the rehearsal host.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

CONFIG_NAME = "opsbook-vllm-sim.json"
DEFAULT_VERSION = "0.15.1"
DEFAULT_STARTUP_SECONDS = 3.0
# plugin-error: a general plugin fails to load; vLLM logs the traceback at ERROR and starts.
# engine-hang: once ready, the engine core stops answering the API server (no signal): requests
# stay running without a token while /health answers 200 (vllm issue 51663).
FAULTS = (
    "oom",
    "hang",
    "die-after-1s",
    "ignore-sigterm",
    "slow-start",
    "nccl-timeout",
    "plugin-error",
    "engine-hang",
)
ENV_VERSION = "OPSBOOK_SIM_VLLM_VERSION"
ENV_STARTUP = "OPSBOOK_SIM_STARTUP_SECONDS"
ENV_FAULT = "OPSBOOK_SIM_FAULT"
# Serving (opsbook.rehearsal.sim.vllm._simserving): seconds per generated token, a factor on
# them (a slower release), and a fault of the answers (SERVING_FAULTS).
ENV_TOKEN_SECONDS = "OPSBOOK_SIM_TOKEN_SECONDS"
ENV_SLOWDOWN = "OPSBOOK_SIM_SLOWDOWN"
ENV_SERVING_FAULT = "OPSBOOK_SIM_SERVING_FAULT"
# bang: every token "!" (vllm issue 42426); batch-dependent: greedy output changes with the
# requests in flight; crash-after:N: the engine dies at request N+1; crash-under:C: it dies
# when C requests are in flight at once (vllm issues 42363, 32090); bad-tool-args: tool calls
# without their required arguments (MoonshotAI/K2-Vendor-Verifier's schema errors).
SERVING_FAULTS = ("bang", "batch-dependent", "crash-after", "crash-under", "bad-tool-args")


def config_path(prefix: str | None = None) -> Path:
    """The settings file of the env this interpreter belongs to."""
    return Path(prefix or sys.prefix) / CONFIG_NAME


def load(prefix: str | None = None) -> dict[str, Any]:
    """Read the settings, apply environment overrides and fill in defaults.

    Returns:
        ``{"version": str, "startup_seconds": float, "fault": str | None, "token_seconds":
        float, "slowdown": float, "serving_fault": str | None}``; an unknown fault name is
        kept, so that the server can refuse it loudly.
    """
    try:
        stored = json.loads(config_path(prefix).read_text())
    except (OSError, ValueError):
        stored = {}
    if not isinstance(stored, dict):
        stored = {}
    version = os.environ.get(ENV_VERSION) or stored.get("version") or DEFAULT_VERSION
    startup = os.environ.get(ENV_STARTUP) or stored.get("startup_seconds")
    try:
        seconds = float(startup) if startup is not None else DEFAULT_STARTUP_SECONDS
    except ValueError:
        seconds = DEFAULT_STARTUP_SECONDS
    fault = os.environ.get(ENV_FAULT, stored.get("fault")) or None
    serving_fault = os.environ.get(ENV_SERVING_FAULT, stored.get("serving_fault")) or None
    return {
        "version": str(version),
        "startup_seconds": max(0.0, seconds),
        "fault": fault,
        "token_seconds": _number(ENV_TOKEN_SECONDS, stored.get("token_seconds"), 0.0),
        "slowdown": _number(ENV_SLOWDOWN, stored.get("slowdown"), 1.0),
        "serving_fault": serving_fault,
    }


def _number(env: str, stored: Any, default: float) -> float:
    """A non-negative number from the environment, else the settings file, else ``default``."""
    try:
        value = float(os.environ.get(env) or (default if stored is None else stored))
    except (TypeError, ValueError):
        return default
    return max(0.0, value)


def version_tuple(version: str) -> tuple[int, ...]:
    """``"0.15.1rc1.dev3+g1"`` -> ``(0, 15, 1)``: the numeric release part only."""
    parts = []
    for piece in version.lstrip("v").split("+")[0].split("."):
        digits = ""
        for char in piece:
            if not char.isdigit():
                break
            digits += char
        if not digits:
            break
        parts.append(int(digits))
        if len(digits) != len(piece):
            break
    return tuple(parts) or (0,)


def at_least(version: str, minimum: str) -> bool:
    """Whether ``version`` is ``minimum`` or newer (release numbers only)."""
    return version_tuple(version) >= version_tuple(minimum)
