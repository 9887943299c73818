#!/usr/bin/env python3
"""Extract facts about vLLM from its release wheels, without importing vLLM.

A maintainer tool (not part of the installed package). For each wheel
``vllm-X-*.whl`` it reads the Python sources with :mod:`zipfile` and :mod:`ast` and writes
``opsbook/knowledge/data/vllm_facts/<X>.json`` plus ``index.json``:

- ``attention_backends``: per backend of the registry (``AttentionBackendEnum``), its class,
  the KV-cache dtypes it declares (``supported_kv_cache_dtypes``), the compute capabilities
  its ``supports_compute_capability`` accepts (evaluated for a fixed list of capabilities),
  head sizes, MLA / sparse flags, and FP8-KV gates found in its module (a minimum capability
  or a ``NotImplementedError`` for FP8).
- ``backend_priorities``: the result of ``vllm/platforms/cuda.py::_get_backend_priorities``
  for every capability of the list, MLA or not, BF16 or FP8 KV cache, 16 or 128 heads, and
  (MLA) head size 576 or 512, obtained by interpreting the function's AST.
- ``mla_model_types``: the model types of ``is_deepseek_mla``.
- ``kv_cache_dtypes``: ``CacheDType`` literal, ``STR_DTYPE_TO_TORCH_DTYPE``,
  ``MODELOPT_TO_VLLM_KV_CACHE_DTYPE_MAP``.
- ``quantization_methods``: ``get_name()`` -> ``get_min_capability()`` of each quantization
  config class.
- ``serve_flags``: the option strings of the serve parser (literal ``add_argument`` options and
  the dataclass fields that EngineArgs / FrontendArgs turn into flags, plus, from 0.33.0, the
  ``--disable-x`` / ``--enable-x`` inverse ``EnableDisableAction`` gives a boolean flag).
- ``metrics``: every Prometheus metric the V1 stat loggers create (``name="vllm:..."`` in a
  ``Gauge`` / ``Counter`` / ``Histogram`` call under ``vllm/v1/metrics/``): its type, the
  sample names prometheus_client exports for it, whether it is created only behind
  ``show_hidden_metrics`` (``--show-hidden-metrics-for-version``), and the metric its
  documentation names as its replacement (``DEPRECATED: Use vllm:x instead``).
- ``env_vars``: the ``VLLM_*`` environment variables the release reads: the keys of
  ``environment_variables`` in ``vllm/envs.py`` (what ``vllm.envs`` answers for; from 0.31.0
  ``Platform.validate_environ`` warns of any other ``VLLM_*`` variable set, vllm/platforms/
  interface.py).

Every fact records the wheel file it came from. The output is deterministic: re-running the
tool on the same wheel reproduces the file byte for byte.

Usage::

    python tools/vllm_facts.py --wheels /work/cache/vllm-wheels --out
    opsbook/knowledge/data/vllm_facts
    python tools/vllm_facts.py --wheels DIR --out DIR --version 0.33.0
    python tools/vllm_facts.py --wheel FILE.whl            # print one release's JSON
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# The class-resolution, the small interpreter and the backend registry reader are shared with
# the backends probe, which runs them over an installed vLLM's files on a host.
from opsbook.remote.probes.vllm_source import (
    BACKEND_DIRS,
    CUDA_PLATFORM,
    Cap,
    ClassRef,
    Unresolved,
    WheelSource,
    attr_literal,
    backend_registry,
    body_text,
    call_with,
    cap_text,
    capability_gate,
    class_attr,
    find_class,
    legacy_backends,
    literal,
    mro,
    returned_literal,
)

SCHEMA = 1
# The capabilities every capability-dependent fact is evaluated at (major, minor).
CAPABILITIES = (
    (7, 0),
    (7, 5),
    (8, 0),
    (8, 6),
    (8, 9),
    (9, 0),
    (10, 0),
    (10, 3),
    (11, 0),
    (12, 0),
    (12, 1),
)
PRIORITY_KV_DTYPES = ("auto", "fp8_e4m3")
PRIORITY_NUM_HEADS = (16, 128)
PRIORITY_MLA_HEAD_SIZES = (576, 512)
PRIORITY_NON_MLA_HEAD_SIZE = 128
QUANT_DIR = "vllm/model_executor/layers/quantization/"
SERVE_FLAG_FILES = (
    "vllm/engine/arg_utils.py",
    "vllm/entrypoints/openai/cli_args.py",
    "vllm/entrypoints/cli/serve.py",
)
ARGPARSE_UTILS = "vllm/utils/argparse_utils.py"
FLAG_DATACLASSES = ("EngineArgs", "AsyncEngineArgs", "FrontendArgs", "BaseFrontendArgs")


def backend_facts(wheel: WheelSource, classpath: str) -> dict[str, Any]:
    module, _, cls_name = classpath.rpartition(".")
    file = wheel.module_file(module)
    ref = find_class(wheel, file, cls_name) if file else None
    if ref is None:
        return {"class": classpath, "error": "class not found in the wheel"}
    chain = mro(wheel, ref)
    facts: dict[str, Any] = {"class": classpath, "file": ref.file}
    facts["kv_cache_dtypes"] = attr_literal(chain, "supported_kv_cache_dtypes")
    facts["head_sizes"] = attr_literal(chain, "get_supported_head_sizes")
    facts["is_mla"] = attr_literal(chain, "is_mla")
    facts["is_sparse"] = attr_literal(chain, "is_sparse")
    facts["compute_capability"] = capability_gate(chain, CAPABILITIES)
    facts["fp8_kv_gates"] = fp8_gates(wheel, ref.file)
    return facts


FP8_NOT_SUPPORTED = re.compile(r"FP8 KV cache not yet supported|fp8 kv cache.*not supported", re.I)


def fp8_gates(wheel: WheelSource, file: str) -> list[dict[str, Any]]:
    """FP8-KV conditions in a backend's module: a minimum capability, or a refusal."""
    gates: list[dict[str, Any]] = []
    for node in ast.walk(wheel.tree(file)):
        if not isinstance(node, ast.If):
            continue
        test = ast.unparse(node.test)
        if "fp8" in test and "has_device_capability(" in test:
            m = re.search(r"has_device_capability\((\d+)\)", test)
            if m:
                gates.append(
                    {
                        "kind": "min_capability",
                        "value": int(m.group(1)),
                        "file": file,
                        "line": node.lineno,
                    }
                )
        if "is_quantized_kv_cache" in test or "fp8" in test:
            for inner in node.body:
                text = _raised_text(inner)
                if text and FP8_NOT_SUPPORTED.search(text):
                    gates.append(
                        {"kind": "raises", "value": text, "file": file, "line": inner.lineno}
                    )
    gates.sort(key=lambda g: (g["line"], g["kind"]))
    for g in gates:
        del g["line"]
    return gates


