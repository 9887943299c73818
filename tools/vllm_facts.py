#!/usr/bin/env python3
"""Extract facts about vLLM from its release wheels, without importing vLLM.

A maintainer tool (not part of the installed package). For each wheel
``vllm-X-*.whl`` it reads the Python sources with :mod:`zipfile` and :mod:`ast` and writes
``opsbook/data/vllm_facts/<X>.json`` plus ``index.json``:

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
  the dataclass fields that EngineArgs / FrontendArgs turn into flags).

Every fact records the wheel file it came from. The output is deterministic: re-running the
tool on the same wheel reproduces the file byte for byte.

Usage::

    python tools/vllm_facts.py --wheels /work/cache/vllm-wheels --out opsbook/data/vllm_facts
    python tools/vllm_facts.py --wheels DIR --out DIR --version 0.33.0
    python tools/vllm_facts.py --wheel FILE.whl            # print one release's JSON
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import re
import sys
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
REGISTRY_FILES = (
    "vllm/v1/attention/backends/registry.py",
    "vllm/attention/backends/registry.py",
)
BACKEND_DIRS = ("vllm/v1/attention/backends/",)
CUDA_PLATFORM = "vllm/platforms/cuda.py"
QUANT_DIR = "vllm/model_executor/layers/quantization/"
SERVE_FLAG_FILES = (
    "vllm/engine/arg_utils.py",
    "vllm/entrypoints/openai/cli_args.py",
    "vllm/entrypoints/cli/serve.py",
)
FLAG_DATACLASSES = ("EngineArgs", "AsyncEngineArgs", "FrontendArgs", "BaseFrontendArgs")


class Unresolved(Exception):
    """An expression the small interpreter does not understand."""


def cap_text(cap: tuple[int, int]) -> str:
    return f"{cap[0]}.{cap[1]}"


# ------------------------------------------------------------------------------------------
# The wheel


@dataclass
class Wheel:
    path: Path
    zf: zipfile.ZipFile
    version: str
    _trees: dict[str, ast.Module]

    @classmethod
    def open(cls, path: Path) -> Wheel:
        zf = zipfile.ZipFile(path)
        return cls(path, zf, wheel_version(path, zf), {})

    def names(self) -> list[str]:
        return sorted(n for n in self.zf.namelist() if n.endswith(".py"))

    def has(self, name: str) -> bool:
        try:
            self.zf.getinfo(name)
        except KeyError:
            return False
        return True

    def tree(self, name: str) -> ast.Module:
        if name not in self._trees:
            self._trees[name] = ast.parse(self.zf.read(name).decode("utf-8"), filename=name)
        return self._trees[name]

    def module_file(self, dotted: str) -> str | None:
        base = dotted.replace(".", "/")
        for name in (f"{base}.py", f"{base}/__init__.py"):
            if self.has(name):
                return name
        return None

    def sha256(self) -> str:
        return hashlib.sha256(self.path.read_bytes()).hexdigest()


def wheel_version(path: Path, zf: zipfile.ZipFile) -> str:
    """The release from the dist-info directory name (``vllm-0.33.0.dist-info``)."""
    for name in zf.namelist():
        m = re.match(r"vllm-([^/]+)\.dist-info/METADATA$", name)
        if m:
            return m.group(1)
    return path.name.split("-")[1]


# ------------------------------------------------------------------------------------------
# Classes across modules


@dataclass
class ClassRef:
    file: str
    node: ast.ClassDef


def module_of(file: str) -> str:
    return file[:-3].removesuffix("/__init__").replace("/", ".")


def find_class(wheel: Wheel, file: str, name: str, depth: int = 0) -> ClassRef | None:
    """The class ``name`` as seen from module ``file``: defined there or imported into it."""
    if depth > 6 or not wheel.has(file):
        return None
    tree = wheel.tree(file)
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return ClassRef(file, node)
    for found_node in ast.walk(tree):
        if isinstance(found_node, ast.ImportFrom) and found_node.module:
            for alias in found_node.names:
                if (alias.asname or alias.name) == name:
                    target = resolve_relative(file, found_node)
                    src = wheel.module_file(target) if target else None
                    if src:
                        found = find_class(wheel, src, alias.name, depth + 1)
                        if found:
                            return found
    return None


def resolve_relative(file: str, node: ast.ImportFrom) -> str | None:
    if not node.level:
        return node.module
    parts = module_of(file).split(".")
    if not file.endswith("__init__.py"):
        parts = parts[:-1]
    parts = parts[: len(parts) - (node.level - 1)] if node.level > 1 else parts
    return ".".join(parts + ([node.module] if node.module else []))


def mro(wheel: Wheel, ref: ClassRef) -> list[ClassRef]:
    """The class and its bases, depth first, left to right (enough for these hierarchies)."""
    out: list[ClassRef] = []
    seen: set[tuple[str, str]] = set()

    def visit(r: ClassRef) -> None:
        key = (r.file, r.node.name)
        if key in seen:
            return
        seen.add(key)
        out.append(r)
        for base in r.node.bases:
            name = base.id if isinstance(base, ast.Name) else None
            if isinstance(base, ast.Subscript) and isinstance(base.value, ast.Name):
                name = base.value.id
            if isinstance(base, ast.Attribute):
                name = base.attr
            if name and name not in ("object", "ABC", "Generic", "Enum"):
                found = find_class(wheel, r.file, name)
                if found:
                    visit(found)

    visit(ref)
    return out


def class_attr(chain: list[ClassRef], attr: str) -> tuple[ast.AST, ClassRef] | None:
    """The first definition of ``attr`` (assignment value or method) along the MRO."""
    for ref in chain:
        for node in ref.node.body:
            if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == attr for t in node.targets
            ):
                return node.value, ref
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and node.target.id == attr
                and node.value is not None
            ):
                return node.value, ref
            if isinstance(node, ast.FunctionDef) and node.name == attr:
                return node, ref
    return None


def literal(node: ast.AST) -> Any:
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        raise Unresolved(ast.unparse(node)) from None


def returned_literal(fn: ast.AST) -> Any:
    """The literal a method returns when its body is (docstring +) ``return <literal>``."""
    if not isinstance(fn, ast.FunctionDef):
        raise Unresolved(ast.unparse(fn))
    body = [s for s in fn.body if not _is_docstring(s)]
    if len(body) == 1 and isinstance(body[0], ast.Return) and body[0].value is not None:
        return literal(body[0].value)
    raise Unresolved(ast.unparse(fn))


def _is_docstring(stmt: ast.stmt) -> bool:
    return (
        isinstance(stmt, ast.Expr)
        and isinstance(stmt.value, ast.Constant)
        and isinstance(stmt.value.value, str)
    )


# ------------------------------------------------------------------------------------------
# A tiny interpreter for capability checks and the priority function


class Cap(tuple):
    """vLLM's DeviceCapability: a (major, minor) named tuple with to_int()."""

    @property
    def major(self) -> int:
        return int(self[0])

    @property
    def minor(self) -> int:
        return int(self[1])

    def to_int(self) -> int:
        return self.major * 10 + self.minor

    def as_version_str(self) -> str:
        return f"{self.major}.{self.minor}"


