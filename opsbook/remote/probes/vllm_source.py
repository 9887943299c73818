"""vLLM's source, read without importing vLLM: one reader for release wheels and installs.

Stdlib only (``ast``, ``zipfile``), so it serves three readers with one implementation: the
maintainer tools ``tools/vllm_facts.py`` and ``tools/vllm_error_formats.py`` (release wheels),
and the ``backends`` probe, which sends this file to a host and runs it with the deployment's
interpreter over the *installed* vLLM's files (``import vllm`` costs 10-25 s there: torch and
every platform module; parsing the few files the selection needs costs well under a second).

:func:`select` answers the question the probe asks -- which attention backend the release's
own ``_get_backend_priorities`` (vllm/platforms/cuda.py) lists for a model and compute
capability, and which of them the static checks of ``AttentionBackend.validate_configuration``
(vllm/v1/attention/backend.py) reject -- in the same shape as the answer of the importing
reader, so a test can hold the two equal on a real install.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import os
import re
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REGISTRY_FILES = (
    "vllm/v1/attention/backends/registry.py",
    "vllm/attention/backends/registry.py",
)
BACKEND_DIRS = ("vllm/v1/attention/backends/",)
CUDA_PLATFORM = "vllm/platforms/cuda.py"


class Unresolved(Exception):
    """An expression the small interpreter does not understand."""


def cap_text(cap: tuple[int, int]) -> str:
    return f"{cap[0]}.{cap[1]}"


# ------------------------------------------------------------------------------------------
# Where the source lies: a release wheel or an installed package


class Source:
    """Python files by their path inside site-packages (``vllm/platforms/cuda.py``)."""

    def __init__(self) -> None:
        self._trees: dict[str, ast.Module] = {}

    def names(self) -> list[str]:
        raise NotImplementedError

    def has(self, name: str) -> bool:
        raise NotImplementedError

    def read(self, name: str) -> str:
        raise NotImplementedError

    def texts(self, package: str) -> list[tuple[str, str]]:
        """Every ``.py`` file of ``package`` with its text, in name order."""
        prefix = package + "/"
        return [(n, self.read(n)) for n in self.names() if n.startswith(prefix)]

    def tree(self, name: str) -> ast.Module:
        if name not in self._trees:
            self._trees[name] = ast.parse(self.read(name), filename=name)
        return self._trees[name]

    def module_file(self, dotted: str) -> str | None:
        base = dotted.replace(".", "/")
        for name in (base + ".py", base + "/__init__.py"):
            if self.has(name):
                return name
        return None


class WheelSource(Source):
    """A release wheel, read with :mod:`zipfile` (nothing installed)."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = Path(path)
        self.zf = zipfile.ZipFile(self.path)
        self._names = set(self.zf.namelist())
        self.version = wheel_version(self.path, self.zf)

    def names(self) -> list[str]:
        return sorted(n for n in self._names if n.endswith(".py"))

    def has(self, name: str) -> bool:
        return name in self._names

    def read(self, name: str) -> str:
        return self.zf.read(name).decode("utf-8", "replace")

    def texts(self, package: str) -> list[tuple[str, str]]:
        # In the archive's own order: tools/vllm_error_formats.py's output keeps it.
        prefix = package + "/"
        return [
            (n, self.read(n))
            for n in self.zf.namelist()
            if n.startswith(prefix) and n.endswith(".py")
        ]

    def sha256(self) -> str:
        return hashlib.sha256(self.path.read_bytes()).hexdigest()


class FolderSource(Source):
    """An installed package: files under a site-packages folder."""

    def __init__(self, site_packages: str | Path) -> None:
        super().__init__()
        self.root = Path(site_packages)

    def names(self) -> list[str]:
        return sorted(str(p.relative_to(self.root)) for p in self.root.rglob("*.py") if p.is_file())

    def has(self, name: str) -> bool:
        return (self.root / name).is_file()

    def read(self, name: str) -> str:
        return (self.root / name).read_text("utf-8", "replace")


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


def find_class(src: Source, file: str, name: str, depth: int = 0) -> ClassRef | None:
    """The class ``name`` as seen from module ``file``: defined there or imported into it."""
    if depth > 6 or not src.has(file):
        return None
    tree = src.tree(file)
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return ClassRef(file, node)
    for found_node in ast.walk(tree):
        if isinstance(found_node, ast.ImportFrom) and found_node.module:
            for alias in found_node.names:
                if (alias.asname or alias.name) == name:
                    target = resolve_relative(file, found_node)
                    module = src.module_file(target) if target else None
                    if module:
                        found = find_class(src, module, alias.name, depth + 1)
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


def mro(src: Source, ref: ClassRef) -> list[ClassRef]:
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
                found = find_class(src, r.file, name)
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