def _raised_text(stmt: ast.stmt) -> str | None:
    if isinstance(stmt, ast.Raise) and isinstance(stmt.exc, ast.Call):
        call = stmt.exc
        name = call.func.id if isinstance(call.func, ast.Name) else ast.unparse(call.func)
        parts = [a.value for a in call.args if isinstance(a, ast.Constant)]
        if parts:
            return f"{name}: {''.join(str(p) for p in parts)}"
    return None


def attention_backends(wheel: WheelSource) -> dict[str, Any]:
    registry, source = backend_registry(wheel)
    if not registry:
        registry, source = legacy_backends(wheel), "get_name() of classes under " + BACKEND_DIRS[0]
    backends = {name: backend_facts(wheel, path) for name, path in sorted(registry.items())}
    return {"source": source, "backends": backends}


# ------------------------------------------------------------------------------------------
# Priorities


def backend_priorities(wheel: WheelSource) -> dict[str, Any]:
    if not wheel.has(CUDA_PLATFORM):
        return {"source": None, "note": f"{CUDA_PLATFORM} absent", "cases": []}
    fn = next(
        (
            n
            for n in ast.walk(wheel.tree(CUDA_PLATFORM))
            if isinstance(n, ast.FunctionDef) and n.name == "_get_backend_priorities"
        ),
        None,
    )
    if fn is None:
        return {
            "source": None,
            "note": (
                f"{CUDA_PLATFORM} has no _get_backend_priorities: this release selects with an "
                "if-chain in get_attn_backend_cls (not extracted)"
            ),
            "cases": [],
        }
    params = [a.arg for a in fn.args.args + fn.args.kwonlyargs]
    cases = []
    for cap in CAPABILITIES:
        for use_mla in (True, False):
            sizes = PRIORITY_MLA_HEAD_SIZES if use_mla else (PRIORITY_NON_MLA_HEAD_SIZE,)
            for kv in PRIORITY_KV_DTYPES:
                for heads in PRIORITY_NUM_HEADS:
                    for head_size in sizes:
                        values = {
                            "use_mla": use_mla,
                            "device_capability": Cap(cap),
                            "kv_cache_dtype": kv,
                            "num_heads": heads,
                            "head_size": head_size,
                        }
                        order = call_with(fn, values, Cap(cap))
                        cases.append(
                            {
                                "compute_capability": cap_text(cap),
                                "use_mla": use_mla,
                                "kv_cache_dtype": kv,
                                "num_heads": heads,
                                "head_size": head_size,
                                "backends": [str(b) for b in order],
                            }
                        )
    return {
        "source": f"{CUDA_PLATFORM}::_get_backend_priorities",
        "parameters": params,
        "cases": cases,
    }