class EnumMember(str):
    """``AttentionBackendEnum.X`` evaluates to the member name."""


def is_quantized(kv: Any) -> bool:
    # The inputs fed in are "auto" and "fp8_e4m3"; every release's is_quantized_kv_cache
    # (startswith("fp8") ... ) agrees on those two.
    return kv is not None and str(kv).startswith("fp8")


class Interp:
    def __init__(self, env: dict[str, Any], capability: Cap | None = None):
        self.env = dict(env)
        self.capability = capability

    # statements -----------------------------------------------------------------------
    def run(self, body: list[ast.stmt]) -> Any:
        for stmt in body:
            done, value = self.step(stmt)
            if done:
                return value
        return None

    def step(self, stmt: ast.stmt) -> tuple[bool, Any]:
        if isinstance(stmt, ast.Return):
            return True, self.ev(stmt.value) if stmt.value is not None else None
        if isinstance(stmt, ast.If):
            branch = stmt.body if self.ev(stmt.test) else stmt.orelse
            for inner in branch:
                done, value = self.step(inner)
                if done:
                    return True, value
            return False, None
        if isinstance(stmt, ast.Assign) and all(isinstance(t, ast.Name) for t in stmt.targets):
            value = self.ev(stmt.value)
            for t in stmt.targets:
                assert isinstance(t, ast.Name)
                self.env[t.id] = value
            return False, None
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value:
            self.env[stmt.target.id] = self.ev(stmt.value)
            return False, None
        if isinstance(stmt, (ast.Import, ast.ImportFrom, ast.Pass)) or _is_docstring(stmt):
            return False, None
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
            self.ev(stmt.value)
            return False, None
        raise Unresolved(ast.unparse(stmt))

    # expressions ----------------------------------------------------------------------
    def ev(self, node: ast.AST) -> Any:
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            if node.id in self.env:
                return self.env[node.id]
            if node.id in ("True", "False", "None"):
                return {"True": True, "False": False, "None": None}[node.id]
            raise Unresolved(node.id)
        if isinstance(node, ast.Attribute):
            if isinstance(node.value, ast.Name) and node.value.id.endswith(
                ("AttentionBackendEnum", "_Backend")
            ):
                return EnumMember(node.attr)
            base = self.ev(node.value)
            if isinstance(base, Cap) and node.attr in ("major", "minor"):
                return getattr(base, node.attr)
            raise Unresolved(ast.unparse(node))
        if isinstance(node, (ast.List, ast.Tuple)):
            out: list[Any] = []
            for elt in node.elts:
                if isinstance(elt, ast.Starred):
                    out.extend(self.ev(elt.value))
                else:
                    out.append(self.ev(elt))
            return out if isinstance(node, ast.List) else tuple(out)
        if isinstance(node, ast.BoolOp):
            if isinstance(node.op, ast.And):
                result: Any = True
                for v in node.values:
                    result = self.ev(v)
                    if not result:
                        return result
                return result
            for v in node.values:
                result = self.ev(v)
                if result:
                    return result
            return result
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            return not self.ev(node.operand)
        if isinstance(node, ast.IfExp):
            return self.ev(node.body) if self.ev(node.test) else self.ev(node.orelse)
        if isinstance(node, ast.Compare):
            left = self.ev(node.left)
            for op, comp in zip(node.ops, node.comparators, strict=True):
                right = self.ev(comp)
                if not compare(op, left, right):
                    return False
                left = right
            return True
        if isinstance(node, ast.Call):
            return self.call(node)
        raise Unresolved(ast.unparse(node))

    def call(self, node: ast.Call) -> Any:
        fn = node.func
        args = [self.ev(a) for a in node.args]
        if isinstance(fn, ast.Name):
            if fn.id == "is_quantized_kv_cache":
                return is_quantized(args[0])
            if fn.id == "DeviceCapability":
                kw = {k.arg: self.ev(k.value) for k in node.keywords}
                values = args + [kw.get("major"), kw.get("minor", 0)][len(args) :]
                return Cap((int(values[0]), int(values[1] or 0)))
        if isinstance(fn, ast.Attribute):
            owner = fn.value
            if isinstance(owner, ast.Name) and owner.id == "current_platform":
                if fn.attr == "is_cuda":
                    return True
                if fn.attr in ("is_rocm", "is_xpu", "is_cpu", "is_tpu"):
                    return False
                if fn.attr == "has_device_capability" and self.capability is not None:
                    return self.capability.to_int() >= int(args[0])
                if fn.attr == "is_device_capability" and self.capability is not None:
                    return self.capability.to_int() == int(args[0])
                if fn.attr == "get_device_capability" and self.capability is not None:
                    return self.capability
            target = self.ev(owner)
            if isinstance(target, Cap) and fn.attr in ("to_int", "as_version_str"):
                return getattr(target, fn.attr)()
            if isinstance(target, str) and fn.attr in ("startswith", "endswith"):
                return getattr(target, fn.attr)(*args)
            if isinstance(target, list) and fn.attr in ("insert", "append", "extend", "remove"):
                getattr(target, fn.attr)(*args)
                return None
        raise Unresolved(ast.unparse(node))


