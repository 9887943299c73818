"""The compatibility table ``opsbook/knowledge/data/compat_rules.yaml`` as typed objects.

The table is checked against these models when it is read: a key misspelt, a value of the
wrong kind or a condition no code evaluates is an error naming the rule (or backend) and the
field, not a ``KeyError`` halfway through a prediction. Also here: the table's spellings of
versions (``">=0.11,<0.20"``) and compute capabilities (``"12.x"``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from functools import lru_cache
from importlib import resources
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from opsbook.core.exceptions import OpsbookError

RULES_FILE = "compat_rules.yaml"
TABLE_SOURCE = "opsbook table compat_rules.yaml"

# "any", or a list of "12.x" (any minor of major 12) and "9.0" (exact).
Capabilities = Literal["any"] | tuple[str, ...]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class KvDtypeRange(_Strict):
    """The KV dtypes a backend supports in a range of vLLM versions."""

    versions: str = "any"
    dtypes: tuple[str, ...]
    source: str = ""


class BackendSpec(_Strict):
    """A backend of the fallback table (releases without a priority function)."""

    mla: bool
    sparse: bool = False
    compute_capability: Capabilities
    available: str | None = None
    kv_cache_dtypes: tuple[KvDtypeRange, ...] = Field(min_length=1)


class Priority(_Strict):
    """The fallback selection order for the compute capabilities it matches."""

    compute_capability: Capabilities
    mla: tuple[str, ...]
    sparse_mla: tuple[str, ...]
    non_mla: tuple[str, ...]
    source: str = ""

    def order(self, mla: bool, sparse: bool) -> tuple[str, ...]:
        if not mla:
            return self.non_mla
        return self.sparse_mla if sparse else self.mla


class QuantMethodSpec(_Strict):
    min_capability: int
    source: str = ""


class When(_Strict):
    """A rule's conditions; those given must all hold (see ``rule_conditions.CONDITIONS``,
    which evaluates each field of this model)."""

    mla: bool | None = None
    sparse: bool | None = None
    compute_capability: Capabilities | None = None
    kv_cache_dtype: tuple[str, ...] | None = None
    kv_flag: tuple[str, ...] | None = None
    kv_flag_unknown: bool | None = None
    checkpoint_kv_quant: bool | None = None
    backend_lacks_kv_dtype: str | None = None
    backend_forced: str | None = None
    fp8_kv_gate: bool | None = None
    backend_forced_invalid: bool | None = None
    no_backend: bool | None = None
    quant_below_min_capability: bool | None = None
    vllm_version: str | None = None
    serve_arg_set: tuple[str, ...] | None = None
    serve_arg_missing: tuple[str, ...] | None = None
    needs_remote_code: bool | None = None
    model_type_native: bool | None = None

    def given(self) -> Iterator[tuple[str, Any]]:
        """The conditions the rule states, in the order of this model's fields."""
        for name, value in self:
            if value is not None:
                yield name, value


class Rule(_Strict):
    """One rule: when it fires, what vLLM will do, why, the fix and the source."""

    id: str
    group: str | None = None
    severity: Literal["ok", "info", "warning", "error"]
    title: str
    when: When
    what: str
    failure: str = ""
    why: str
    remedy: str
    source: str = ""


class RulesTable(_Strict):
    """The whole table: fallback facts for old releases, and the rules."""

    schema_version: int = Field(alias="schema")
    version: str
    backends: dict[str, BackendSpec]
    priorities: tuple[Priority, ...] = Field(min_length=1)
    quantization_methods: dict[str, QuantMethodSpec]
    native_model_types: tuple[str, ...] = ()
    rules: tuple[Rule, ...]


@lru_cache(maxsize=1)
def load_rules() -> RulesTable:
    """The compatibility table shipped in the package
    (``opsbook/knowledge/data/compat_rules.yaml``).

    Raises:
        OpsbookError: the table is missing or malformed (a broken installation), naming the
            rule or backend and the field that is wrong.
    """
    try:
        text = resources.files("opsbook.knowledge").joinpath("data", RULES_FILE).read_text()
        raw = yaml.safe_load(text)
    except (FileNotFoundError, yaml.YAMLError) as e:
        raise OpsbookError(
            f"the compatibility table {RULES_FILE} cannot be read: {e}",
            remedy="reinstall opsbook (pip install -e .)",
        ) from None
    return parse_rules(raw)