# ------------------------------------------------------------------------------------------
# MLA model types, KV dtypes, quantization, flags


def mla_model_types(wheel: WheelSource) -> dict[str, Any]:
    """The model types of ``is_deepseek_mla`` (the definition holding the literal list)."""
    for file in wheel.names():
        if not file.startswith(("vllm/config", "vllm/transformers_utils")):
            continue
        for node in ast.walk(wheel.tree(file)):
            if isinstance(node, ast.FunctionDef) and node.name == "is_deepseek_mla":
                found = _model_type_lists(node)
                if found:
                    main, eagle, condition = found
                    return {
                        "types": main,
                        "eagle_types": eagle,
                        "condition": condition,
                        "file": file,
                    }
    return {"types": [], "eagle_types": [], "condition": None, "file": None}


def _model_type_lists(fn: ast.FunctionDef) -> tuple[list[str], list[str], str] | None:
    main: list[str] | None = None
    eagle: list[str] = []
    condition = ""
    for node in ast.walk(fn):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Compare):
            comp = node.test
            if isinstance(comp.ops[0], ast.In) and "model_type" in ast.unparse(comp.left):
                try:
                    values = literal(comp.comparators[0])
                except Unresolved:
                    continue
                if main is None and all(isinstance(v, str) for v in values):
                    main = list(values)
                    condition = " ".join(" ".join(ast.unparse(s).split()) for s in node.body)[:400]
        if isinstance(node, ast.Compare) and isinstance(node.ops[0], ast.In):
            left = ast.unparse(node.left)
            if ".model.model_type" in left:
                try:
                    eagle = list(literal(node.comparators[0]))
                except Unresolved:
                    pass
    return (main, eagle, condition) if main else None


def top_level_assign(
    wheel: WheelSource, name: str, prefixes: tuple[str, ...]
) -> tuple[ast.AST, str]:
    for file in wheel.names():
        if not file.startswith(prefixes):
            continue
        for node in wheel.tree(file).body:
            targets: list[ast.expr] = []
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, ast.AnnAssign) and node.value is not None:
                targets = [node.target]
            else:
                continue
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                assert node.value is not None
                return node.value, file
    raise Unresolved(f"{name} not found")