def compare(op: ast.cmpop, left: Any, right: Any) -> bool:
    ops = {
        ast.Eq: lambda a, b: a == b,
        ast.NotEq: lambda a, b: a != b,
        ast.Lt: lambda a, b: a < b,
        ast.LtE: lambda a, b: a <= b,
        ast.Gt: lambda a, b: a > b,
        ast.GtE: lambda a, b: a >= b,
        ast.In: lambda a, b: a in b,
        ast.NotIn: lambda a, b: a not in b,
        ast.Is: lambda a, b: a is b,
        ast.IsNot: lambda a, b: a is not b,
    }
    fn = ops.get(type(op))
    if fn is None:
        raise Unresolved(type(op).__name__)
    return bool(fn(left, right))


def call_with(fn: ast.FunctionDef, values: dict[str, Any], capability: Cap | None) -> Any:
    """Run ``fn`` with parameters bound from ``values`` (others take their default)."""
    env: dict[str, Any] = {}
    params = fn.args.args + fn.args.kwonlyargs
    defaults: list[ast.expr | None] = [None] * (len(fn.args.args) - len(fn.args.defaults))
    defaults += list(fn.args.defaults) + list(fn.args.kw_defaults)
    for param, default in zip(params, defaults, strict=True):
        if param.arg in values:
            env[param.arg] = values[param.arg]
        elif default is not None:
            env[param.arg] = literal(default)
        elif param.arg not in ("cls", "self"):
            raise Unresolved(f"no value for parameter {param.arg}")
    return Interp(env, capability).run(fn.body)


