"""Deployment files: what a deployment needs, read from YAML and checked once.

A deployment file names the host(s), how to reach them, the model, the interpreter, the
server's arguments and environment, and where the script, log and state live on the host.
Secret values are never stored in it: ``secrets`` names environment variables whose values
are taken from the local environment when needed and redacted everywhere they could appear.
A serve argument whose name says it holds a secret (``api-key``, ``hf-token``, ``*-password``...)
is a secret too, even when written in the file by mistake: it is redacted like the others and
kept out of the launch script (see ``opsbook.steps.script``).

The file is checked against a strict schema (pydantic models, :class:`DeploymentDoc`) before
anything touches a host: unknown keys are refused with the nearest valid name, booleans must be
``true``/``false`` (not ``'false'``), ports and timeouts in range, lists and mappings where they
belong. The YAML itself is bounded: at most :data:`MAX_BYTES` bytes, :data:`MAX_DEPTH` levels of
nesting and :data:`MAX_NODES` values once aliases are expanded, so a "billion laughs" document
is refused at once instead of eating the memory. Every error names the file, the key path
(``hosts[1].port``) and what is expected. The schema is the parser; the frozen dataclasses
below (:class:`Deployment`, :class:`HostSpec`, :class:`ClusterSpec`) are what the rest of
opsbook reads.
"""

from __future__ import annotations

import copy
import difflib
import os
import re
import types
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Union

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_core import PydanticCustomError

from opsbook.core.exceptions import DeploymentError

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
FLAG_NAME = re.compile(r"^[a-z0-9][a-z0-9-]*(\.[a-z0-9_][a-z0-9_-]*)*$")
RESERVED_FLAGS = {"model": "model.path", "port": "server.port"}
DEFAULT_SECRETS = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "VLLM_API_KEY", "OPENAI_API_KEY")
# Whole dash-separated words of a flag name: "max-num-batched-tokens" and "tokenizer" are not
# secrets, "hf-token" and "api-key" are.
SECRET_FLAG = re.compile(r"(?:^|-)(?:api-key|token|password|passwd|secret)(?:-|$)")
# Whole underscore-separated words of a variable name (VLLM_API_KEY, HF_TOKEN, DB_PASSWORD).
SECRET_ENV = re.compile(r"(?:^|_)(?:API_KEY|APIKEY|TOKEN|PASSWORD|PASSWD|SECRET)(?:_|$)")

# Limits on the YAML: a deployment file is a few kB; these leave a wide margin.
MAX_BYTES = 1_000_000
MAX_DEPTH = 40
MAX_NODES = 100_000
DEFAULT_RAY_PORT = 6379


# -- the typed interface the rest of opsbook reads ---------------------------------------------


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


# -- the schema ------------------------------------------------------------------------------


INVALID = "opsbook_invalid"


def _invalid(problem: str, remedy: str) -> PydanticCustomError:
    """A schema error of our own: what is wrong and expected, and what to write instead."""
    return PydanticCustomError(INVALID, "{problem}", {"problem": problem, "remedy": remedy})


def _env_name(name: str) -> str:
    if not ENV_NAME.match(name):
        raise _invalid(
            f"{name!r} is not a valid environment variable name",
            "use letters, digits and underscores, not starting with a digit (e.g. MY_TOKEN)",
        )
    return name


def _remote_path(path: str) -> str:
    if not path.strip():
        raise _invalid("expected a path, got an empty string", "give a path, or leave the key out")
    if "\0" in path or "\n" in path or "\r" in path:
        raise _invalid(
            "a path may not hold a NUL byte or a line break", "write the path on one line"
        )
    return path


def _env_value(value: Any) -> str:
    # bool first: it is an int to Python, and `true` would become "True".
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise _invalid(
            f"expected a string or a number, got {_kind(value)}",
            "quote the value: NAME: '1' or NAME: 'true'",
        )
    return str(value)


def _flag_name(name: str) -> str:
    try:
        check_flag_name(name)
    except DeploymentError as e:
        raise _invalid(e.message, e.remedy or "") from None
    return name