ARITHMETIC = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.FloorDiv: lambda a, b: a // b,
    ast.Mod: lambda a, b: a % b,
}


class ClassView:
    """``cls`` inside a classmethod: its attributes and argument-less methods, as literals."""

    def attribute(self, name: str) -> Any:
        raise Unresolved(f"cls.{name}")


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
        if isinstance(node, ast.BinOp) and type(node.op) in ARITHMETIC:
            left, right = self.ev(node.left), self.ev(node.right)
            if not all(isinstance(v, int) for v in (left, right)):
                raise Unresolved(ast.unparse(node))
            return ARITHMETIC[type(node.op)](left, right)
        if isinstance(node, ast.Attribute):
            if isinstance(node.value, ast.Name) and node.value.id.endswith(
                ("AttentionBackendEnum", "_Backend")
            ):
                return EnumMember(node.attr)
            base = self.ev(node.value)
            if isinstance(base, ClassView):
                return base.attribute(node.attr)
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
            if isinstance(target, ClassView) and not args and not node.keywords:
                return target.attribute(fn.attr)
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


def backend_registry(src: Source) -> tuple[dict[str, str], str | None]:
    """Backend name -> ``module.Class`` from ``AttentionBackendEnum`` (0.11+)."""
    for file in REGISTRY_FILES:
        if not src.has(file):
            continue
        for node in src.tree(file).body:
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


def legacy_backends(src: Source) -> dict[str, str]:
    """Releases without the registry: classes whose ``get_name()`` returns a literal."""
    claims: dict[str, list[ClassRef]] = {}
    for file in src.names():
        if not file.startswith(BACKEND_DIRS):
            continue
        for node in src.tree(file).body:
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
        for name, ref in ((n, _leaf(src, refs)) for n, refs in claims.items())
    }


def _leaf(src: Source, refs: list[ClassRef]) -> ClassRef:
    """Of classes claiming one name (a base and its subclass), the subclass."""
    for ref in refs:
        ancestors = {(r.file, r.node.name) for r in mro(src, ref)}
        if all((o.file, o.node.name) in ancestors for o in refs):
            return ref
    return refs[0]


def attr_literal(chain: list[ClassRef], attr: str) -> dict[str, Any] | None:
    found = class_attr(chain, attr)
    if found is None:
        return None
    node, ref = found
    try:
        value = returned_literal(node) if isinstance(node, ast.FunctionDef) else literal(node)
    except Unresolved as e:
        return {"value": None, "unresolved": str(e)[:300], "file": ref.file}
    return {"value": value, "file": ref.file, "defined_in": ref.node.name}


def capability_gate(
    chain: list[ClassRef], capabilities: tuple[tuple[int, int], ...]
) -> dict[str, Any] | None:
    found = class_attr(chain, "supports_compute_capability")
    if found is None or not isinstance(found[0], ast.FunctionDef):
        return None
    fn, ref = found
    assert isinstance(fn, ast.FunctionDef)
    param = fn.args.args[-1].arg
    supported: list[str] = []
    try:
        for cap in capabilities:
            c = Cap(cap)
            if call_with(fn, {param: c}, c):
                supported.append(cap_text(cap))
    except Unresolved as e:
        return {
            "supported": None,
            "unresolved": str(e)[:300],
            "expression": body_text(fn),
            "file": ref.file,
            "defined_in": ref.node.name,
        }
    return {
        "supported": supported,
        "expression": body_text(fn),
        "file": ref.file,
        "defined_in": ref.node.name,
    }


def body_text(fn: ast.AST) -> str:
    if not isinstance(fn, ast.FunctionDef):
        return ast.unparse(fn)[:400]
    body = [s for s in fn.body if not _is_docstring(s)]
    return " ".join(" ".join(ast.unparse(s).split()) for s in body)[:400]


# ------------------------------------------------------------------------------------------
# The selection, as vllm/platforms/cuda.py and AttentionBackend.validate_configuration make it

# The texts of AttentionBackend.validate_configuration (vllm/v1/attention/backend.py) that
# follow from a backend's declarations; the rest (supports_combination's kernel-availability
# answers, import failures of compiled parts) depend on the machine, not on the source.
STATIC_REASONS = (
    "head_size not supported",
    "dtype not supported",
    "kv_cache_dtype not supported",
    "MLA not supported",
    "non-MLA not supported",
    "sparse not supported",
    "non-sparse not supported",
    "compute capability not supported",
)
# The MLA backends the importing reader lists when no capability is asked (its LEGACY_BACKENDS).
MLA_BACKENDS = ("TRITON_MLA", "FLASHMLA", "FLASH_ATTN_MLA", "FLASHINFER_MLA", "CUTLASS_MLA")
BASE_CLASSES = ("AttentionBackend",)


