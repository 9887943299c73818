"""opsbook: runbooks for bringing up large model servers on remote GPU hosts.

The names below are imported on first use: ``import opsbook.cli`` must not pay for Fabric,
paramiko and papermill before a command needs them (``opsbook --help`` starts in a blink).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opsbook.core.deployment import Deployment, HostSpec, load_deployment
    from opsbook.core.exceptions import OpsbookError
    from opsbook.core.results import Finding, HostResult, Result, State, Table
    from opsbook.remote.hosts import Host

__version__ = "0.1.0"

_EXPORTS = {
    "Deployment": "opsbook.core.deployment",
    "HostSpec": "opsbook.core.deployment",
    "load_deployment": "opsbook.core.deployment",
    "OpsbookError": "opsbook.core.exceptions",
    "Host": "opsbook.remote.hosts",
    "Finding": "opsbook.core.results",
    "HostResult": "opsbook.core.results",
    "Result": "opsbook.core.results",
    "State": "opsbook.core.results",
    "Table": "opsbook.core.results",
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