def kv_cache_dtypes(wheel: WheelSource) -> dict[str, Any]:
    out: dict[str, Any] = {}
    try:
        node, file = top_level_assign(wheel, "CacheDType", ("vllm/config",))
        assert isinstance(node, ast.Subscript)
        out["cache_dtype_literal"] = {"values": list(literal(node.slice)), "file": file}
    except (Unresolved, AssertionError):
        out["cache_dtype_literal"] = None
    try:
        node, file = top_level_assign(wheel, "STR_DTYPE_TO_TORCH_DTYPE", ("vllm/utils",))
        assert isinstance(node, ast.Dict)
        mapping = {
            literal(k): ast.unparse(v) for k, v in zip(node.keys, node.values, strict=True) if k
        }
        out["str_dtype_to_torch_dtype"] = {"values": mapping, "file": file}
    except (Unresolved, AssertionError):
        out["str_dtype_to_torch_dtype"] = None
    try:
        node, file = top_level_assign(
            wheel, "MODELOPT_TO_VLLM_KV_CACHE_DTYPE_MAP", ("vllm/utils", "vllm/model_executor")
        )
        out["modelopt_to_vllm"] = {"values": literal(node), "file": file}
    except Unresolved:
        out["modelopt_to_vllm"] = None
    return out


def quantization_methods(wheel: WheelSource) -> dict[str, Any]:
    """``get_name()`` -> ``get_min_capability()`` of each quantization config class."""
    out: dict[str, Any] = {}
    for file in wheel.names():
        if not file.startswith(QUANT_DIR):
            continue
        for node in wheel.tree(file).body:
            if not isinstance(node, ast.ClassDef):
                continue
            chain = mro(wheel, ClassRef(file, node))
            name_def = class_attr(chain, "get_name")
            cap_def = class_attr(chain, "get_min_capability")
            if not name_def or not cap_def or name_def[1].node is not node:
                continue
            try:
                name = returned_literal(name_def[0])
            except Unresolved:
                continue
            if not isinstance(name, str) or name in out:
                continue
            fn, ref = cap_def
            try:
                value = returned_literal(fn)
            except Unresolved:
                value = None
            out[name] = {
                "min_capability": value,
                "expression": body_text(fn) if value is None else None,
                "class": node.name,
                "file": ref.file,
            }
    return dict(sorted(out.items()))


def frontend_files(wheel: WheelSource) -> list[str]:
    """Where the release defines its frontend flags: ``FrontendArgs`` moved from
    vllm/entrypoints/openai/cli_args.py to vllm/entrypoints/launchers/cli_args.py (0.29.0) and
    vllm/entrypoints/common/cli_args.py (0.34.0); found by the class, not by the path."""
    found = []
    for file in wheel.names():
        if not file.startswith("vllm/entrypoints/") or not file.endswith("/cli_args.py"):
            continue
        if any(
            isinstance(node, ast.ClassDef) and node.name == "FrontendArgs"
            for node in wheel.tree(file).body
        ):
            found.append(file)
    return found


def serve_flags(wheel: WheelSource) -> dict[str, Any]:
    flags: dict[str, str] = {}
    boolean: set[str] = set()
    files = list(SERVE_FLAG_FILES)
    files += [f for f in frontend_files(wheel) if f not in files]
    for file in files:
        if not wheel.has(file):
            continue
        tree = wheel.tree(file)
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "add_argument"
            ):
                for arg in node.args:
                    if isinstance(arg, ast.Constant) and str(arg.value).startswith("-"):
                        flags.setdefault(str(arg.value), f"{file} add_argument")
            if isinstance(node, ast.ClassDef) and node.name in FLAG_DATACLASSES:
                for stmt in node.body:
                    if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                        field = stmt.target.id
                        if field.startswith("_"):
                            continue
                        flag = "--" + field.replace("_", "-")
                        flags.setdefault(flag, f"{file} {node.name}.{field}")
                        if _is_boolean_annotation(stmt.annotation):
                            boolean.add(flag)
            if isinstance(node, ast.Call) and _is_boolean_optional_call(node):
                boolean.update(
                    str(a.value)
                    for a in node.args
                    if isinstance(a, ast.Constant) and str(a.value).startswith("--")
                )
    inverse_prefixes = enable_disable_prefixes(wheel)
    for flag in sorted(boolean):
        for prefix, inverse in inverse_prefixes.items():
            if flag.startswith(prefix):
                flags.setdefault(
                    inverse + flag.removeprefix(prefix),
                    f"{ARGPARSE_UTILS} EnableDisableAction (the inverse of {flag})",
                )
    return {
        "flags": dict(sorted(flags.items())),
        "note": (
            "literal add_argument options plus the fields of "
            + ", ".join(FLAG_DATACLASSES)
            + " (each becomes --field-name); boolean fields also get --no-field-name"
            + (
                "; boolean --enable-x/--disable-x flags also get their inverse"
                " (EnableDisableAction)"
                if inverse_prefixes
                else ""
            )
        ),
    }


