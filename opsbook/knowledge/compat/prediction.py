"""Predict whether vLLM will serve a checkpoint on given GPUs with given flags: the rules of
``compat_rules.yaml`` evaluated per compute capability, each finding with the rule's texts,
remedy and source, and the evidence (KV dtype, backends) as typed objects.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from opsbook.core.results import Finding, Result, Table
from opsbook.knowledge.compat import rules_table
from opsbook.knowledge.compat.backend_probe import InstalledVllm
from opsbook.knowledge.compat.backend_select import (
    BackendChoice,
    facts_source,
    release_facts,
    select_backend,
)
from opsbook.knowledge.compat.model_config import ModelFacts
from opsbook.knowledge.compat.rule_conditions import CONDITIONS, RuleContext, is_set
from opsbook.knowledge.compat.rules_table import (
    TABLE_SOURCE,
    Rule,
    capability_int,
    compute_capability,
)

FINDING_COLUMNS = ["severity", "what will happen", "why", "fix", "source"]
ATTENTION_BACKEND_ARGS = ("attention-backend", "attention-config.backend", "ac.backend")
# Codes of the findings that are not rules of the table (a rule's finding has the rule's id).
BACKEND_CHOSEN = "attention-backend-chosen"
NO_GPU_FACTS = "no-gpu-facts"


@dataclass(frozen=True)
class PredictionEvidence:
    """What a prediction rests on.

    Attributes:
        kv_cache_dtype: the KV-cache dtype vLLM will use.
        kv_origin: where it comes from (the flag, or the checkpoint's keys).
        backends: per compute capability, the backend vLLM will choose.
        findings_table: the rules that fired: severity, what will happen, why, fix, source.
        table_version: the version of ``compat_rules.yaml``.
        source: which source the backend choice comes from (the installed vLLM, a release's
            source, the table).
    """

    kv_cache_dtype: str
    kv_origin: str
    backends: dict[str, BackendChoice] = field(default_factory=dict)
    findings_table: Table = field(default_factory=lambda: Table(FINDING_COLUMNS, []))
    table_version: str = ""
    source: str = ""


@dataclass(repr=False)
class Prediction(Result):
    """:func:`check_compat`'s verdict: ok, message and findings, with its evidence."""

    evidence: PredictionEvidence = field(kw_only=True)


def normalize_serve_args(serve_args: Mapping[str, Any]) -> dict[str, Any]:
    """Serve arguments keyed by their CLI spelling without dashes: ``kv-cache-dtype``.

    Accepts ``--kv-cache-dtype``, ``kv_cache_dtype`` or ``kv-cache-dtype`` as keys.
    """
    return {str(k).lstrip("-").replace("_", "-").lower(): v for k, v in serve_args.items()}


def resolve_kv_cache_dtype(facts: ModelFacts, serve_args: Mapping[str, Any]) -> tuple[str, str]:
    """The KV-cache dtype vLLM will use, and where it comes from.

    Mirrors ``resolve_kv_cache_dtype_string``: anything but ``auto`` on the command line wins;
    ``auto`` means the checkpoint's KV algorithm.

    Returns:
        ``(dtype, origin)``, e.g. ``("fp8_e4m3", "the checkpoint asks for it: ...")``.
    """
    flag = str(normalize_serve_args(serve_args).get("kv-cache-dtype") or "auto")
    if flag != "auto":
        return flag, f"--kv-cache-dtype {flag}"
    if facts.kv_cache_dtype != "auto":
        where = ", ".join(facts.kv_cache_keys) or facts.quant_source or "the checkpoint"
        return facts.kv_cache_dtype, f"the checkpoint asks for it: {where}"
    return "auto", "the model's dtype (no KV-cache quantization)"


def check_compat(
    facts: ModelFacts,
    gpus: Sequence[Any],
    vllm_version: str | None,
    serve_args: Mapping[str, Any],
    probed_backends: Mapping[str, Sequence[str]] | None = None,
) -> Prediction:
    """Predict what vLLM will do with this checkpoint, GPUs, version and flags.

    Args:
        facts: from :func:`model_facts`.
        gpus: one entry per GPU with a ``compute_cap`` such as ``"12.0"``: mappings, or
            objects with that attribute (:class:`opsbook.steps.host_facts.Gpu`).
        vllm_version: the installed vLLM version, or None when unknown (rules that depend on
            it then report a warning rather than an error).
        serve_args: the server's arguments (``kv-cache-dtype``, ``tool-call-parser``...).
        probed_backends: backend name to the KV dtypes the installed vLLM's backend supports;
            takes precedence over the version ranges of the table.

    Returns:
        A :class:`Prediction`, not ok when an error finding is present; its ``evidence`` is
        the :class:`PredictionEvidence` (KV dtype, backend per compute capability, the
        findings as a table, sources). Each rule's finding has the rule's id as its ``code``.
    """
    table = rules_table.load_rules()
    args = normalize_serve_args(serve_args)
    facts = narrow_to_release(facts, vllm_version)
    kv_dtype, kv_origin = resolve_kv_cache_dtype(facts, args)
    forced = next((str(args[a]) for a in ATTENTION_BACKEND_ARGS if is_set(args.get(a))), None)
    caps = list(dict.fromkeys(cc for cc in map(compute_capability, gpus) if cc))
    findings: list[Finding] = []
    rows: list[list[str]] = []
    backends: dict[str, BackendChoice] = {}
    reported: set[str] = set()
    contexts: list[str | None] = list(caps) or [None]
    for cc in contexts:
        choice = None
        if cc is not None:
            choice = select_backend(
                facts.mla,
                cc,
                kv_dtype,
                vllm_version,
                sparse=facts.sparse_mla,
                forced=forced,
                probed_backends=probed_backends,
                head_size=facts.head_size,
            )
            backends[cc] = choice
        ctx = RuleContext(
            facts, cc, vllm_version, args, kv_dtype, kv_origin, choice, probed_backends, table
        )
        ctx.values.update(_base_values(ctx))
        for finding, row in _evaluate_rules(ctx, table.rules):
            # A rule fires once, however many compute capabilities it holds on.
            if finding.code in reported:
                continue
            reported.add(finding.code)
            findings.append(finding)
            rows.append(row)
    findings += _backend_notes(backends, facts)
    if not caps:
        findings.append(
            Finding(
                "info",
                "GPUs",
                "no GPU facts given: rules that depend on the compute capability were not checked",
                code=NO_GPU_FACTS,
            )
        )
    errors = [f.subject for f in findings if f.severity == "error"]
    warnings = [f.subject for f in findings if f.severity == "warning"]
    if errors:
        message = f"{len(errors)} problem(s) will stop vLLM: " + "; ".join(errors)
    elif warnings:
        message = f"no certain incompatibility; {len(warnings)} warning(s): " + "; ".join(warnings)
    else:
        message = "no known incompatibility"
    source = prediction_source(backends, vllm_version, probed_backends)
    message += f" ({source})"
    evidence = PredictionEvidence(
        kv_cache_dtype=kv_dtype,
        kv_origin=kv_origin,
        backends=backends,
        findings_table=Table(FINDING_COLUMNS, rows),
        table_version=table.version,
        source=source,
    )
    return Prediction(ok=not errors, message=message, findings=findings, evidence=evidence)


def prediction_source(
    backends: Mapping[str, BackendChoice],
    vllm_version: str | None,
    probed: Mapping[str, Sequence[str]] | None,
) -> str:
    """Which source the prediction used: the installed vLLM, a release's source, the table."""
    sources = list(dict.fromkeys(c.source for c in backends.values() if c.source))
    if sources:
        return "; ".join(sources)
    if isinstance(probed, InstalledVllm):
        return probed.source
    release = release_facts(vllm_version)
    return facts_source(release) if release is not None else TABLE_SOURCE


def narrow_to_release(facts: ModelFacts, vllm_version: str | None) -> ModelFacts:
    """The facts as the installed release sees them: a model type missing from that
    release's ``is_deepseek_mla`` list gets standard attention."""
    release = release_facts(vllm_version)
    if release is None:
        return facts
    algo = (facts.kv_cache_algo or "").lower()
    if facts.kv_cache_dtype != "auto" and release.modelopt_kv_map:
        if algo not in release.modelopt_kv_map:
            note = (
                f"vLLM {release.version} has no KV dtype for kv_cache_quant_algo "
                f"{facts.kv_cache_algo} ({release.modelopt_kv_map_file}): it falls back to auto"
            )
            facts = replace(facts, kv_cache_dtype="auto", notes=(*facts.notes, note))
    if not facts.mla or facts.text_model_type in release.mla_model_types:
        return facts
    note = (
        f"vLLM {release.version} does not list model_type {facts.text_model_type!r} as MLA "
        f"({release.mla_model_types_file}): it uses standard attention"
    )
    return replace(
        facts, mla=False, sparse_mla=False, head_size=facts.head_dim, notes=(*facts.notes, note)
    )


def _base_values(ctx: RuleContext) -> dict[str, str]:
    f = ctx.facts
    values = {
        "cc": ctx.cc or "unknown",
        "capability": str(capability_int(ctx.cc)) if ctx.cc else "unknown",
        "vllm_version": ctx.version or "(version unknown)",
        "kv_cache_dtype": ctx.kv_dtype,
        "kv_origin": ctx.kv_origin,
        "checkpoint_kv_algo": f.kv_cache_algo or "none",
        "quant_method": f.quant_method or "none",
        "head_size": str(f.head_size),
        "remote_code": "; ".join(f.remote_code) or "no auto_map",
        "backend": "",
        "backend_dtypes": "",
        "reasons": "",
        "candidates": "",
    }
    if ctx.choice is not None:
        values["candidates"] = ", ".join(ctx.choice.candidates) or "none"
        values["reasons"] = ctx.choice.reasons_text()
        values["backend"] = ctx.choice.forced or ctx.choice.name or ""
        if ctx.choice.forced and ctx.choice.forced in ctx.choice.reasons:
            values["reasons"] = str(ctx.choice.reasons[ctx.choice.forced])
    for name, value in ctx.args.items():
        values[f"arg:{name}"] = str(value)
    return values


def _evaluate_rules(ctx: RuleContext, rules: Sequence[Rule]) -> list[tuple[Finding, list[str]]]:
    """Findings of every rule whose conditions all hold; one per group."""
    out: list[tuple[Finding, list[str]]] = []
    groups_hit: set[str] = set()
    for rule in rules:
        group = rule.group
        if group and group in groups_hit:
            continue
        base = dict(ctx.values)
        outcomes = [CONDITIONS[name](ctx, want) for name, want in rule.when.given()]
        if not any(o is False for o in outcomes):
            if group:
                groups_hit.add(group)
            out.append(_finding(rule, ctx, certain=all(o is True for o in outcomes)))
        # Conditions may add values for their rule's texts; they must not leak into the next.
        ctx.values = base
    return out


def _finding(rule: Rule, ctx: RuleContext, certain: bool) -> tuple[Finding, list[str]]:
    severity: str = rule.severity
    what = _fill(rule.what, ctx.values)
    failure = _fill(rule.failure, ctx.values)
    why = _fill(rule.why, ctx.values)
    if not certain and severity == "error":
        severity = "warning"
        why += " The vLLM version is unknown: this is what happens in the affected releases."
    remedy = _fill(rule.remedy, ctx.values)
    source = rule.source.strip()
    happens = f"{what}: {failure}" if failure else what
    happens = happens.rstrip(".")
    message = f"{happens}. Why: {why}"
    finding = Finding(severity, rule.title, message, remedy, source, code=rule.id)
    return finding, [severity, happens, why, remedy, source]


def _fill(template: str, values: Mapping[str, str]) -> str:
    """Put ``{name}`` values into a rule text; ``{{``/``}}`` stand for literal braces."""
    text = re.sub(
        r"\{([A-Za-z0-9_:\-]+)\}", lambda m: values.get(m.group(1), m.group(0)), str(template)
    )
    return " ".join(text.replace("{{", "{").replace("}}", "}").split())


def _backend_notes(backends: Mapping[str, BackendChoice], facts: ModelFacts) -> list[Finding]:
    notes = []
    for cc, choice in backends.items():
        if choice.name:
            kind = "MLA" if facts.mla else "attention"
            notes.append(
                Finding(
                    "ok",
                    f"attention backend on {cc}",
                    f"vLLM will use {choice.name} ({kind}; tried {', '.join(choice.candidates)})",
                    source=choice.source or "vllm/platforms/cuda.py priorities",
                    code=BACKEND_CHOSEN,
                )
            )
    return notes
