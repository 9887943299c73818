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
import os
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from opsbook.core.deployment_schema import (
    ENV_NAME,
    ClusterDoc,
    DeploymentDoc,
    HostDoc,
    check_flag_name,
    host_entry,
    kind_of,
)
from opsbook.core.deployment_spec import (
    DEFAULT_SECRETS,
    ClusterSpec,
    Deployment,
    HostSpec,
    RollingSpec,
    is_secret_flag,
)
from opsbook.core.deployment_text import schema_error
from opsbook.core.exceptions import DeploymentError
from opsbook.core.yaml_bounds import MAX_BYTES, MAX_DEPTH, YamlLimitError, load_yaml


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
            f"deployment file {file} must hold a mapping at the top level, not {kind_of(doc)}",
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
        python=doc.engine.python if doc.engine is not None else doc.python,
        engine_version=doc.engine.version if doc.engine is not None else None,
        server_port=doc.server.port,
        serve_args=copy.deepcopy(dict(doc.server.args)),
        env=dict(doc.server.env),
        secrets=tuple(dict.fromkeys((*doc.secrets, *DEFAULT_SECRETS))),
        script_path=doc.paths.script,
        log_path=doc.paths.log,
        state_dir=doc.paths.state,
        source=source,
        cluster=_cluster_spec(doc.cluster, hosts),
        rolling=RollingSpec(
            tuple(doc.rolling.pre_host or ()),
            tuple(doc.rolling.post_host or ()),
            float(doc.rolling.hook_timeout),
        ),
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
        entry = host_entry(doc["hosts"][index])
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


# What callers import from here: the typed deployment and the names checked in it.
__all__ = [
    "ENV_NAME",
    "ClusterSpec",
    "Deployment",
    "HostSpec",
    "RollingSpec",
    "check_flag_name",
    "is_secret_flag",
    "load_deployment",
    "parse_deployment",
    "set_dotted",
    "validate_doc",
]