def _is_boolean_annotation(annotation: ast.expr) -> bool:
    """A field vLLM's get_kwargs turns into a BooleanOptionalAction (vllm/engine/arg_utils.py:
    ``contains_type(type_hints, bool)``; ``bool | str | None`` is an optional-valued flag)."""
    names = {n.id for n in ast.walk(annotation) if isinstance(n, ast.Name)}
    return "bool" in names and "str" not in names


def _is_boolean_optional_call(node: ast.Call) -> bool:
    return (
        isinstance(node.func, ast.Attribute)
        and node.func.attr == "add_argument"
        and any(
            kw.arg == "action" and ast.unparse(kw.value).endswith("BooleanOptionalAction")
            for kw in node.keywords
        )
    )


def enable_disable_prefixes(wheel: WheelSource) -> dict[str, str]:
    """``{"--enable-": "--disable-", ...}`` when the release's FlexibleArgumentParser
    registers ``EnableDisableAction`` for BooleanOptionalAction (from 0.33.0,
    vllm/utils/argparse_utils.py), which gives ``--enable-x`` a ``--disable-x`` and the
    reverse: 0.33.0 accepts ``--disable-log-requests`` again this way. Empty before."""
    if not wheel.has(ARGPARSE_UTILS):
        return {}
    tree = wheel.tree(ARGPARSE_UTILS)
    registered = any(
        isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and n.func.attr == "register"
        and any(isinstance(a, ast.Name) and a.id == "EnableDisableAction" for a in n.args)
        for n in ast.walk(tree)
    )
    if not registered:
        return {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == "EnableDisableAction":
            for stmt in node.body:
                if (
                    isinstance(stmt, ast.Assign)
                    and isinstance(stmt.targets[0], ast.Name)
                    and stmt.targets[0].id == "_inverse_prefixes"
                ):
                    return dict(literal(stmt.value))
    raise Unresolved(f"{ARGPARSE_UTILS}: EnableDisableAction has no _inverse_prefixes")


# ------------------------------------------------------------------------------------------
# Prometheus metrics

METRICS_DIR = "vllm/v1/metrics/"
METRIC_TYPES = ("gauge", "counter", "histogram")
DEPRECATED_FOR = re.compile(r"DEPRECATED[:.]?\s*(?:Use|Replaced by|Renamed as)\s+(vllm:\w+)", re.I)


def metrics(wheel: WheelSource) -> dict[str, Any]:
    """The metrics the release's V1 stat loggers create, by metric name."""
    found: dict[str, Any] = {}
    files = [f for f in wheel.names() if f.startswith(METRICS_DIR)]
    for file in files:
        tree = wheel.tree(file)
        named = _names_assigned(tree)
        for call, conditions in _calls_with_conditions(tree, ()):
            for name, kind, documentation in _metrics_of(call, named):
                if name in found:
                    continue
                replacement = DEPRECATED_FOR.search(documentation)
                found[name] = {
                    "type": kind,
                    "samples": exported_samples(name, kind),
                    "hidden": any("show_hidden_metrics" in c for c in conditions),
                    "deprecated_for": replacement.group(1) if replacement else None,
                    "file": file,
                }
    return {"source": METRICS_DIR + "*.py", "metrics": dict(sorted(found.items()))}


def exported_samples(name: str, kind: str) -> list[str]:
    """The sample names prometheus_client exposes for a metric: a counter's family drops a
    ``_total`` suffix and its sample adds it back; a histogram has buckets, sum and count."""
    if kind == "counter":
        return [name.removesuffix("_total") + "_total"]
    if kind == "histogram":
        return [f"{name}_bucket", f"{name}_count", f"{name}_sum"]
    return [name]


def _calls_with_conditions(
    node: ast.AST, conditions: tuple[str, ...]
) -> Iterator[tuple[ast.Call, tuple[str, ...]]]:
    """Every call under ``node`` with the ``if`` tests it is nested in (``not (t)`` in an
    ``else``)."""
    if isinstance(node, ast.If):
        test = ast.unparse(node.test)
        yield from _calls_with_conditions(node.test, conditions)
        for stmt in node.body:
            yield from _calls_with_conditions(stmt, (*conditions, test))
        for stmt in node.orelse:
            yield from _calls_with_conditions(stmt, (*conditions, f"not ({test})"))
        return
    if isinstance(node, ast.Call):
        yield node, conditions
    for child in ast.iter_child_nodes(node):
        yield from _calls_with_conditions(child, conditions)


def _names_assigned(tree: ast.Module) -> dict[str, list[str]]:
    """Each variable assigned a ``"vllm:..."`` string anywhere in the module, with its values:
    ``log_metrics_info`` picks its metric's name by branch (``name = "vllm:cache_config_info"``)
    and passes ``name=name``."""
    named: dict[str, list[str]] = {}
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Constant)
            and str(node.value.value).startswith("vllm:")
        ):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    named.setdefault(target.id, []).append(str(node.value.value))
    return named


