"""opsbook: runbooks for bringing up large model servers on remote GPU hosts."""

from opsbook.deployment import Deployment, HostSpec, load_deployment
from opsbook.exceptions import OpsbookError
from opsbook.hosts import Host
from opsbook.results import Finding, HostResult, Result, State, Table

__version__ = "0.1.0"

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
