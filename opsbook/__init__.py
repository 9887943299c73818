"""opsbook: runbooks for bringing up large model servers on remote GPU hosts.

The names below are imported on first use: ``import opsbook.cli`` must not pay for Fabric,
paramiko and papermill before a command needs them (``opsbook --help`` starts in a blink).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opsbook.deployment import Deployment, HostSpec, load_deployment
    from opsbook.exceptions import OpsbookError
    from opsbook.hosts import Host
    from opsbook.results import Finding, HostResult, Result, State, Table

__version__ = "0.1.0"

_EXPORTS = {
    "Deployment": "opsbook.deployment",
    "HostSpec": "opsbook.deployment",
    "load_deployment": "opsbook.deployment",
    "OpsbookError": "opsbook.exceptions",
    "Host": "opsbook.hosts",
    "Finding": "opsbook.results",
    "HostResult": "opsbook.results",
    "Result": "opsbook.results",
    "State": "opsbook.results",
    "Table": "opsbook.results",
}

__all__ = [
    "Deployment",
    "Finding",
    "Host",
    "HostResult",
    "HostSpec",
    "OpsbookError",
    "Result",
    "State",
    "Table",
    "__version__",
    "load_deployment",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'opsbook' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