def _metrics_of(call: ast.Call, named: dict[str, list[str]]) -> list[tuple[str, str, str]]:
    """(name, type, documentation) of each metric a call may create: none for a call that
    creates no metric, one per value of a ``name=`` variable (:func:`_names_assigned`)."""
    keywords = {kw.arg: kw.value for kw in call.keywords if kw.arg}
    name = keywords.get("name")
    if isinstance(name, ast.Constant) and str(name.value).startswith("vllm:"):
        names = [str(name.value)]
    elif isinstance(name, ast.Name):
        names = named.get(name.id, [])
    else:
        return []
    callee = ast.unparse(call.func).lower().rpartition(".")[2]
    kind = next((t for t in METRIC_TYPES if t in callee), None)
    if kind is None or not names:
        return []
    documentation = keywords.get("documentation")
    try:
        text = literal(documentation) if documentation is not None else ""
    except Unresolved:
        text = ast.unparse(documentation) if documentation is not None else ""
    return [(n, kind, str(text)) for n in names]


# ------------------------------------------------------------------------------------------
# Environment variables

ENVS_FILE = "vllm/envs.py"
ENVS_TABLE = "environment_variables"


def env_vars(wheel: WheelSource) -> dict[str, Any]:
    """The keys of ``environment_variables`` in vllm/envs.py: the variables vLLM reads."""
    if not wheel.has(ENVS_FILE):
        raise Unresolved(f"{ENVS_FILE} absent")
    for node in wheel.tree(ENVS_FILE).body:
        target = node.target if isinstance(node, ast.AnnAssign) else None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
        value = getattr(node, "value", None)
        if isinstance(target, ast.Name) and target.id == ENVS_TABLE and isinstance(value, ast.Dict):
            names = {literal(k) for k in value.keys if k is not None}
            return {"source": f"{ENVS_FILE} {ENVS_TABLE}", "names": sorted(map(str, names))}
    raise Unresolved(f"{ENVS_FILE} has no {ENVS_TABLE} dict")


# ------------------------------------------------------------------------------------------
# One release


