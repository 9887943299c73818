"""Choose the attention backend as vLLM's CUDA selector does, for one compute capability.

In this order: the installed vLLM's own answer when :func:`~.backend_probe.probe_backends`
asked it, else the release's own priority list and backend declarations
(``opsbook/knowledge/data/vllm_facts``, read from its source by ``tools/vllm_facts.py``), else
the fallback table of ``opsbook/knowledge/data/compat_rules.yaml`` (releases before 0.11.2).
The choice names its source. Also the quantization methods' minimum capabilities, from the
same sources.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from opsbook.core.exceptions import OpsbookError
from opsbook.knowledge import vllm_facts
from opsbook.knowledge.compat import rules_table
from opsbook.knowledge.compat.backend_probe import InstalledVllm, ProbedSelection
from opsbook.knowledge.compat.rules_table import (
    TABLE_SOURCE,
    capability_int,
    capability_matches,
    parse_version,
    version_in,
)
from opsbook.knowledge.vllm_facts import ReleaseFacts


@dataclass(frozen=True)
class BackendChoice:
    """The attention backend vLLM would pick for one compute capability.

    Attributes:
        name: the chosen backend, or None when none fits.
        candidates: the backends tried, in vLLM's priority order.
        reasons: per rejected backend, vLLM's reasons (``compute capability not supported``...).
        forced: the backend asked for with ``--attention-backend``, if any.
        uncertain: True when the vLLM version was unknown and the releases differ.
        source: where the choice comes from: ``asked the installed vLLM 0.x.y``,
            ``vLLM's 0.x.y source, opsbook table`` (the facts read from that release) or
            ``opsbook table compat_rules.yaml`` (releases without a priority function).
    """

    name: str | None
    candidates: tuple[str, ...]
    reasons: dict[str, list[str]] = field(default_factory=dict)
    forced: str | None = None
    uncertain: bool = False
    source: str = ""

    def reasons_text(self) -> str:
        """The reasons in the form of vLLM's error message: ``{A: [r1, r2], B: [r]}``."""
        inner = ", ".join(f"{name}: [{', '.join(r)}]" for name, r in self.reasons.items())
        return "{" + inner + "}"


def release_facts(vllm_version: str | None) -> ReleaseFacts | None:
    """The facts of the nearest release at or below ``vllm_version`` (None when unknown or
    older than every release read)."""
    if not vllm_version or parse_version(vllm_version) is None:
        return None
    try:
        return vllm_facts.for_version(vllm_version)
    except OpsbookError:
        return None


def facts_source(release: ReleaseFacts) -> str:
    """How a verdict names a prediction taken from a release's source."""
    return f"vLLM's {release.version} source, opsbook table"


def _selecting_releases() -> list[ReleaseFacts]:
    return [f for f in map(vllm_facts.load, vllm_facts.releases()) if f.priorities]


def backend_kv_dtypes(
    name: str,
    vllm_version: str | None,
    probed_backends: Mapping[str, Sequence[str]] | None = None,
) -> tuple[list[str], bool, str]:
    """The KV dtypes a backend supports in a vLLM version.

    Args:
        name: the backend (``TRITON_MLA``).
        vllm_version: the installed vLLM version, or None when unknown.
        probed_backends: backend name to ``supported_kv_cache_dtypes`` read from the installed
            vLLM; takes precedence over the facts of the release.

    Returns:
        ``(dtypes, certain, source)``. With an unknown version, the dtypes every release read
        supports are given and ``certain`` is False when the releases differ.
    """
    if probed_backends and name in probed_backends:
        return [str(d) for d in probed_backends[name]], True, "probed on the host"
    release = release_facts(vllm_version)
    if release is not None and name in release.backends:
        return (
            _fact_dtypes(release, name),
            True,
            release.source(release.backends[name].kv_cache_dtypes_source),
        )
    if vllm_version is None:
        per_release = [_fact_dtypes(r, name) for r in _selecting_releases() if name in r.backends]
        if per_release:
            in_all = [d for d in per_release[-1] if all(d in other for other in per_release)]
            same = all(set(p) == set(per_release[0]) for p in per_release)
            return in_all, same, "version unknown: dtypes supported in every release read"
    entries = rules_table.load_rules().backends[name].kv_cache_dtypes
    version = parse_version(vllm_version)
    for entry in entries:
        if version_in(version, entry.versions) is True and version is not None:
            return list(entry.dtypes), True, entry.source
    common = set.intersection(*(set(e.dtypes) for e in entries))
    ordered = [d for d in entries[0].dtypes if d in common]
    return ordered, len(entries) == 1, "version unknown: dtypes supported in every release"


