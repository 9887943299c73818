"""The conditions a rule of ``compat_rules.yaml`` may state, one function per field of
:class:`~.rules_table.When`.

Each gets the context of one compute capability and the value the rule wants; it answers True,
False, or None when it cannot tell (the vLLM version is unknown and the releases differ): a
rule with an uncertain condition is reported as a warning, not an error. A condition may add
values (``{backend}``...) for its rule's texts.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from opsbook.knowledge import vllm_facts
from opsbook.knowledge.compat.backend_select import (
    BackendChoice,
    backend_kv_dtypes,
    min_capability,
    release_facts,
)
from opsbook.knowledge.compat.model_config import ModelFacts
from opsbook.knowledge.compat.rules_table import (
    RulesTable,
    capability_int,
    capability_matches,
    parse_version,
    version_in,
)


@dataclass
class RuleContext:
    """Everything a rule condition may look at, for one compute capability."""

    facts: ModelFacts
    cc: str | None
    version: str | None
    args: dict[str, Any]
    kv_dtype: str
    kv_origin: str
    choice: BackendChoice | None
    probed: Mapping[str, Sequence[str]] | None
    table: RulesTable
    values: dict[str, str] = field(default_factory=dict)


Condition = Callable[[RuleContext, Any], "bool | None"]


def _cond_mla(ctx: RuleContext, want: Any) -> bool:
    return ctx.facts.mla == bool(want)


def _cond_sparse(ctx: RuleContext, want: Any) -> bool:
    return ctx.facts.sparse_mla == bool(want)


def _cond_compute_capability(ctx: RuleContext, patterns: Any) -> bool:
    return capability_matches(ctx.cc, patterns)


def _cond_kv_cache_dtype(ctx: RuleContext, dtypes: Any) -> bool:
    return ctx.kv_dtype in dtypes


def _cond_kv_flag(ctx: RuleContext, dtypes: Any) -> bool:
    return str(ctx.args.get("kv-cache-dtype", "auto")) in dtypes


def _cond_checkpoint_kv_quant(ctx: RuleContext, want: Any) -> bool:
    return (ctx.facts.kv_cache_algo is not None) == bool(want)


def _cond_backend_lacks_kv_dtype(ctx: RuleContext, name: Any) -> bool | None:
    dtypes, certain, _ = backend_kv_dtypes(str(name), ctx.version, ctx.probed)
    ctx.values.update(backend=str(name), backend_dtypes=", ".join(dtypes))
    if ctx.kv_dtype in dtypes:
        return False
    return True if certain else None


def _cond_kv_flag_unknown(ctx: RuleContext, want: Any) -> bool | None:
    """``--kv-cache-dtype`` names a value outside the release's ``CacheDType`` literal."""
    flag = str(ctx.args.get("kv-cache-dtype") or "auto")
    release = release_facts(ctx.version)
    if release is not None and release.cache_dtypes:
        known: Sequence[str] = release.cache_dtypes
        unknown: bool | None = flag not in known
        ctx.values["kv_dtypes_file"] = release.source(release.cache_dtypes_file)
    else:
        everywhere = [vllm_facts.load(r).cache_dtypes for r in vllm_facts.releases()]
        known = list(dict.fromkeys(d for ds in everywhere for d in ds))
        in_some = flag in known
        in_all = all(flag in ds for ds in everywhere)
        unknown = not in_some if (in_all or not in_some) else None
        ctx.values["kv_dtypes_file"] = "vllm/config/cache.py of every release read"
    ctx.values["known_kv_dtypes"] = ", ".join(known)
    if unknown is None:
        return None
    return unknown == bool(want)


FP8_GATE_REASON = "FP8 KV cache needs compute capability"


def _cond_fp8_kv_gate(ctx: RuleContext, want: Any) -> bool:
    """No backend is left, and one would have run but for its FP8-KV capability gate (the
    implementation raises at start-up: TritonMLAImpl's SM89 check from vLLM 0.26.0)."""
    gated = ""
    if ctx.choice is not None and ctx.choice.name is None:
        gated = next(
            (
                name
                for name, why in ctx.choice.reasons.items()
                if len(why) == 1 and why[0].startswith(FP8_GATE_REASON)
            ),
            "",
        )
    if gated:
        ctx.values.update(backend=gated, gate=ctx.choice.reasons[gated][0] if ctx.choice else "")
    return bool(gated) == bool(want)


def _cond_backend_forced(ctx: RuleContext, name: Any) -> bool:
    return ctx.choice is not None and ctx.choice.forced == name


def _cond_backend_forced_invalid(ctx: RuleContext, want: Any) -> bool | None:
    found = ctx.choice is not None and ctx.choice.forced is not None and ctx.choice.name is None
    if found and ctx.choice is not None and ctx.choice.uncertain:
        return None
    return found == bool(want)


def _cond_no_backend(ctx: RuleContext, want: Any) -> bool | None:
    found = ctx.choice is not None and ctx.choice.forced is None and ctx.choice.name is None
    if found and ctx.choice is not None and ctx.choice.uncertain:
        return None
    return found == bool(want)


def _cond_quant_below_min_capability(ctx: RuleContext, want: Any) -> bool | None:
    method = ctx.facts.quant_method
    value, certain, _ = min_capability(method or "", ctx.version)
    if value is None or ctx.cc is None:
        return not want
    ctx.values["min_capability"] = str(value)
    below = capability_int(ctx.cc) < value
    if below == bool(want) and not certain:
        return None
    return below == bool(want)


def _cond_vllm_version(ctx: RuleContext, spec: Any) -> bool | None:
    return version_in(parse_version(ctx.version), str(spec))


def _cond_serve_arg_set(ctx: RuleContext, names: Any) -> bool:
    return all(is_set(ctx.args.get(n)) for n in names)


def _cond_serve_arg_missing(ctx: RuleContext, names: Any) -> bool:
    return not any(is_set(ctx.args.get(n)) for n in names)


def _cond_needs_remote_code(ctx: RuleContext, want: Any) -> bool:
    return ctx.facts.needs_remote_code == bool(want)


def _cond_model_type_native(ctx: RuleContext, want: Any) -> bool:
    native = ctx.facts.model_type in ctx.table.native_model_types
    return native == bool(want)


CONDITIONS: dict[str, Condition] = {
    "mla": _cond_mla,
    "sparse": _cond_sparse,
    "compute_capability": _cond_compute_capability,
    "kv_cache_dtype": _cond_kv_cache_dtype,
    "kv_flag": _cond_kv_flag,
    "kv_flag_unknown": _cond_kv_flag_unknown,
    "checkpoint_kv_quant": _cond_checkpoint_kv_quant,
    "backend_lacks_kv_dtype": _cond_backend_lacks_kv_dtype,
    "backend_forced": _cond_backend_forced,
    "fp8_kv_gate": _cond_fp8_kv_gate,
    "backend_forced_invalid": _cond_backend_forced_invalid,
    "no_backend": _cond_no_backend,
    "quant_below_min_capability": _cond_quant_below_min_capability,
    "vllm_version": _cond_vllm_version,
    "serve_arg_set": _cond_serve_arg_set,
    "serve_arg_missing": _cond_serve_arg_missing,
    "needs_remote_code": _cond_needs_remote_code,
    "model_type_native": _cond_model_type_native,
}


def is_set(value: Any) -> bool:
    """Whether a serve argument is given: a flag without value (``""``/True) counts."""
    return value is not None and value is not False and str(value).lower() != "false"