def release_facts(wheel: WheelSource) -> dict[str, Any]:
    sections: dict[str, Any] = {}
    for key, fn in (
        ("attention_backends", attention_backends),
        ("backend_priorities", backend_priorities),
        ("mla_model_types", mla_model_types),
        ("kv_cache_dtypes", kv_cache_dtypes),
        ("quantization_methods", quantization_methods),
        ("serve_flags", serve_flags),
        ("metrics", metrics),
        ("env_vars", env_vars),
    ):
        try:
            sections[key] = fn(wheel)
        except Unresolved as e:
            sections[key] = {"error": f"not extracted: {str(e)[:300]}"}
    return {
        "schema": SCHEMA,
        "vllm_version": wheel.version,
        "wheel": wheel.path.name,
        "wheel_sha256": wheel.sha256(),
        "capabilities_evaluated": [cap_text(c) for c in CAPABILITIES],
        **sections,
    }


def dumps(data: Any) -> str:
    return json.dumps(data, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def version_key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version)[:3])


def release_wheels(directory: Path) -> Iterator[Path]:
    """One wheel per release (a build-tagged re-upload such as ``0.21.0-1`` counts once),
    oldest first. Every release is kept, not only the latest patch: a deployment on 0.18.0
    must not be judged by 0.17.1's facts when 0.18.0's are at hand."""
    chosen: dict[tuple[int, ...], Path] = {}
    for path in sorted(directory.glob("vllm-*.whl")):
        chosen.setdefault(version_key(path.name.split("-")[1]), path)
    for _, path in sorted(chosen.items()):
        yield path


def write_release(wheel_path: Path, out: Path) -> dict[str, str]:
    wheel = WheelSource(wheel_path)
    data = release_facts(wheel)
    target = out / f"{wheel.version}.json"
    target.write_text(dumps(data), encoding="utf-8")
    return {
        "version": wheel.version,
        "file": target.name,
        "wheel": wheel_path.name,
        "wheel_sha256": data["wheel_sha256"],
    }


def write_index(out: Path) -> None:
    releases = []
    for path in sorted(out.glob("*.json"), key=lambda p: version_key(p.stem)):
        if path.name == "index.json":
            continue
        data = json.loads(path.read_text(encoding="utf-8"))
        releases.append(
            {
                "version": data["vllm_version"],
                "file": path.name,
                "wheel": data["wheel"],
                "wheel_sha256": data["wheel_sha256"],
                # Copied here so that a checkpoint is read (in every release's terms) without
                # parsing every release's file: opsbook.knowledge.vllm_facts.every_release_*.
                "mla_model_types": (data.get("mla_model_types") or {}).get("types") or [],
                "modelopt_kv_map": ((data.get("kv_cache_dtypes") or {}).get("modelopt_to_vllm") or {})
                .get("values")
                or {},
            }
        )
    index = {
        "schema": SCHEMA,
        "tool": "tools/vllm_facts.py",
        "note": "facts read from vLLM release wheels with zipfile + ast; one file per release",
        "releases": releases,
    }
    (out / "index.json").write_text(dumps(index), encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--wheels", type=Path, help="folder of vllm-X-*.whl")
    parser.add_argument("--wheel", type=Path, help="one wheel: print its facts to stdout")
    parser.add_argument("--out", type=Path, default=Path("opsbook/knowledge/data/vllm_facts"))
    parser.add_argument("--version", action="append", help="only these releases (repeatable)")
    args = parser.parse_args(argv)
    if args.wheel:
        sys.stdout.write(dumps(release_facts(WheelSource(args.wheel))))
        return 0
    if not args.wheels or not args.wheels.is_dir():
        parser.error("--wheels must name a folder of vLLM wheels (pip download vllm==X --no-deps)")
    args.out.mkdir(parents=True, exist_ok=True)
    for path in release_wheels(args.wheels):
        version = path.name.split("-")[1]
        if args.version and version not in args.version:
            continue
        entry = write_release(path, args.out)
        print(f"{entry['version']}: {args.out / entry['file']}", file=sys.stderr)
    write_index(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