def check_flag_name(name: str) -> str:
    """``name`` without a leading ``--``, checked.

    Raises:
        DeploymentError: it is not a valid flag name, or is ``model``/``port``.
    """
    flag = name[2:] if name.startswith("--") else name
    if not FLAG_NAME.match(flag):
        raise DeploymentError(
            f"serve argument {name!r} is not a valid flag name",
            remedy=(
                "write flags as in vLLM's --help without the dashes, in lower case with dashes "
                f"between words (e.g. {_suggest_flag(flag)!r})"
            ),
        )
    if flag in RESERVED_FLAGS:
        raise DeploymentError(
            f"serve argument {name!r} is set by the deployment itself",
            remedy=f"set {RESERVED_FLAGS[flag]} in the deployment file instead of server.args",
        )
    return flag


def _suggest_flag(flag: str) -> str:
    head, dot, rest = flag.lower().lstrip("-").partition(".")
    return head.replace("_", "-") + dot + rest


def _arg_value(value: Any) -> Any:
    """A serve argument's value: a scalar, a list, or a mapping (JSON for vLLM), nothing else."""
    _check_json_like(value, 0)
    return value


def _check_json_like(value: Any, depth: int) -> None:
    if depth > MAX_DEPTH:
        raise _invalid(f"nested more than {MAX_DEPTH} levels", "remove the nesting")
    if value is None or isinstance(value, (str, bool, int, float)):
        return
    if isinstance(value, list):
        for item in value:
            _check_json_like(item, depth + 1)
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise _invalid(
                    f"mapping keys must be strings, not {_kind(key)} {key!r}",
                    f"quote the key: '{key}': ...",
                )
            _check_json_like(item, depth + 1)
        return
    raise _invalid(
        f"expected a string, number, boolean, list or mapping, got {_kind(value)}",
        "write a plain YAML value (no tags)",
    )


def _host_entry(entry: Any) -> Any:
    # `hosts: [gpu-01]` is short for `hosts: [{address: gpu-01}]`.
    return {"address": entry} if isinstance(entry, str) else entry


# What ssh and paramiko take as a host: a DNS name, an IPv4 or IPv6 address (a zone after %),
# or an ~/.ssh/config alias of the same characters. A leading '-' would read as an option to
# an ssh command line (CVE-2017-1000117); a shell character has no place in either.
HOST_ADDRESS = re.compile(r"[A-Za-z0-9_.:%\[\]][A-Za-z0-9_.:%\[\]-]*")
# POSIX login names, with the '@' and '\\' of directory accounts and Samba's trailing '$'.
LOGIN_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.@\\-]*\$?")


def _matching(pattern: re.Pattern[str], what: str, remedy: str) -> Callable[[str], str]:
    """A validator refusing a text that ``pattern`` does not match whole: it is not ``what``."""

    def check(text: str) -> str:
        if not pattern.fullmatch(text):
            raise _invalid(f"{text!r} is not {what}", remedy)
        return text

    return check


_host_address = _matching(
    HOST_ADDRESS,
    "a host name or address",
    "write a DNS name, an IP address or an ~/.ssh/config alias (letters, digits, '.', '-', "
    "'_', ':'; not starting with '-')",
)
_login_name = _matching(
    LOGIN_NAME,
    "a login name",
    "write the user's name as the host knows it (letters, digits, '.', '_', '-', '@'; not "
    "starting with '-')",
)


EnvName = Annotated[str, AfterValidator(_env_name)]
HostAddress = Annotated[str, Field(min_length=1), AfterValidator(_host_address)]
LoginName = Annotated[str, AfterValidator(_login_name)]
RemotePath = Annotated[str, AfterValidator(_remote_path)]
Port = Annotated[int, Field(ge=1, le=65535)]
Seconds = Annotated[float, Field(gt=0, allow_inf_nan=False)]
ArgValue = Annotated[Any, AfterValidator(_arg_value)]
FlagName = Annotated[str, AfterValidator(_flag_name)]
EnvValue = Annotated[Any, AfterValidator(_env_value)]