def parse_rules(raw: Any) -> RulesTable:
    """A parsed YAML document checked and typed as the :class:`RulesTable`.

    Raises:
        OpsbookError: the first problem, naming where it is (``rule 'x', field when.y``).
    """
    try:
        return RulesTable.model_validate(raw)
    except ValidationError as e:
        first = e.errors()[0]
        where = _where(raw, tuple(first["loc"]))
        raise OpsbookError(
            f"the compatibility table {RULES_FILE} is malformed: {where}: {first['msg']}",
            remedy="fix that entry of the table, or reinstall opsbook (pip install -e .)",
        ) from None


def _where(raw: Any, loc: tuple[Any, ...]) -> str:
    """A pydantic location as the table's author knows it: a rule by its id, a backend by its
    name (``rule 'fp8-kv-mla-triton', field when.mla``)."""
    if len(loc) >= 2 and loc[0] == "rules" and isinstance(loc[1], int):
        rules = raw.get("rules") if isinstance(raw, dict) else None
        entry = rules[loc[1]] if isinstance(rules, (list, tuple)) and loc[1] < len(rules) else None
        name = entry.get("id") if isinstance(entry, dict) else None
        rule = f"rule {name!r}" if name else f"rule #{loc[1] + 1}"
        return f"{rule}, field {_dotted(loc[2:]) or '(the entry)'}"
    if len(loc) >= 2 and loc[0] in ("backends", "quantization_methods"):
        return f"{loc[0]} {loc[1]!r}, field {_dotted(loc[2:]) or '(the entry)'}"
    return f"field {_dotted(loc)}"


def _dotted(loc: Sequence[Any]) -> str:
    # pydantic names the union member it tried ("tuple[str, ...]"); the author did not write it.
    return ".".join(str(p) for p in loc if not (isinstance(p, str) and "[" in p))


def parse_version(text: str | None) -> tuple[int, int, int] | None:
    """``"0.20.2rc1.dev249+g..."`` -> ``(0, 20, 2)``; None when there is no version."""
    if not text:
        return None
    m = re.match(r"\s*v?(\d+)\.(\d+)(?:\.(\d+))?", str(text))
    if not m:
        return None
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


def version_in(version: tuple[int, int, int] | None, spec: str | None) -> bool | None:
    """Whether ``version`` is in ``spec`` (``">=0.11,<0.20"``, ``"any"``); None if unknown."""
    if not spec or str(spec).strip() == "any":
        return True
    if version is None:
        return None
    ops: dict[str, Callable[[tuple[int, ...], tuple[int, ...]], bool]] = {
        ">=": lambda a, b: a >= b,
        "<=": lambda a, b: a <= b,
        "==": lambda a, b: a == b,
        ">": lambda a, b: a > b,
        "<": lambda a, b: a < b,
    }
    for clause in str(spec).split(","):
        m = re.match(r"\s*(>=|<=|==|>|<)\s*([\d.]+)\s*$", clause)
        if not m:
            raise OpsbookError(f"bad version range {spec!r} in {RULES_FILE}")
        bound = parse_version(m.group(2))
        if bound is None or not ops[m.group(1)](version, bound):
            return False
    return True


def capability_matches(cc: str | None, patterns: Capabilities) -> bool:
    """Whether compute capability ``cc`` (``"12.0"``) matches ``"12.x"``/``"9.0"``/``"any"``."""
    if patterns == "any":
        return True
    if cc is None:
        return False
    major = cc.split(".")[0]
    return any(p == cc or p == f"{major}.x" or p == "any" for p in patterns)


def capability_int(cc: str) -> int:
    """``"12.0"`` -> ``120``, ``"8.9"`` -> ``89``, as vLLM's ``to_int()``."""
    major, _, minor = cc.partition(".")
    return int(major) * 10 + int(minor or 0)


def compute_capability(gpu: Any) -> str | None:
    """A GPU's compute capability (``"12.0"``), from preflight facts or a mapping."""
    if isinstance(gpu, Mapping):
        value = gpu.get("compute_cap")
    else:
        value = getattr(gpu, "compute_cap", None)
    return str(value) if value else None