def priority_function(src: Source) -> ast.FunctionDef | None:
    """``_get_backend_priorities`` of the release's ``vllm/platforms/cuda.py`` (0.12+)."""
    if not src.has(CUDA_PLATFORM):
        return None
    for node in src.tree(CUDA_PLATFORM).body:
        if isinstance(node, ast.FunctionDef) and node.name == "_get_backend_priorities":
            return node
    return None


def priority_order(fn: ast.FunctionDef, values: dict[str, Any]) -> list[str]:
    """The backend names the priority function returns for these arguments."""
    params = {a.arg for a in fn.args.args + fn.args.kwonlyargs}
    bound = {k: v for k, v in values.items() if k in params}
    return [str(b) for b in call_with(fn, bound, values.get("device_capability"))]


def dtype_names(node: ast.AST) -> list[str]:
    """``[torch.float16, torch.bfloat16]`` as ``["float16", "bfloat16"]``."""
    if not isinstance(node, (ast.List, ast.Tuple)):
        raise Unresolved(ast.unparse(node))
    names = []
    for elt in node.elts:
        if not isinstance(elt, ast.Attribute):
            raise Unresolved(ast.unparse(elt))
        names.append(elt.attr)
    return names


@dataclass
class Checked:
    """One backend judged from its source: the reasons it is invalid for a case, and the
    checks the source could not settle."""

    reasons: list[str]
    unresolved: list[str]