# ------------------------------------------------------------------------------------------
# Attention backends


def backend_registry(wheel: Wheel) -> tuple[dict[str, str], str | None]:
    """Backend name -> ``module.Class`` from ``AttentionBackendEnum`` (0.11+)."""
    for file in REGISTRY_FILES:
        if not wheel.has(file):
            continue
        for node in wheel.tree(file).body:
            if isinstance(node, ast.ClassDef) and node.name == "AttentionBackendEnum":
                out = {}
                for stmt in node.body:
                    if isinstance(stmt, ast.Assign) and isinstance(stmt.targets[0], ast.Name):
                        try:
                            value = literal(stmt.value)
                        except Unresolved:
                            continue
                        if isinstance(value, str) and value:
                            out[stmt.targets[0].id] = value
                return out, file
    return {}, None


def legacy_backends(wheel: Wheel) -> dict[str, str]:
    """Releases without the registry: classes whose ``get_name()`` returns a literal."""
    claims: dict[str, list[ClassRef]] = {}
    for file in wheel.names():
        if not file.startswith(BACKEND_DIRS):
            continue
        for node in wheel.tree(file).body:
            if not isinstance(node, ast.ClassDef):
                continue
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == "get_name":
                    try:
                        name = returned_literal(item)
                    except Unresolved:
                        continue
                    if isinstance(name, str):
                        claims.setdefault(name, []).append(ClassRef(file, node))
    return {
        name: f"{module_of(ref.file)}.{ref.node.name}"
        for name, ref in ((n, _leaf(wheel, refs)) for n, refs in claims.items())
    }


def _leaf(wheel: Wheel, refs: list[ClassRef]) -> ClassRef:
    """Of classes claiming one name (a base and its subclass), the subclass."""
    for ref in refs:
        ancestors = {(r.file, r.node.name) for r in mro(wheel, ref)}
        if all((o.file, o.node.name) in ancestors for o in refs):
            return ref
    return refs[0]


def backend_facts(wheel: Wheel, classpath: str) -> dict[str, Any]:
    module, _, cls_name = classpath.rpartition(".")
    file = wheel.module_file(module)
    ref = find_class(wheel, file, cls_name) if file else None
    if ref is None:
        return {"class": classpath, "error": "class not found in the wheel"}
    chain = mro(wheel, ref)
    facts: dict[str, Any] = {"class": classpath, "file": ref.file}
    facts["kv_cache_dtypes"] = _attr_literal(chain, "supported_kv_cache_dtypes")
    facts["head_sizes"] = _attr_literal(chain, "get_supported_head_sizes")
    facts["is_mla"] = _attr_literal(chain, "is_mla")
    facts["is_sparse"] = _attr_literal(chain, "is_sparse")
    facts["compute_capability"] = _capability_gate(chain)
    facts["fp8_kv_gates"] = fp8_gates(wheel, ref.file)
    return facts


