"""The deployment file's schema: pydantic models of every key, with the checks each value
passes (names, addresses, ports, serve arguments, paths), and the errors they raise.

:mod:`opsbook.core.deployment` reads a file against :class:`DeploymentDoc`;
:mod:`opsbook.core.deployment_text` words its errors and its reference table.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    model_validator,
)
from pydantic_core import PydanticCustomError

from opsbook.core.deployment_spec import DEFAULT_RAY_PORT, DEFAULT_SECRETS, ENV_NAME, HostSpec
from opsbook.core.exceptions import DeploymentError
from opsbook.core.yaml_bounds import MAX_DEPTH

FLAG_NAME = re.compile(r"^[a-z0-9][a-z0-9-]*(\.[a-z0-9_][a-z0-9_-]*)*$")
RESERVED_FLAGS = {"model": "model.path", "port": "server.port"}
# A host's address that means the machine opsbook runs on: its stages run here, without SSH.
LOCAL_ADDRESS = "local"
# What only the SSH connection reads: a local host given one of them is refused, not ignored.
SSH_ONLY_KEYS = (
    "port",
    "user",
    "key",
    "known_hosts",
    "trust_on_first_use",
    "connect_timeout",
    "keepalive",
)
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
            f"expected a string or a number, got {kind_of(value)}",
            "quote the value: NAME: '1' or NAME: 'true'",
        )
    _no_nul(str(value))
    return str(value)


def _no_nul(text: str) -> None:
    # A shell script cannot carry a NUL byte: bash drops or truncates at it.
    if "\0" in text:
        raise _invalid("a value may not hold a NUL byte", "remove the NUL byte from the value")


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
    """A serve argument's value: a scalar, a list, or a mapping (JSON for vLLM), nothing else;
    a word of the command line (a scalar, a list's item) that vLLM's parser would not read as
    a value is refused."""
    _check_json_like(value, 0)
    for word in value if isinstance(value, list) else [value]:
        if isinstance(word, str):
            _check_arg_word(word)
    return value


def _check_arg_word(word: str) -> None:
    _no_nul(word)
    # argparse takes a word that begins with '-' for an option unless it reads as a negative
    # number (CPython Lib/argparse.py, _negative_number_matcher): `[--foo]` would be a flag.
    if word.startswith("-") and not NEGATIVE_NUMBER.fullmatch(word):
        raise _invalid(
            f"the value {word!r} begins with '-': vLLM's parser would read it as a flag",
            "give a flag its own key in server.args (name: true), not as another flag's value",
        )


NEGATIVE_NUMBER = re.compile(r"-\d+$|-\d*\.\d+$")


def _serve_args(args: dict[str, Any]) -> dict[str, Any]:
    """The serve arguments with each flag once: ``--name`` and ``name`` are one flag."""
    seen: dict[str, str] = {}
    for name in args:
        flag = name.removeprefix("--")
        if flag in seen:
            raise _invalid(
                f"the flag --{flag} is given twice (as {seen[flag]!r} and {name!r})",
                "keep one of the two keys",
            )
        seen[flag] = name
    return args


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
                    f"mapping keys must be strings, not {kind_of(key)} {key!r}",
                    f"quote the key: '{key}': ...",
                )
            _check_json_like(item, depth + 1)
        return
    raise _invalid(
        f"expected a string, number, boolean, list or mapping, got {kind_of(value)}",
        "write a plain YAML value (no tags)",
    )


def host_entry(entry: Any) -> Any:
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


ServeArgs = Annotated[dict[FlagName, ArgValue], AfterValidator(_serve_args)]


class _Schema(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class ModelDoc(_Schema):
    path: RemotePath = Field(
        description="the checkpoint folder on the host", examples=["/data/models/Kimi-K2.5-NVFP4"]
    )


class ServerDoc(_Schema):
    port: Port = Field(8000, description="the model server's port", examples=[8000])
    args: ServeArgs = Field(
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
        description="host name, address or ~/.ssh/config alias; `local`: the machine opsbook "
        "runs on, without SSH (commands run as the user running opsbook)",
        examples=["gpu-01.example"],
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
        description=(
            "top-level values that differ on this host (model, python, server, paths), "
            "set value by value over the shared ones"
        ),
        examples=["{server: {port: 8001}}"],
    )

    @model_validator(mode="after")
    def _local_takes_no_ssh_keys(self) -> HostDoc:
        if self.address != LOCAL_ADDRESS:
            return self
        given = [k for k in SSH_ONLY_KEYS if k in self.model_fields_set]
        if given:
            raise _invalid(
                f"address: {LOCAL_ADDRESS} runs on this machine without SSH, and "
                f"{', '.join(given)} {'is' if len(given) == 1 else 'are'} read only by SSH",
                f"remove {', '.join(given)} from this host; the commands run as the user "
                "running opsbook (to deploy this machine over SSH, give its name or address)",
            )
        return self


# A vLLM release as pip and `vllm --version` write it: 0.18.0, 0.19.1rc1, 0.20.0+cu129.
ENGINE_VERSION = re.compile(r"\d+\.\d+(\.\d+)?([a-z0-9.+-]*)")


_engine_version = _matching(
    ENGINE_VERSION, "a vLLM version", "write the version `vllm --version` prints, e.g. 0.18.0"
)


class EngineDoc(_Schema):
    version: Annotated[str, AfterValidator(_engine_version)] = Field(
        description="the vLLM release the deployment runs, pinned by 07_upgrade",
        examples=["0.18.0"],
    )
    python: RemotePath = Field(
        description="the interpreter of that release's env (the deployment's `python`)",
        examples=["/opt/vllm-0.18.0/bin/python"],
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


# What a rolling hook's arguments may name: the host as opsbook names it, and its address.
HOOK_FIELDS = ("host", "address")
_HOOK_FIELD = re.compile(r"\{([A-Za-z_]\w*)\}")


def _hook_argv(argv: list[str]) -> list[str]:
    if not argv or not argv[0].strip():
        raise _invalid(
            "expected a command as a list of arguments, the program first",
            "e.g. pre_host: [./lb.sh, drain, '{host}']",
        )
    for word in argv:
        if "\0" in word:
            raise _invalid("an argument may not hold a NUL byte", "remove it")
        unknown = [f for f in _HOOK_FIELD.findall(word) if f not in HOOK_FIELDS]
        if unknown:
            raise _invalid(
                f"{word!r} names {{{unknown[0]}}}, which a hook is not given",
                f"a hook's arguments may hold {', '.join('{' + f + '}' for f in HOOK_FIELDS)}",
            )
    return argv


HookArgv = Annotated[list[str], AfterValidator(_hook_argv)]


class RollingDoc(_Schema):
    pre_host: HookArgv | None = Field(
        None,
        description="a command (a list of arguments, no shell) run on this machine before each "
        "host is deployed, e.g. to drain it at a load balancer; {host} and {address} are "
        "replaced; when it fails the host is skipped as failed",
        examples=["[./lb.sh, drain, '{address}']"],
    )
    post_host: HookArgv | None = Field(
        None,
        description="a command run on this machine once the host serves again (deployed, or "
        "rolled back), e.g. to add it back; {host} and {address} are replaced",
        examples=["[./lb.sh, add, '{address}']"],
    )
    hook_timeout: Seconds = Field(60.0, description="seconds a hook may run", examples=[60])


class DeploymentDoc(_Schema):
    """A deployment file, as the schema checks it."""

    name: str | None = Field(
        None, description="the deployment's name (default: the file's)", examples=["kimi-k25"]
    )
    hosts: Annotated[list[Annotated[HostDoc, BeforeValidator(host_entry)]], Field(min_length=1)] = (
        Field(
            description="the hosts, each an address or a mapping (below)",
            examples=["[{address: gpu-01, user: ubuntu, key: ~/.ssh/id_ed25519}]"],
        )
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
    engine: EngineDoc | None = Field(
        None,
        description="the engine pinned by a passed 07_upgrade: its vLLM version and interpreter",
        examples=["{version: 0.18.0, python: /opt/vllm-0.18.0/bin/python}"],
    )
    cluster: ClusterDoc | None = Field(
        None,
        description="one server over several hosts (Ray)",
        examples=["{tensor_parallel_size: 8, pipeline_parallel_size: 2}"],
    )
    rolling: RollingDoc = Field(
        default=RollingDoc.model_validate({}),
        description="commands run on this machine around each host of a deploy",
        examples=[
            "{pre_host: [./lb.sh, drain, '{address}'], post_host: [./lb.sh, add, '{address}']}"
        ],
    )

    @model_validator(mode="after")
    def _local_once_and_alone_in_a_cluster(self) -> DeploymentDoc:
        local = [i for i, h in enumerate(self.hosts) if h.address == LOCAL_ADDRESS]
        if len(local) > 1:
            raise _invalid(
                f"hosts[{local[1]}]: address {LOCAL_ADDRESS} is given twice (also "
                f"hosts[{local[0]}]): there is one machine opsbook runs on",
                f"keep one `{LOCAL_ADDRESS}` host; give the others by name or address",
            )
        if local and self.cluster is not None:
            raise _invalid(
                f"hosts[{local[0]}]: a node of a model served across hosts cannot be "
                f"`{LOCAL_ADDRESS}`: the other nodes reach each node at its address",
                "give this node its address on the network between the nodes",
            )
        return self

    @model_validator(mode="after")
    def _engine_is_the_python(self) -> DeploymentDoc:
        # Two interpreters for one deployment would launch one and record the other.
        if self.engine is not None and "python" in self.model_fields_set:
            if self.engine.python != self.python:
                raise _invalid(
                    f"engine.python is {self.engine.python!r} but python is {self.python!r}",
                    "give the interpreter once: python (or engine.python, which 07_upgrade "
                    "writes with its version)",
                )
        return self

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
    def _cluster_agrees_with_args(self) -> DeploymentDoc:
        # The launch script takes server.args over cluster: while preflight checks the GPUs
        # against cluster's sizes, two different values would start what was not checked.
        if self.cluster is None:
            return self
        docs = [("server.args", self.server)] + [
            (f"hosts[{i}].vars.server.args", h.vars.server)
            for i, h in enumerate(self.hosts)
            if h.vars is not None and h.vars.server is not None
        ]
        for where, server in docs:
            for flag, expected in _cluster_flags(self.cluster).items():
                _check_agrees(where, server.args, flag, expected)
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


def _cluster_flags(cluster: ClusterDoc) -> dict[str, int]:
    """The parallel sizes a cluster sets, by serve argument."""
    return {
        "tensor-parallel-size": cluster.tensor_parallel_size,
        "pipeline-parallel-size": cluster.pipeline_parallel_size,
    }


def _check_agrees(where: str, args: dict[str, Any], flag: str, expected: int) -> None:
    for name in (flag, f"--{flag}"):
        if name in args and str(args[name]) != str(expected):
            key = flag.replace("-", "_")
            raise _invalid(
                f"{where}.{flag} is {args[name]!r} but the cluster sets it to {expected!r}",
                f"set the size once, in cluster.{key}, and leave {flag} out of {where}",
            )


def _host_name(doc: HostDoc) -> str:
    return HostSpec(doc.address, doc.port, doc.user).name


def kind_of(value: Any) -> str:
    """A value's kind in words: "a string", "a mapping", "nothing (null)"..."""
    names = {str: "a string", bool: "a boolean", int: "an integer", float: "a number"}
    names |= {list: "a list", dict: "a mapping", type(None): "nothing (null)", bytes: "bytes"}
    return names.get(type(value), type(value).__name__)