class BackendSource(ClassView):
    """A backend class read from source: its declarations along the class hierarchy."""

    def __init__(self, src: Source, classpath: str) -> None:
        module, _, name = classpath.replace(":", ".").rpartition(".")
        file = src.module_file(module)
        ref = find_class(src, file, name) if file else None
        if ref is None:
            raise Unresolved(f"class {classpath} not found in the source")
        self.src = src
        self.ref = ref
        self.chain = mro(src, ref)

    def declared(self, attr: str) -> tuple[ast.AST, ClassRef] | None:
        return class_attr(self.chain, attr)

    def overridden(self, method: str) -> ast.FunctionDef | None:
        """The method when a backend (not the base class) defines it."""
        found = self.declared(method)
        if found is None or found[1].node.name in BASE_CLASSES:
            return None
        return found[0] if isinstance(found[0], ast.FunctionDef) else None

    def attribute(self, name: str) -> Any:
        return self.value(name)

    def value(self, attr: str) -> Any:
        found = self.declared(attr)
        if found is None:
            raise Unresolved(f"{attr} not declared")
        node = found[0]
        return returned_literal(node) if isinstance(node, ast.FunctionDef) else literal(node)

    def kv_dtypes(self) -> list[str] | None:
        try:
            value = self.value("supported_kv_cache_dtypes")
        except Unresolved:
            return None
        return [str(v) for v in value]

    def missing_module(self) -> str | None:
        """A package the backend's module imports at load time that is not installed.

        Only the module's own top-level imports of packages other than vLLM and torch: the
        same ``ModuleNotFoundError`` importing the backend would raise first.
        """
        for node in self.src.tree(self.ref.file).body:
            roots = []
            if isinstance(node, ast.Import):
                roots = [a.name.split(".")[0] for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                roots = [node.module.split(".")[0]]
            for root in roots:
                if root in ("vllm", "torch", "__future__") or root in sys.builtin_module_names:
                    continue
                if root in getattr(sys, "stdlib_module_names", ()):
                    continue
                if importlib.util.find_spec(root) is None:
                    return root
        return None

    def check(self, case: dict[str, Any], dtype: str) -> Checked:
        """The static part of ``validate_configuration`` for one case."""
        reasons: list[str] = []
        unresolved: list[str] = []
        cap = case["device_capability"]

        def judge(text: str, ok: Any) -> None:
            try:
                if not ok():
                    reasons.append(text)
            except Unresolved as e:
                unresolved.append(f"{text.split(' not ')[0]}: {str(e)[:120]}")

        judge("head_size not supported", lambda: self.supports_head_size(case.get("head_size")))
        judge("dtype not supported", lambda: self.supports_dtype(dtype))
        judge(
            "kv_cache_dtype not supported",
            lambda: self.supports_kv_cache_dtype(case.get("kv_cache_dtype")),
        )
        try:
            mla = bool(self.value("is_mla"))
            if case["use_mla"] != mla:
                reasons.append("MLA not supported" if case["use_mla"] else "non-MLA not supported")
        except Unresolved as e:
            unresolved.append(f"is_mla: {e}")
        try:
            sparse = bool(self.value("is_sparse"))
            use_sparse = bool(case.get("use_sparse"))
            if use_sparse != sparse:
                reasons.append("sparse not supported" if use_sparse else "non-sparse not supported")
        except Unresolved as e:
            unresolved.append(f"is_sparse: {e}")
        judge("compute capability not supported", lambda: self.supports_capability(cap))
        return Checked(reasons, unresolved)

    def supports_head_size(self, head_size: int | None) -> bool:
        if head_size is None:
            return True
        fn = self.overridden("supports_head_size")
        if fn is not None:
            return bool(call_with(fn, {"cls": self, fn.args.args[-1].arg: head_size}, None))
        sizes = self.value("get_supported_head_sizes")
        return not sizes or head_size in sizes

    def supports_dtype(self, dtype: str) -> bool:
        if self.overridden("supports_dtype") is not None:
            raise Unresolved("supports_dtype is overridden")
        found = self.declared("supported_dtypes")
        if found is None:
            raise Unresolved("supported_dtypes not declared")
        return dtype in dtype_names(found[0])

    def supports_kv_cache_dtype(self, kv: str | None) -> bool:
        if kv is None:
            return True
        fn = self.overridden("supports_kv_cache_dtype")
        if fn is not None:
            return bool(call_with(fn, {"cls": self, fn.args.args[-1].arg: kv}, None))
        declared = self.kv_dtypes()
        if declared is None:
            raise Unresolved("supported_kv_cache_dtypes not a literal")
        return not declared or kv in declared

    def supports_capability(self, cap: Cap) -> bool:
        fn = self.overridden("supports_compute_capability")
        if fn is None:
            return True
        return bool(call_with(fn, {"cls": self, fn.args.args[-1].arg: cap}, cap))


def select(src: Source, request: dict[str, Any]) -> dict[str, Any]:
    """The backend selection of the release in ``src`` for each case of ``request``.

    The same JSON shape as the importing reader of ``opsbook/remote/probes/backends.py``: per case
    the priority order, the reasons of the backends tried before the chosen one, and the
    first backend no static check rejects. ``note`` is set (and no selection given) when the
    release has no registry or no priority function: the caller then asks vLLM itself.
    """
    answer: dict[str, Any] = {
        "selections": {},
        "kv_dtypes": {},
        "import_errors": {},
        "unresolved": {},
        "priorities_from": None,
        "note": None,
        "read_from": "source",
    }
    registry, registry_file = backend_registry(src)
    fn = priority_function(src)
    if not registry or fn is None:
        answer["note"] = "no backend registry or _get_backend_priorities in this vLLM's source"
        return answer
    answer["priorities_from"] = f"{CUDA_PLATFORM}::_get_backend_priorities (read from source)"
    backends: dict[str, BackendSource | None] = {}

    def load(name: str) -> BackendSource | None:
        if name not in backends:
            backends[name] = None
            try:
                backend = BackendSource(src, registry[name])
            except (Unresolved, KeyError) as e:
                answer["import_errors"][name] = f"not found in the source: {e}"
                return None
            missing = backend.missing_module()
            if missing:
                answer["import_errors"][name] = f"ModuleNotFoundError: No module named '{missing}'"
                return None
            backends[name] = backend
            kv = backend.kv_dtypes()
            if kv is not None:
                answer["kv_dtypes"][name] = kv
        return backends[name]

    if not request["cases"]:
        for name in MLA_BACKENDS:
            if name in registry:
                load(name)
        answer["note"] = "no compute capability given or found: only the MLA backends' KV dtypes"
        return answer
    dtype = request.get("dtype") or "bfloat16"
    for case in request["cases"]:
        major, _, minor = str(case["compute_capability"]).partition(".")
        cap = Cap((int(major), int(minor or 0)))
        values = {
            "use_mla": case["use_mla"],
            "device_capability": cap,
            "num_heads": case.get("num_heads"),
            "kv_cache_dtype": case["kv_cache_dtype"],
            "head_size": case.get("head_size"),
            "use_non_causal": False,
            "use_mm_prefix": False,
        }
        order = priority_order(fn, values)
        reasons: dict[str, list[str]] = {}
        chosen = None
        for name in order:
            backend = load(name)
            if backend is None:
                reasons[name] = ["not importable: " + answer["import_errors"][name]]
                continue
            checked = backend.check(dict(case, device_capability=cap), dtype)
            if checked.unresolved:
                answer["unresolved"][name] = checked.unresolved
            if checked.reasons:
                reasons[name] = checked.reasons
            else:
                chosen = name
                break
        key = "|".join(
            [str(case["compute_capability"]), str(case["use_mla"]), case["kv_cache_dtype"]]
        )
        answer["selections"][key] = {"chosen": chosen, "order": order, "reasons": reasons}
    answer["registry_file"] = registry_file
    return answer


def site_packages_of(init_file: str) -> str:
    """The site-packages folder of a package whose ``__init__.py`` is ``init_file``."""
    return os.path.dirname(os.path.dirname(os.path.abspath(init_file)))