def _attr_literal(chain: list[ClassRef], attr: str) -> dict[str, Any] | None:
    found = class_attr(chain, attr)
    if found is None:
        return None
    node, ref = found
    try:
        value = returned_literal(node) if isinstance(node, ast.FunctionDef) else literal(node)
    except Unresolved as e:
        return {"value": None, "unresolved": str(e)[:300], "file": ref.file}
    return {"value": value, "file": ref.file, "defined_in": ref.node.name}


def _capability_gate(chain: list[ClassRef]) -> dict[str, Any] | None:
    found = class_attr(chain, "supports_compute_capability")
    if found is None or not isinstance(found[0], ast.FunctionDef):
        return None
    fn, ref = found
    assert isinstance(fn, ast.FunctionDef)
    param = fn.args.args[-1].arg
    supported: list[str] = []
    try:
        for cap in CAPABILITIES:
            c = Cap(cap)
            if call_with(fn, {param: c}, c):
                supported.append(cap_text(cap))
    except Unresolved as e:
        return {
            "supported": None,
            "unresolved": str(e)[:300],
            "expression": _body_text(fn),
            "file": ref.file,
            "defined_in": ref.node.name,
        }
    return {
        "supported": supported,
        "expression": _body_text(fn),
        "file": ref.file,
        "defined_in": ref.node.name,
    }


def _body_text(fn: ast.AST) -> str:
    if not isinstance(fn, ast.FunctionDef):
        return ast.unparse(fn)[:400]
    body = [s for s in fn.body if not _is_docstring(s)]
    return " ".join(" ".join(ast.unparse(s).split()) for s in body)[:400]


FP8_NOT_SUPPORTED = re.compile(r"FP8 KV cache not yet supported|fp8 kv cache.*not supported", re.I)


def fp8_gates(wheel: Wheel, file: str) -> list[dict[str, Any]]:
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


def attention_backends(wheel: Wheel) -> dict[str, Any]:
    registry, source = backend_registry(wheel)
    if not registry:
        registry, source = legacy_backends(wheel), "get_name() of classes under " + BACKEND_DIRS[0]
    backends = {name: backend_facts(wheel, path) for name, path in sorted(registry.items())}
    return {"source": source, "backends": backends}


# ------------------------------------------------------------------------------------------
# Priorities


def backend_priorities(wheel: Wheel) -> dict[str, Any]:
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


def mla_model_types(wheel: Wheel) -> dict[str, Any]:
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


def top_level_assign(wheel: Wheel, name: str, prefixes: tuple[str, ...]) -> tuple[ast.AST, str]:
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


def kv_cache_dtypes(wheel: Wheel) -> dict[str, Any]:
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


def quantization_methods(wheel: Wheel) -> dict[str, Any]:
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
                "expression": _body_text(fn) if value is None else None,
                "class": node.name,
                "file": ref.file,
            }
    return dict(sorted(out.items()))


def serve_flags(wheel: Wheel) -> dict[str, Any]:
    flags: dict[str, str] = {}
    for file in SERVE_FLAG_FILES:
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
    return {
        "flags": dict(sorted(flags.items())),
        "note": (
            "literal add_argument options plus the fields of "
            + ", ".join(FLAG_DATACLASSES)
            + " (each becomes --field-name); boolean fields also get --no-field-name"
        ),
    }


# ------------------------------------------------------------------------------------------
# One release


def release_facts(wheel: Wheel) -> dict[str, Any]:
    sections: dict[str, Any] = {}
    for key, fn in (
        ("attention_backends", attention_backends),
        ("backend_priorities", backend_priorities),
        ("mla_model_types", mla_model_types),
        ("kv_cache_dtypes", kv_cache_dtypes),
        ("quantization_methods", quantization_methods),
        ("serve_flags", serve_flags),
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
    wheel = Wheel.open(wheel_path)
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
    parser.add_argument("--out", type=Path, default=Path("opsbook/data/vllm_facts"))
    parser.add_argument("--version", action="append", help="only these releases (repeatable)")
    args = parser.parse_args(argv)
    if args.wheel:
        sys.stdout.write(dumps(release_facts(Wheel.open(args.wheel))))
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