def _fact_dtypes(release: ReleaseFacts, name: str) -> list[str]:
    backend = release.backends[name]
    # A class that declares no list is not checked by the selector: every CacheDType passes.
    declared = list(backend.kv_cache_dtypes or release.cache_dtypes)
    if backend.fp8_refusal:
        declared = [d for d in declared if not d.startswith("fp8")]
    return declared


def select_backend(
    mla: bool,
    compute_cap: str,
    kv_cache_dtype: str,
    vllm_version: str | None,
    *,
    sparse: bool = False,
    forced: str | None = None,
    probed_backends: Mapping[str, Sequence[str]] | None = None,
    num_heads: int | None = None,
    head_size: int | None = None,
) -> BackendChoice:
    """Choose the attention backend as vLLM's CUDA selector does.

    For a release read by ``tools/vllm_facts.py`` the choice follows that release's own
    priority list and its backend classes' declarations (``opsbook/knowledge/data/vllm_facts``);
    with
    the version unknown, every release read is asked and the choice is uncertain when they
    differ; releases without a priority function (0.10.x) use the table of
    ``compat_rules.yaml``.

    Args:
        mla: whether the model uses MLA attention.
        compute_cap: the GPU's compute capability, e.g. ``"12.0"``.
        kv_cache_dtype: the resolved KV-cache dtype (``auto``, ``fp8_e4m3``...).
        vllm_version: the installed vLLM version, or None when unknown.
        sparse: whether the MLA is sparse (DeepSeek-V3.2 DSA).
        forced: a backend asked for with ``--attention-backend``.
        probed_backends: KV dtypes read from the installed vLLM's backends (take precedence).
        num_heads: attention heads (vLLM's sparse MLA order depends on it).
        head_size: the head size the selector sees (576 for DeepSeek MLA).

    Returns:
        The :class:`BackendChoice`.
    """
    release = release_facts(vllm_version)
    if isinstance(probed_backends, InstalledVllm) and not forced:
        asked = probed_backends.selection(compute_cap, mla, kv_cache_dtype)
        if asked is not None:
            return _from_installed(probed_backends, asked, release, mla, sparse, head_size)
    args = (mla, sparse, compute_cap, kv_cache_dtype, forced, probed_backends, num_heads, head_size)
    if release is not None and release.priorities:
        return _select_from_facts(release, *args)
    if vllm_version is None:
        choices = [_select_from_facts(r, *args) for r in _selecting_releases()]
        if choices:
            newest = choices[-1]
            differ = len({c.name for c in choices}) > 1
            return BackendChoice(
                newest.name,
                newest.candidates,
                newest.reasons,
                forced,
                uncertain=differ,
                source=f"version unknown: {len(choices)} releases read "
                + ("disagree" if differ else "agree"),
            )
    return _select_from_table(
        mla, compute_cap, kv_cache_dtype, vllm_version, sparse, forced, probed_backends
    )


def _from_installed(
    installed: InstalledVllm,
    asked: ProbedSelection,
    release: ReleaseFacts | None,
    mla: bool,
    sparse: bool,
    head_size: int | None,
) -> BackendChoice:
    """The installed vLLM's own choice; its implementation's FP8 capability gate (read from
    the release's source: ``validate_configuration`` does not check it) is added."""
    reasons = {k: list(v) for k, v in asked.reasons.items()}
    chosen = asked.chosen
    if chosen and release is not None and chosen in release.backends:
        gate = release.backends[chosen].fp8_min_capability
        cc, kv = asked.compute_capability, asked.kv_cache_dtype
        if gate and kv.startswith("fp8") and capability_int(cc) < gate:
            reasons[chosen] = [f"FP8 KV cache needs compute capability {gate / 10:.1f}"]
            chosen = None
    return BackendChoice(chosen, asked.order, reasons, None, source=installed.source)


def _select_from_facts(
    release: ReleaseFacts,
    mla: bool,
    sparse: bool,
    cc: str,
    kv: str,
    forced: str | None,
    probed: Mapping[str, Sequence[str]] | None,
    num_heads: int | None,
    head_size: int | None,
) -> BackendChoice:
    candidates = release.priority(cc, mla, kv, num_heads, head_size) or ()
    reasons: dict[str, list[str]] = {}
    for name in [forced] if forced else candidates:
        why = fact_reasons(release, name, mla, sparse, cc, kv, head_size, probed)
        if not why:
            return BackendChoice(name, candidates, reasons, forced, source=facts_source(release))
        reasons[name] = why
    return BackendChoice(None, candidates, reasons, forced, source=facts_source(release))