class _Schema(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class ModelDoc(_Schema):
    path: RemotePath = Field(
        description="the checkpoint folder on the host", examples=["/data/models/Kimi-K2.5-NVFP4"]
    )


class ServerDoc(_Schema):
    port: Port = Field(8000, description="the model server's port", examples=[8000])
    args: dict[FlagName, ArgValue] = Field(
        default_factory=dict,
        description="serve arguments in vLLM's --help names without dashes: `name: value` is "
        "`--name value`, `true` a bare flag, `false`/null left out, a list several values, "
        "a mapping JSON",
        examples=["{tensor-parallel-size: 8, trust-remote-code: true}"],
    )
    env: dict[EnvName, EnvValue] = Field(
        default_factory=dict,
        description="environment variables of the server (a secret one is kept out of the "
        "launch script)",
        examples=["{NCCL_P2P_LEVEL: SYS}"],
    )


class PathsDoc(_Schema):
    script: RemotePath = Field(
        "opsbook/launch.sh",
        description="the launch script on the host (relative: from the login user's home)",
        examples=["opsbook/launch.sh"],
    )
    log: RemotePath = Field(
        "opsbook/vllm.log", description="the server's log on the host", examples=["/var/log/x"]
    )
    state: RemotePath = Field(
        "opsbook/state",
        description="where opsbook keeps what it started (pid, script version)",
        examples=["opsbook/state"],
    )


class VarsDoc(_Schema):
    """What one host may set differently: any top-level key but ``hosts`` and ``cluster``."""

    name: str | None = None
    model: ModelDoc | None = None
    python: RemotePath | None = None
    server: ServerDoc | None = None
    paths: PathsDoc | None = None
    secrets: list[EnvName] | None = None


class HostDoc(_Schema):
    address: HostAddress = Field(
        description="host name, address or ~/.ssh/config alias", examples=["gpu-01.example"]
    )
    port: Port = Field(22, description="SSH port", examples=[22])
    user: LoginName | None = Field(
        None, description="login user (default: SSH's)", examples=["ubuntu"]
    )
    key: str | None = Field(
        None,
        description="private key file (relative: from the deployment file's folder)",
        examples=["~/.ssh/id_ed25519"],
    )
    known_hosts: str = Field(
        "~/.ssh/known_hosts",
        description="known_hosts file host keys are checked against",
        examples=["~/.ssh/known_hosts"],
    )
    trust_on_first_use: bool = Field(
        False,
        description="accept and record an unknown host key once (a changed key is always refused)",
        examples=["true"],
    )
    connect_timeout: Seconds = Field(10.0, description="seconds to connect", examples=[10])
    command_timeout: Seconds = Field(
        120.0, description="seconds a remote command may run by default", examples=[120]
    )
    keepalive: Annotated[int, Field(ge=0)] = Field(
        15, description="seconds between SSH keepalives (0: none)", examples=[15]
    )
    vars: VarsDoc | None = Field(
        None,
        description="top-level values that differ on this host (model, python, server, paths)",
        examples=["{server: {port: 8001}}"],
    )


class ClusterDoc(_Schema):
    head: str | None = Field(
        None,
        description="the Ray head: a host's address or name from hosts (default: the first)",
        examples=["gpu-01.example"],
    )
    tensor_parallel_size: Annotated[int, Field(ge=1)] = Field(
        description="GPUs a layer is split over", examples=[8]
    )
    pipeline_parallel_size: Annotated[int, Field(ge=1)] = Field(
        description="stages (hosts) the layers are split over", examples=[2]
    )
    ray_port: Port = Field(DEFAULT_RAY_PORT, description="the Ray head's port", examples=[6379])
    interface: str | None = Field(
        None,
        description="network interface for NCCL/Gloo between hosts (null: their choice)",
        examples=["eth0"],
    )


class DeploymentDoc(_Schema):
    """A deployment file, as the schema checks it."""

    name: str | None = Field(
        None, description="the deployment's name (default: the file's)", examples=["kimi-k25"]
    )
    hosts: Annotated[
        list[Annotated[HostDoc, BeforeValidator(_host_entry)]], Field(min_length=1)
    ] = Field(
        description="the hosts, each an address or a mapping (below)",
        examples=["[{address: gpu-01, user: ubuntu, key: ~/.ssh/id_ed25519}]"],
    )
    model: ModelDoc = Field(description="the model", examples=["{path: /data/models/x}"])
    python: RemotePath = Field(
        "python3",
        description="the interpreter of vLLM's env on the host",
        examples=["/opt/vllm/.venv/bin/python"],
    )
    server: ServerDoc = Field(
        default=ServerDoc.model_validate({}),
        description="the model server",
        examples=["{port: 8000, args: {tensor-parallel-size: 8}, env: {NCCL_P2P_LEVEL: SYS}}"],
    )
    paths: PathsDoc = Field(
        default=PathsDoc.model_validate({}),
        description="files opsbook keeps on the host",
        examples=["{script: opsbook/launch.sh, log: opsbook/vllm.log, state: opsbook/state}"],
    )
    secrets: list[EnvName] = Field(
        default_factory=list,
        description="names of local environment variables holding secrets (values are never "
        f"written down); {', '.join(DEFAULT_SECRETS)} are always secret",
        examples=["[HF_TOKEN]"],
    )
    cluster: ClusterDoc | None = Field(
        None,
        description="one server over several hosts (Ray)",
        examples=["{tensor_parallel_size: 8, pipeline_parallel_size: 2}"],
    )

    @model_validator(mode="after")
    def _each_host_once(self) -> DeploymentDoc:
        # Two entries for one host would run each stage twice on it at once: two launches
        # fighting over its port and GPUs.
        seen: dict[str, int] = {}
        for i, host in enumerate(self.hosts):
            name = _host_name(host)
            if name in seen:
                raise _invalid(
                    f"hosts[{i}]: {name} is listed twice (also hosts[{seen[name]}])",
                    "list each host once",
                )
            seen[name] = i
        return self

    @model_validator(mode="after")
    def _head_is_a_host(self) -> DeploymentDoc:
        head = self.cluster.head if self.cluster else None
        if head is not None:
            names = {h.address for h in self.hosts} | {_host_name(h) for h in self.hosts}
            if head not in names:
                close = difflib.get_close_matches(head, sorted(names), n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise _invalid(
                    f"cluster.head: {head!r} is none of the hosts{hint}",
                    f"set cluster.head to one of {', '.join(sorted(names))}, or leave it out "
                    "for the first host",
                )
        return self


def _host_name(doc: HostDoc) -> str:
    return HostSpec(doc.address, doc.port, doc.user).name


# -- reading ---------------------------------------------------------------------------------


def load_deployment(
    path: str | os.PathLike[str], overrides: dict[str, Any] | None = None
) -> Deployment:
    """Read and check a deployment file.

    Args:
        path: the YAML file.
        overrides: dotted keys to replace, e.g. ``{"server.port": 8001}``.

    Raises:
        DeploymentError: the file is missing, too large, not YAML, or does not fit the schema.
    """
    file = Path(path).expanduser()
    text = _read_text(file)
    try:
        doc = load_yaml(text)
    except yaml.YAMLError as e:
        raise DeploymentError(
            f"deployment file {file} is not valid YAML: {e}",
            remedy="fix the YAML syntax at the line named above",
        ) from None
    except YamlLimitError as e:
        raise DeploymentError(f"deployment file {file}: {e}", remedy=e.remedy) from None
    if not isinstance(doc, dict):
        raise DeploymentError(
            f"deployment file {file} must hold a mapping at the top level, not {_kind(doc)}",
            remedy="start it with e.g. `name: ...`, `hosts: [...]`, `model: {path: ...}`",
        )
    for key, value in (overrides or {}).items():
        set_dotted(doc, key, value)
    return parse_deployment(doc, source=str(file))


def _read_text(file: Path) -> str:
    try:
        with file.open("rb") as f:
            data = f.read(MAX_BYTES + 1)
    except FileNotFoundError:
        raise DeploymentError(
            f"deployment file {file} does not exist",
            remedy="give the path of a deployment YAML file (see deployments/ for examples)",
        ) from None
    except IsADirectoryError:
        raise DeploymentError(
            f"deployment file {file} is a folder", remedy="give the YAML file's path"
        ) from None
    except OSError as e:
        raise DeploymentError(f"cannot read deployment file {file}: {e.strerror}") from None
    if len(data) > MAX_BYTES:
        raise DeploymentError(
            f"deployment file {file} is larger than {MAX_BYTES} bytes",
            remedy="a deployment file is a few kB: check that this is the right file",
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DeploymentError(
            f"deployment file {file} is not UTF-8 text (byte {e.start})",
            remedy="save it as UTF-8",
        ) from None


class YamlLimitError(Exception):
    """A YAML document beyond :data:`MAX_DEPTH`, :data:`MAX_NODES` or with duplicate keys."""

    def __init__(self, message: str, remedy: str):
        super().__init__(message)
        self.remedy = remedy


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader with the nesting depth bounded while composing (before PyYAML's
    own recursion could overflow the stack)."""

    def __init__(self, stream: str):
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                mark = self.peek_event().start_mark
                raise YamlLimitError(
                    f"YAML nested more than {MAX_DEPTH} levels deep (at {mark.line + 1}:"
                    f"{mark.column + 1})",
                    remedy="a deployment file needs a few levels; remove the nesting",
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


# YAML 1.2's booleans only: `yes`, `no`, `on`, `off` stay text (PyYAML reads YAML 1.1, where
# `trust_on_first_use: yes` is true and a country code `NO` is false), so the schema can say so.
_BoundedLoader.yaml_implicit_resolvers = {
    first: [r for r in resolvers if r[0] != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_BoundedLoader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)


def load_yaml(text: str) -> Any:
    """A YAML document, bounded: the nesting depth while it is read, then the number of values
    it holds with every alias expanded (counted without expanding them), and no duplicate keys.

    Raises:
        yaml.YAMLError: not YAML.
        YamlLimitError: beyond a limit, or a key written twice in one mapping.
    """
    loader = _BoundedLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_nodes(node)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _check_nodes(root: yaml.Node) -> None:
    sizes: dict[int, int] = {}
    total = _expanded_size(root, sizes, 0)
    if total > MAX_NODES:
        raise YamlLimitError(
            f"YAML holds {total} values once its aliases (*name) are expanded, more than "
            f"{MAX_NODES}",
            remedy="write the values out instead of nesting aliases of aliases",
        )


def _expanded_size(node: yaml.Node, sizes: dict[int, int], depth: int) -> int:
    """How many values ``node`` stands for with aliases expanded; an aliased node is counted
    once per use, computed once (memo by identity)."""
    known = sizes.get(id(node))
    if known is not None:
        return known
    if depth > MAX_DEPTH:
        raise YamlLimitError(
            f"YAML nested more than {MAX_DEPTH} levels deep", remedy="remove the nesting"
        )
    size = 1
    if isinstance(node, yaml.SequenceNode):
        for item in node.value:
            size += _expanded_size(item, sizes, depth + 1)
            if size > MAX_NODES:
                break
    elif isinstance(node, yaml.MappingNode):
        seen: set[str] = set()
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode) and key.tag != "tag:yaml.org,2002:merge":
                if key.value in seen:
                    raise YamlLimitError(
                        f"key {key.value!r} is written twice in one mapping (line "
                        f"{key.start_mark.line + 1})",
                        remedy="keep one of them: YAML would silently use the last",
                    )
                seen.add(key.value)
            size += _expanded_size(key, sizes, depth + 1) + _expanded_size(value, sizes, depth + 1)
            if size > MAX_NODES:
                break
    sizes[id(node)] = size
    return size


def parse_deployment(doc: dict[str, Any], source: str = "<dict>") -> Deployment:
    """Build a :class:`Deployment` from an already-loaded document, checked against
    :class:`DeploymentDoc`.

    Raises:
        DeploymentError: the document does not fit the schema (every problem named, with its
            key path and what is expected).
    """
    checked = validate_doc(doc, source)
    dep = _build(checked, source)
    dep.host_views = _host_views(doc, checked, dep.hosts, source)
    return dep


def validate_doc(doc: Any, source: str = "<dict>") -> DeploymentDoc:
    """``doc`` checked against the schema.

    Raises:
        DeploymentError: it does not fit.
    """
    try:
        return DeploymentDoc.model_validate(doc)
    except ValidationError as e:
        raise schema_error(e, source) from None
    except RecursionError:
        raise DeploymentError(
            f"{source}: nested too deeply", remedy=f"keep it under {MAX_DEPTH} levels"
        ) from None


def _build(doc: DeploymentDoc, source: str) -> Deployment:
    hosts = [_host_spec(h, source) for h in doc.hosts]
    return Deployment(
        name=doc.name or Path(source).stem,
        hosts=hosts,
        model_path=doc.model.path,
        python=doc.python,
        server_port=doc.server.port,
        serve_args=copy.deepcopy(dict(doc.server.args)),
        env=dict(doc.server.env),
        secrets=tuple(dict.fromkeys((*doc.secrets, *DEFAULT_SECRETS))),
        script_path=doc.paths.script,
        log_path=doc.paths.log,
        state_dir=doc.paths.state,
        source=source,
        cluster=_cluster_spec(doc.cluster, hosts),
    )


def _host_spec(doc: HostDoc, source: str) -> HostSpec:
    return HostSpec(
        address=doc.address,
        port=doc.port,
        user=doc.user,
        key=str(_resolve(doc.key, source)) if doc.key else None,
        known_hosts=str(_resolve(doc.known_hosts, source)),
        trust_on_first_use=doc.trust_on_first_use,
        connect_timeout=float(doc.connect_timeout),
        command_timeout=float(doc.command_timeout),
        keepalive=doc.keepalive,
    )


def _cluster_spec(doc: ClusterDoc | None, hosts: list[HostSpec]) -> ClusterSpec | None:
    if doc is None:
        return None
    return ClusterSpec(
        head=doc.head or hosts[0].address,
        tensor_parallel_size=doc.tensor_parallel_size,
        pipeline_parallel_size=doc.pipeline_parallel_size,
        ray_port=doc.ray_port,
        interface=doc.interface,
    )


def _host_views(
    doc: dict[str, Any], checked: DeploymentDoc, hosts: list[HostSpec], source: str
) -> dict[str, Deployment]:
    if not any(h.vars for h in checked.hosts):
        return {}
    views = {}
    for index, spec in enumerate(hosts):
        merged = copy.deepcopy(doc)
        entry = _host_entry(doc["hosts"][index])
        overrides = entry.get("vars") or {}
        merged["hosts"] = [{k: v for k, v in entry.items() if k != "vars"}]
        merged.pop("cluster", None)
        for key, value in _dotted(overrides):
            set_dotted(merged, key, value)
        try:
            view = _build(DeploymentDoc.model_validate(merged), source)
        except ValidationError as e:
            raise schema_error(e, source, prefix=f"hosts[{index}].vars applied: ") from None
        # Each view holds one host; the cluster, which names the others, is the whole file's.
        view.cluster = _cluster_spec(checked.cluster, hosts)
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


def _resolve(path: str, source: str) -> Path:
    """Expand ~ and make a relative path relative to the deployment file's folder."""
    p = Path(os.path.expanduser(str(path)))
    if not p.is_absolute() and source and not source.startswith("<"):
        p = Path(source).parent / p
    return p


# -- errors ----------------------------------------------------------------------------------


def schema_error(error: ValidationError, source: str, prefix: str = "") -> DeploymentError:
    """One :class:`DeploymentError` naming every problem: the file, the key path, what was
    found, what is expected, and a remedy."""
    problems = [describe(e) for e in error.errors(include_url=False)]
    lines = [f"{prefix}{path}: {problem}" for path, problem, _ in problems]
    remedies = list(dict.fromkeys(r for _, _, r in problems if r))
    head = f"{source}: " + (
        lines[0] if len(lines) == 1 else f"{len(lines)} problems:\n  " + "\n  ".join(lines)
    )
    return DeploymentError(head, remedy="; ".join(remedies) or None)


def describe(error: Any) -> tuple[str, str, str]:
    """A pydantic error as (key path, what is wrong and expected, remedy)."""
    loc = tuple(error["loc"])
    kind = error["type"]
    value = error.get("input")
    path = key_path(loc)
    field_info = _field_at(loc)
    example = _example(field_info)
    write = f"write e.g. `{_yaml_line(loc, example)}`" if example is not None else ""
    if kind == "extra_forbidden":
        return path, f"unknown key {loc[-1]!r}", _nearest_key(loc)
    if kind == "missing":
        return path, "is required", write
    if kind == "bool_type":
        return (
            path,
            f"expected true or false, got {_shown(value)}",
            (f"write {loc[-1]}: true or {loc[-1]}: false, without quotes"),
        )
    if kind in ("int_type", "int_parsing", "int_from_float"):
        return path, f"expected an integer, got {_shown(value)}", write
    if kind == "finite_number":
        return path, f"expected a finite number, got {value!r}", write
    if kind in ("float_type", "float_parsing"):
        return path, f"expected a number, got {_shown(value)}", write
    if kind in ("greater_than_equal", "less_than_equal", "greater_than", "less_than"):
        return path, f"expected {_range(field_info)}, got {value!r}", write
    if kind == "string_type":
        quotable = _is_scalar(value) and value is not None and isinstance(loc[-1], str)
        remedy = f"quote it: {loc[-1]}: '{value}'" if quotable else write or "write a string"
        return path, f"expected a string, got {_shown(value)}", remedy
    if kind == "list_type":
        remedy = f"write {loc[-1]}: [{value}]" if isinstance(value, str) else write
        return path, f"expected a list, got {_shown(value)}", remedy
    if kind in ("dict_type", "model_type", "model_attributes_type"):
        return path, f"expected a mapping (key: value), got {_shown(value)}", write
    if kind == "too_short":
        return path, "expected at least one entry, got none", write
    if kind == "string_too_short":
        return path, "expected a non-empty string", write
    if kind == INVALID:
        context = error.get("ctx") or {}
        return path, str(context.get("problem", error["msg"])), str(context.get("remedy", ""))
    return path, f"{error['msg']} (got {_shown(value)})", write


def key_path(loc: tuple[Any, ...]) -> str:
    """``("hosts", 1, "port")`` -> ``hosts[1].port``; a mapping's key -> ``server.env 'A-B'``."""
    text = ""
    for part in loc:
        if isinstance(part, int):
            text += f"[{part}]"
        elif part == "[key]":
            text += " (a key)"
        else:
            text += f".{part}" if text else str(part)
    return text or "(top level)"


def _nearest_key(loc: tuple[Any, ...]) -> str:
    model = _model_at(loc[:-1])
    if model is None:
        return ""
    valid = list(model.model_fields)
    close = difflib.get_close_matches(str(loc[-1]), valid, n=1, cutoff=0.6)
    hint = f"did you mean {close[0]!r}? " if close else ""
    where = key_path(loc[:-1])
    place = f"under {where}" if loc[:-1] else "at the top level"
    return f"{hint}valid keys {place}: {', '.join(valid)}"


def _model_at(loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The schema model a key path leads to (list indexes skipped)."""
    model: type[BaseModel] | None = DeploymentDoc
    for part in loc:
        if isinstance(part, int):
            continue
        if model is None or part not in model.model_fields:
            return None
        model = _inner_model(model.model_fields[part].annotation)
    return model


def _field_at(loc: tuple[Any, ...]) -> FieldInfo | None:
    names = [p for p in loc if isinstance(p, str) and p != "[key]"]
    if not names:
        return None
    model = _model_at(tuple(names[:-1]))
    return model.model_fields.get(names[-1]) if model is not None else None


def _inner_model(annotation: Any) -> type[BaseModel] | None:
    """The BaseModel inside ``X``, ``X | None``, ``list[X]``, ``Annotated[X, ...]``."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _inner_model(arg)
        if found is not None:
            return found
    return None


def _example(info: FieldInfo | None) -> Any:
    return info.examples[0] if info is not None and info.examples else None


def _yaml_line(loc: tuple[Any, ...], example: Any) -> str:
    names = [str(p) for p in loc if isinstance(p, str) and p != "[key]"]
    return f"{names[-1] if names else 'key'}: {example}"


def _range(info: FieldInfo | None) -> str:
    low, high, above = None, None, None
    for item in info.metadata if info is not None else []:
        low = getattr(item, "ge", None) if getattr(item, "ge", None) is not None else low
        high = getattr(item, "le", None) if getattr(item, "le", None) is not None else high
        above = getattr(item, "gt", None) if getattr(item, "gt", None) is not None else above
    if low is not None and high is not None:
        return f"an integer from {low} to {high}"
    if low is not None:
        return f"an integer of at least {low}"
    if above is not None:
        return f"a number greater than {above}"
    return "a value in range"


def _kind(value: Any) -> str:
    names = {str: "a string", bool: "a boolean", int: "an integer", float: "a number"}
    names |= {list: "a list", dict: "a mapping", type(None): "nothing (null)", bytes: "bytes"}
    return names.get(type(value), type(value).__name__)


def _shown(value: Any) -> str:
    if isinstance(value, (dict, list)) or value is None:
        return _kind(value)
    text = repr(value)
    return f"{_kind(value)} {text if len(text) <= 60 else text[:57] + '...'}"


def _is_scalar(value: Any) -> bool:
    return isinstance(value, (int, float, bool)) or value is None


# -- the reference table ---------------------------------------------------------------------


def reference_rows() -> list[tuple[str, str, str, str]]:
    """(key, type, default, meaning) of every key of a deployment file, from the schema."""
    return list(_rows(DeploymentDoc, ""))


def _rows(model: type[BaseModel], prefix: str) -> Iterator[tuple[str, str, str, str]]:
    for name, info in model.model_fields.items():
        key = f"{prefix}{name}"
        inner = _inner_model(info.annotation)
        listed = _is_list(info.annotation)
        yield key, _type_label(info), _default_label(info), info.description or ""
        if inner is not None and inner is not VarsDoc:
            yield from _rows(inner, f"{key}[]." if listed else f"{key}.")


def reference_table() -> str:
    """The deployment file reference as a Markdown table (the README's)."""
    lines = ["| key | type | default | meaning |", "|---|---|---|---|"]
    for key, kind, default, meaning in reference_rows():
        lines.append(f"| `{key}` | {kind} | {default} | {meaning.replace('|', '/')} |")
    return "\n".join(lines) + "\n"


def _is_list(annotation: Any) -> bool:
    return typing.get_origin(_strip(annotation)) is list


def _strip(annotation: Any) -> Any:
    """``Annotated[X, ...]`` -> X."""
    while typing.get_origin(annotation) is Annotated:
        annotation = typing.get_args(annotation)[0]
    return annotation


def _type_label(info: FieldInfo) -> str:
    label = _annotation_label(info.annotation)
    bounds = _range(info) if info.metadata else ""
    if bounds.startswith("an integer from"):
        label = f"integer {bounds.removeprefix('an integer from ').replace(' to ', '..')}"
    elif bounds.startswith("an integer of at least"):
        label = f"integer ≥ {bounds.removeprefix('an integer of at least ')}"
    elif bounds.startswith("a number greater than"):
        label = f"number > {bounds.removeprefix('a number greater than ')}"
    return label


def _annotation_label(annotation: Any) -> str:
    annotation = _strip(annotation)
    origin = typing.get_origin(annotation)
    if origin in (Union, types.UnionType):
        labels = [_annotation_label(a) for a in typing.get_args(annotation)]
        return " or ".join(labels)
    if origin is list:
        return f"list of {_annotation_label(typing.get_args(annotation)[0])}s"
    if origin is dict:
        return "mapping"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "mapping"
    names = {str: "string", bool: "true/false", int: "integer", float: "number"}
    names[type(None)] = "null"
    if annotation is Any:
        return "value"
    return names.get(annotation, getattr(annotation, "__name__", str(annotation)))


def _default_label(info: FieldInfo) -> str:
    if info.is_required():
        return "required"
    if info.default_factory is not None:
        return "empty"
    default = info.default
    if isinstance(default, BaseModel):
        return "see below"
    if default is None:
        return "null"
    if isinstance(default, bool):
        return f"`{str(default).lower()}`"
    return f"`{default}`"
