"""What the rest of opsbook reads of a deployment: frozen dataclasses for a host, a cluster and
the whole deployment, and which of its values are secrets. :mod:`opsbook.core.deployment`
builds them from a checked file.
"""

from __future__ import annotations

import os
import re
import typing
from dataclasses import dataclass, field
from typing import Any

DEFAULT_SECRETS = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "VLLM_API_KEY", "OPENAI_API_KEY")
# Whole dash-separated words of a flag name: "max-num-batched-tokens" and "tokenizer" are not
# secrets, "hf-token" and "api-key" are.
SECRET_FLAG = re.compile(r"(?:^|-)(?:api-key|token|password|passwd|secret)(?:-|$)")
# Whole underscore-separated words of a variable name (VLLM_API_KEY, HF_TOKEN, DB_PASSWORD).
SECRET_ENV = re.compile(r"(?:^|_)(?:API_KEY|APIKEY|TOKEN|PASSWORD|PASSWD|SECRET)(?:_|$)")
DEFAULT_RAY_PORT = 6379
# A shell variable name: what server.env keys and the launch script accept.
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class HostSpec:
    """How to reach one host over SSH."""

    address: str
    port: int = 22
    user: str | None = None
    key: str | None = None
    known_hosts: str = "~/.ssh/known_hosts"
    trust_on_first_use: bool = False
    connect_timeout: float = 10.0
    command_timeout: float = 120.0
    keepalive: int = 15

    @property
    def name(self) -> str:
        user = f"{self.user}@" if self.user else ""
        port = f":{self.port}" if self.port != 22 else ""
        return f"{user}{self.address}{port}"


@dataclass(frozen=True)
class ClusterSpec:
    """A multi-host server (Ray): which host is the head, and how the model is split."""

    head: str
    tensor_parallel_size: int
    pipeline_parallel_size: int
    ray_port: int = DEFAULT_RAY_PORT
    interface: str | None = None

    @property
    def world_size(self) -> int:
        """GPUs the model needs: tensor x pipeline parallel."""
        return self.tensor_parallel_size * self.pipeline_parallel_size


@dataclass(frozen=True)
class RollingSpec:
    """Commands run on the operator's machine around each host of a deploy (argv lists whose
    ``{host}`` and ``{address}`` are replaced): before it (``pre_host``) and once it serves
    again (``post_host``); empty: none."""

    pre_host: tuple[str, ...] = ()
    post_host: tuple[str, ...] = ()
    hook_timeout: float = 60.0


@dataclass
class Deployment:
    """A parsed deployment file."""

    name: str
    hosts: list[HostSpec]
    model_path: str
    python: str = "python3"
    server_port: int = 8000
    serve_args: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    secrets: tuple[str, ...] = DEFAULT_SECRETS
    script_path: str = "opsbook/launch.sh"
    log_path: str = "opsbook/vllm.log"
    state_dir: str = "opsbook/state"
    source: str = ""
    cluster: ClusterSpec | None = None
    rolling: RollingSpec = RollingSpec()
    # The vLLM release `engine:` pins (07_upgrade writes it with the interpreter): None, not
    # pinned.
    engine_version: str | None = None
    # Per host name, the deployment as that host sees it (its `vars` applied), when any differ.
    host_views: dict[str, Deployment] = field(default_factory=dict, repr=False, compare=False)

    @property
    def host(self) -> HostSpec:
        """The first (often the only) host."""
        return self.hosts[0]

    def for_host(self, spec: HostSpec) -> Deployment:
        """The deployment as one of its hosts sees it: its own ``vars`` (model path, python,
        server port, paths...) over the common values, and only that host."""
        view = self.host_views.get(spec.name)
        if view is not None:
            return view
        return Deployment(**{**self.__dict__, "hosts": [spec], "host_views": {}})

    def secret_values(self, environ: typing.Mapping[str, str] | None = None) -> list[str]:
        """Values to redact: the secret variables present in the local environment (``environ``,
        default ``os.environ``), the values ``server.env`` gives a secret variable (one named in
        ``secrets`` or whose name says it is one, such as ``VLLM_API_KEY``), and the values of
        secret serve arguments, on every host's view."""
        source = os.environ if environ is None else environ
        found = [source[n] for n in self.secrets if source.get(n)]
        for view in [self, *self.host_views.values()]:
            found += [v for n, v in view.env.items() if v and view.is_secret_variable(n)]
            found += [v for values in view.secret_args().values() for v in values]
        return list(dict.fromkeys(found))

    def is_secret_variable(self, name: str) -> bool:
        """Whether an environment variable holds a secret: named in ``secrets``, or a name that
        says so (``VLLM_API_KEY``, ``HF_TOKEN``, ``DB_PASSWORD``)."""
        return name in self.secrets or bool(SECRET_ENV.search(name.upper()))

    def secret_args(self) -> dict[str, list[str]]:
        """Serve arguments that hold secrets, by flag name (as written, without ``--``): those
        whose name is a secret's (see :func:`is_secret_flag`) and have a value, not a bare flag.
        """
        found = {}
        for name, value in self.serve_args.items():
            flag = str(name).removeprefix("--")
            if not is_secret_flag(flag) or value is None or isinstance(value, bool):
                continue
            values = value if isinstance(value, (list, tuple)) else [value]
            found[flag] = [str(v) for v in values]
        return {flag: values for flag, values in found.items() if values}


def is_secret_flag(flag: str) -> bool:
    """Whether a serve argument's name (``api-key``, not ``--api-key``) says it holds a secret."""
    return bool(SECRET_FLAG.search(flag.split(".")[0].lower()))