def fact_reasons(
    release: ReleaseFacts,
    name: str,
    mla: bool,
    sparse: bool,
    cc: str,
    kv: str,
    head_size: int | None,
    probed: Mapping[str, Sequence[str]] | None = None,
) -> list[str]:
    """vLLM's ``validate_configuration`` reasons for one backend of a release, in its words,
    plus the FP8-KV capability gate its implementation raises at start-up."""
    backend = release.backends.get(name)
    if backend is None:
        return ["backend not in this release's registry"]
    reasons = []
    if backend.mla is not None and backend.mla != mla:
        reasons.append("MLA not supported" if mla else "non-MLA not supported")
    if bool(backend.sparse) != sparse:
        reasons.append("sparse not supported" if sparse else "non-sparse not supported")
    if not backend.supports_head_size(head_size):
        reasons.append("head_size not supported")
    if backend.supports_capability(cc) is False:
        reasons.append("compute capability not supported")
    if probed and name in probed:
        kv_ok = kv in probed[name]
    else:
        kv_ok = backend.supports_kv_dtype(kv)
    if not kv_ok:
        reasons.append("kv_cache_dtype not supported")
    gate = backend.fp8_min_capability
    if kv_ok and gate and kv.startswith("fp8") and capability_int(cc) < gate:
        reasons.append(f"FP8 KV cache needs compute capability {gate / 10:.1f}")
    return reasons


def _select_from_table(
    mla: bool,
    compute_cap: str,
    kv_cache_dtype: str,
    vllm_version: str | None,
    sparse: bool,
    forced: str | None,
    probed_backends: Mapping[str, Sequence[str]] | None,
) -> BackendChoice:
    table = rules_table.load_rules()
    priority = next(
        p for p in table.priorities if capability_matches(compute_cap, p.compute_capability)
    )
    candidates = [
        n
        for n in priority.order(mla, sparse)
        if _available(n, vllm_version, probed_backends) is not False
    ]
    uncertain = False
    reasons: dict[str, list[str]] = {}
    tried = [forced] if forced else candidates
    for name in tried:
        why, sure = _backend_reasons(
            name, mla, sparse, compute_cap, kv_cache_dtype, vllm_version, probed_backends
        )
        uncertain = uncertain or not sure
        if not why:
            return BackendChoice(
                name, tuple(candidates), reasons, forced, uncertain, source=TABLE_SOURCE
            )
        reasons[name] = why
    return BackendChoice(None, tuple(candidates), reasons, forced, uncertain, source=TABLE_SOURCE)


def _available(
    name: str, vllm_version: str | None, probed: Mapping[str, Sequence[str]] | None
) -> bool | None:
    if probed and name in probed:
        return True
    spec = rules_table.load_rules().backends[name].available
    return version_in(parse_version(vllm_version), spec)


def _backend_reasons(
    name: str,
    mla: bool,
    sparse: bool,
    cc: str,
    kv: str,
    vllm_version: str | None,
    probed: Mapping[str, Sequence[str]] | None,
) -> tuple[list[str], bool]:
    """The table's reasons for one backend, and whether they are certain."""
    spec = rules_table.load_rules().backends.get(name)
    if spec is None:
        return ["unknown backend"], True
    reasons = []
    if spec.mla != mla:
        reasons.append("MLA not supported" if mla else "non-MLA not supported")
    if spec.sparse != sparse:
        reasons.append("sparse not supported" if sparse else "non-sparse not supported")
    if not capability_matches(cc, spec.compute_capability):
        reasons.append("compute capability not supported")
    dtypes, certain, _ = backend_kv_dtypes(name, vllm_version, probed)
    if kv not in dtypes:
        reasons.append("kv_cache_dtype not supported")
    return reasons, certain


def min_capability(method: str, vllm_version: str | None) -> tuple[int | None, bool, str]:
    """A quantization method's minimum compute capability (``major*10+minor``).

    Returns:
        ``(value, certain, source)``: from the release's ``get_min_capability``; with the
        version unknown, the newest release's value, uncertain when releases differ; from the
        table for releases without facts. ``value`` is None when nothing is known.
    """
    release = release_facts(vllm_version)
    if release is not None:
        method_facts = release.quant_methods.get(method)
        if method_facts is None or method_facts.min_capability is None:
            return None, True, release.source(None)
        return method_facts.min_capability, True, release.source(method_facts.file)
    if vllm_version is None:
        values = [
            m.min_capability
            for m in (vllm_facts.load(r).quant_methods.get(method) for r in vllm_facts.releases())
            if m is not None and m.min_capability is not None
        ]
        if values:
            return values[-1], len(set(values)) == 1, "version unknown: newest release read"
    spec = rules_table.load_rules().quantization_methods.get(method)
    if spec is None:
        return None, True, TABLE_SOURCE
    return spec.min_capability, True, spec.source or TABLE_SOURCE
