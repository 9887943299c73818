"""Deployment files: what a deployment needs, read from YAML and checked once.

A deployment file names the host(s), how to reach them, the model, the interpreter, the
server's arguments and environment, and where the script, log and state live on the host.
Secret values are never stored in it: ``secrets`` names environment variables whose values
are taken from the local environment when needed and redacted everywhere they could appear.
A serve argument whose name says it holds a secret (``api-key``, ``hf-token``, ``*-password``...)
is a secret too, even when written in the file by mistake: it is redacted like the others and
kept out of the launch script (see ``opsbook.script``).
"""

from __future__ import annotations

import copy
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from opsbook.exceptions import DeploymentError

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
DEFAULT_SECRETS = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "VLLM_API_KEY", "OPENAI_API_KEY")
# Whole dash-separated words of a flag name: "max-num-batched-tokens" and "tokenizer" are not
# secrets, "hf-token" and "api-key" are.
SECRET_FLAG = re.compile(r"(?:^|-)(?:api-key|token|password|passwd|secret)(?:-|$)")


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
    """One model served across the deployment's hosts by one vLLM on a Ray cluster.

    Args:
        head: the host (a name or address from ``hosts``) that runs the Ray head and vLLM.
        tensor_parallel_size: GPUs per pipeline stage.
        pipeline_parallel_size: pipeline stages (usually one per node).
        ray_port: the Ray head's GCS port.
        interface: the network interface the nodes talk over (``NCCL_SOCKET_IFNAME`` and
            ``GLOO_SOCKET_IFNAME``), or None to leave the choice to NCCL and Gloo.
    """

    head: str
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    ray_port: int = 6379
    interface: str | None = None

    @property
    def world_size(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size


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

    def secret_values(self) -> list[str]:
        """Values to redact: the secret variables present in the local environment and the
        values of secret serve arguments."""
        from_env = [os.environ[n] for n in self.secrets if os.environ.get(n)]
        return from_env + [v for values in self.secret_args().values() for v in values]

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


def load_deployment(
    path: str | os.PathLike[str], overrides: dict[str, Any] | None = None
) -> Deployment:
    """Read and check a deployment file.

    Args:
        path: the YAML file.
        overrides: dotted keys to replace, e.g. ``{"server.port": 8001}``.

    Raises:
        DeploymentError: the file is missing, not YAML, or lacks a required value.
    """
    file = Path(path).expanduser()
    try:
        text = file.read_text()
    except FileNotFoundError:
        raise DeploymentError(
            f"deployment file {file} does not exist",
            remedy="give the path of a deployment YAML file (see deployments/ for examples)",
        ) from None
    except OSError as e:
        raise DeploymentError(f"cannot read deployment file {file}: {e.strerror}") from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise DeploymentError(
            f"deployment file {file} is not valid YAML: {e}",
            remedy="fix the YAML syntax at the line named above",
        ) from None
    if not isinstance(doc, dict):
        raise DeploymentError(f"deployment file {file} must hold a mapping at the top level")
    for key, value in (overrides or {}).items():
        set_dotted(doc, key, value)
    return parse_deployment(doc, source=str(file))


def parse_deployment(doc: dict[str, Any], source: str = "<dict>") -> Deployment:
    """Build a :class:`Deployment` from an already-loaded document."""
    doc = copy.deepcopy(doc)
    hosts_doc = doc.get("hosts")
    if not isinstance(hosts_doc, list) or not hosts_doc:
        raise DeploymentError(
            f"{source}: 'hosts' must be a non-empty list",
            remedy="add e.g. hosts: [{address: gpu-01, user: ubuntu, key: ~/.ssh/id_ed25519}]",
        )
    hosts = [_parse_host(h, source, i) for i, h in enumerate(hosts_doc)]
    host_vars = [_host_vars(h, source, i) for i, h in enumerate(hosts_doc)]
    model = doc.get("model") or {}
    model_path = model.get("path") if isinstance(model, dict) else None
    if not model_path:
        raise DeploymentError(
            f"{source}: 'model.path' is required",
            remedy="set model.path to the checkpoint directory on the host",
        )
    server = doc.get("server") or {}
    paths = doc.get("paths") or {}
    env = {str(k): str(v) for k, v in (server.get("env") or {}).items()}
    for name in env:
        _check_env_name(name, source)
    secrets = tuple(doc.get("secrets") or ()) or DEFAULT_SECRETS
    for name in secrets:
        _check_env_name(name, source)
    return Deployment(
        name=str(doc.get("name") or Path(source).stem),
        hosts=hosts,
        model_path=str(model_path),
        python=str(doc.get("python") or "python3"),
        server_port=_int(server.get("port", 8000), "server.port", source),
        serve_args=dict(server.get("args") or {}),
        env=env,
        secrets=tuple(dict.fromkeys((*secrets, *DEFAULT_SECRETS))),
        script_path=str(paths.get("script") or "opsbook/launch.sh"),
        log_path=str(paths.get("log") or "opsbook/vllm.log"),
        state_dir=str(paths.get("state") or "opsbook/state"),
        source=source,
        cluster=_parse_cluster(doc.get("cluster"), hosts, source),
        host_views=_host_views(doc, hosts, host_vars, source),
    )


def _host_vars(entry: Any, source: str, index: int) -> dict[str, Any]:
    """A host entry's ``vars``: values of the top level that differ on this host."""
    found = entry.get("vars") if isinstance(entry, dict) else None
    if found is None:
        return {}
    if not isinstance(found, dict) or "hosts" in found:
        raise DeploymentError(
            f"{source}: hosts[{index}].vars must be a mapping of top-level keys other than hosts",
            remedy="e.g. vars: {model: {path: /data/models/x}, server: {port: 8001}}",
        )
    return found


def _host_views(
    doc: dict[str, Any], hosts: list[HostSpec], host_vars: list[dict[str, Any]], source: str
) -> dict[str, Deployment]:
    if not any(host_vars):
        return {}
    views = {}
    # Each view holds one host; the cluster, which names the others, is the whole file's.
    cluster = _parse_cluster(doc.get("cluster"), hosts, source)
    for index, (spec, overrides) in enumerate(zip(hosts, host_vars, strict=True)):
        merged = copy.deepcopy(doc)
        entry = doc["hosts"][index]
        if isinstance(entry, dict):
            entry = {k: v for k, v in entry.items() if k != "vars"}
        merged["hosts"] = [entry]
        merged.pop("cluster", None)
        for key, value in _dotted(overrides):
            set_dotted(merged, key, value)
        view = parse_deployment(merged, source)
        view.cluster = cluster
        views[spec.name] = view
    return views


def _dotted(tree: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """``{"a": {"b": 1}}`` -> ``[("a.b", 1)]``: a host's vars replace leaves, not whole maps.

    Keys holding dots (``server.args`` flag names never do) would be split: vars name
    top-level keys and their children only."""
    pairs: list[tuple[str, Any]] = []
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            pairs += _dotted(value, name + ".")
        else:
            pairs.append((name, value))
    return pairs


def set_dotted(doc: dict[str, Any], dotted: str, value: Any) -> None:
    """Set ``doc["a"]["b"] = value`` for ``dotted == "a.b"``, creating mappings on the way."""
    *parents, last = dotted.split(".")
    node = doc
    for part in parents:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise DeploymentError(f"cannot override {dotted!r}: {part!r} is not a mapping")
        node = child
    node[last] = value


def _parse_host(entry: Any, source: str, index: int) -> HostSpec:
    if isinstance(entry, str):
        entry = {"address": entry}
    if not isinstance(entry, dict) or not entry.get("address"):
        raise DeploymentError(f"{source}: hosts[{index}] needs an 'address'")
    known = {f for f in HostSpec.__dataclass_fields__}
    unknown = sorted(set(entry) - known - {"vars"})
    if unknown:
        raise DeploymentError(
            f"{source}: hosts[{index}] has unknown keys {unknown}",
            remedy=f"use only {sorted(known)}",
        )
    values = {k: v for k, v in entry.items() if k != "vars"}
    values["port"] = _int(values.get("port", 22), f"hosts[{index}].port", source)
    for key in ("key", "known_hosts"):
        if values.get(key):
            values[key] = str(_resolve(values[key], source))
    return HostSpec(**values)


CLUSTER_KEYS = ("head", "tensor_parallel_size", "pipeline_parallel_size", "ray_port", "interface")


def _parse_cluster(entry: Any, hosts: list[HostSpec], source: str) -> ClusterSpec | None:
    """The ``cluster`` section: None when absent (a single-node deployment)."""
    if entry is None:
        return None
    example = "cluster: {head: gpu-01, tensor_parallel_size: 8, pipeline_parallel_size: 2}"
    if not isinstance(entry, dict):
        raise DeploymentError(f"{source}: 'cluster' must be a mapping", remedy=f"e.g. {example}")
    unknown = sorted(set(entry) - set(CLUSTER_KEYS))
    if unknown:
        raise DeploymentError(
            f"{source}: cluster has unknown keys {unknown}", remedy=f"use only {list(CLUSTER_KEYS)}"
        )
    head = str(entry.get("head") or hosts[0].address)
    if not any(head in (h.name, h.address) for h in hosts):
        raise DeploymentError(
            f"{source}: cluster.head {head!r} is not one of the hosts",
            remedy=f"name one of: {', '.join(h.name for h in hosts)}",
        )
    sizes = {}
    for key in ("tensor_parallel_size", "pipeline_parallel_size"):
        sizes[key] = _int(entry.get(key, 1), f"cluster.{key}", source)
        if sizes[key] < 1:
            raise DeploymentError(f"{source}: cluster.{key} must be at least 1, not {sizes[key]}")
    ray_port = _int(entry.get("ray_port", 6379), "cluster.ray_port", source)
    if not 1 <= ray_port <= 65535:
        raise DeploymentError(f"{source}: cluster.ray_port {ray_port} is not a TCP port")
    interface = entry.get("interface")
    return ClusterSpec(
        head=head,
        ray_port=ray_port,
        interface=None if interface is None else str(interface),
        **sizes,
    )


def _resolve(path: str, source: str) -> Path:
    """Expand ~ and make a relative path relative to the deployment file's folder."""
    p = Path(os.path.expanduser(str(path)))
    if not p.is_absolute() and source and not source.startswith("<"):
        p = Path(source).parent / p
    return p


def _int(value: Any, name: str, source: str) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        raise DeploymentError(f"{source}: {name} must be an integer, not {value!r}") from None


def _check_env_name(name: str, source: str) -> None:
    if not ENV_NAME.match(name):
        raise DeploymentError(
            f"{source}: {name!r} is not a valid environment variable name",
            remedy="use letters, digits and underscores, not starting with a digit",
        )
