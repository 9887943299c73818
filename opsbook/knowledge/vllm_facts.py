"""Facts about vLLM releases, read from their source by ``tools/vllm_facts.py``.

The data lives in ``opsbook/knowledge/data/vllm_facts/<version>.json`` (one file per release, the
latest
patch of each minor) with an ``index.json``. :func:`for_version` gives the facts of the nearest
release at or below a version, as typed records; every fact carries the file of vLLM's source
it came from, so a verdict can cite "vLLM 0.33.0 vllm/platforms/cuda.py".
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from typing import Any

from opsbook.core.exceptions import OpsbookError

DATA_DIR = "vllm_facts"
# The KV dtypes a priority case was evaluated with: vLLM's lists differ only by whether the
# KV cache is quantized (is_quantized_kv_cache), so these two stand for all dtypes.
UNQUANTIZED_KV = "auto"
QUANTIZED_KV = "fp8_e4m3"


@dataclass(frozen=True)
class Sourced:
    """Where a fact came from: a file inside the release's wheel."""

    version: str
    file: str

    def __str__(self) -> str:
        return f"vLLM {self.version} {self.file}"


@dataclass(frozen=True)
class BackendFacts:
    """One attention backend of one release, as its class declares it.

    Attributes:
        name: the registry name (``TRITON_MLA``).
        class_path: ``module.Class``.
        file: the module holding the class.
        kv_cache_dtypes: ``supported_kv_cache_dtypes`` (None: the class declares none, so the
            selector does not check the KV dtype; an empty tuple means any).
        kv_cache_dtypes_source: where that list is defined (the class or a base class).
        compute_capabilities: the evaluated capabilities ``supports_compute_capability``
            accepts (None: not declared or not evaluable).
        capability_expression: the body of ``supports_compute_capability``.
        head_sizes: ``get_supported_head_sizes()`` (empty: any; None: not declared).
        mla: ``is_mla()``.
        sparse: ``is_sparse()``.
        fp8_min_capability: an FP8-KV capability gate in the backend's module
            (``has_device_capability(89)``), if any.
        fp8_refusal: an FP8-KV ``NotImplementedError`` text in the module, if any.
    """

    name: str
    class_path: str
    file: str
    kv_cache_dtypes: tuple[str, ...] | None
    kv_cache_dtypes_source: str | None
    compute_capabilities: tuple[str, ...] | None
    capability_expression: str | None
    capability_source: str | None
    head_sizes: tuple[int, ...] | None
    mla: bool | None
    sparse: bool | None
    fp8_min_capability: int | None
    fp8_refusal: str | None

    def supports_capability(self, cc: str) -> bool | None:
        """Whether ``supports_compute_capability`` accepts ``cc`` (None: not known)."""
        if self.compute_capabilities is None:
            return None
        return nearest_capability(cc, EVALUATED) in self.compute_capabilities

    def supports_kv_dtype(self, dtype: str) -> bool:
        """vLLM's ``supports_kv_cache_dtype`` plus an FP8 refusal in the implementation."""
        if dtype.startswith("fp8") and self.fp8_refusal:
            return False
        if not self.kv_cache_dtypes:
            return True
        return dtype in self.kv_cache_dtypes

    def supports_head_size(self, head_size: int | None) -> bool:
        if head_size is None or not self.head_sizes:
            return True
        return head_size in self.head_sizes


@dataclass(frozen=True)
class PriorityCase:
    """One evaluation of ``_get_backend_priorities``."""

    compute_capability: str
    use_mla: bool
    kv_cache_dtype: str
    num_heads: int
    head_size: int
    backends: tuple[str, ...]


@dataclass(frozen=True)
class QuantMethod:
    """A quantization method's ``get_min_capability`` (None: not a literal)."""

    name: str
    min_capability: int | None
    class_name: str
    file: str


@dataclass(frozen=True)
class MetricFact:
    """A Prometheus metric a release's V1 stat loggers create.

    Attributes:
        name: the metric's name (``vllm:num_preemptions``).
        kind: ``gauge``, ``counter`` or ``histogram``.
        samples: the sample names ``/metrics`` shows for it (a counter's ``_total``).
        hidden: created only with ``--show-hidden-metrics-for-version`` (a deprecated name).
        deprecated_for: the metric its documentation says to use instead, if any.
        file: the module creating it.
    """

    name: str
    kind: str
    samples: tuple[str, ...]
    hidden: bool
    deprecated_for: str | None
    file: str


@dataclass(frozen=True)
class ReleaseFacts:
    """Everything extracted from one vLLM release."""

    version: str
    wheel: str
    backends: Mapping[str, BackendFacts]
    backends_source: str | None
    priorities: tuple[PriorityCase, ...]
    priorities_source: str | None
    priorities_note: str | None
    mla_model_types: tuple[str, ...]
    mla_model_types_file: str | None
    cache_dtypes: tuple[str, ...]
    cache_dtypes_file: str | None
    torch_dtypes: Mapping[str, str]
    torch_dtypes_file: str | None
    modelopt_kv_map: Mapping[str, str]
    modelopt_kv_map_file: str | None
    quant_methods: Mapping[str, QuantMethod]
    serve_flags: frozenset[str] = field(default_factory=frozenset)
    metrics: Mapping[str, MetricFact] = field(default_factory=dict)
    # The VLLM_* variables the release reads (vllm/envs.py environment_variables); empty: not
    # extracted, so nothing can be said of a variable.
    env_vars: frozenset[str] = field(default_factory=frozenset)
    env_vars_source: str | None = None

    def exported_metrics(self) -> dict[str, MetricFact]:
        """The metrics ``/metrics`` shows by default (hidden ones left out), by name."""
        return {name: fact for name, fact in self.metrics.items() if not fact.hidden}

    def source(self, file: str | None) -> str:
        """``vLLM <version> <file>``: how a verdict cites a fact of this release."""
        return str(Sourced(self.version, file or "(file unknown)"))

    def priority(
        self,
        cc: str,
        mla: bool,
        kv_cache_dtype: str,
        num_heads: int | None = None,
        head_size: int | None = None,
    ) -> tuple[str, ...] | None:
        """vLLM's backend priority list for this case, or None when not extracted.

        ``cc`` not among the evaluated capabilities takes the nearest evaluated one of the
        same major at or below it (vLLM's lists switch on the major).
        """
        if not self.priorities:
            return None
        cap = nearest_capability(cc, EVALUATED)
        kv = QUANTIZED_KV if is_quantized_kv(kv_cache_dtype) else UNQUANTIZED_KV
        heads = 16 if num_heads is not None and num_heads <= 16 else 128
        size = (512 if head_size == 512 else 576) if mla else 128
        for case in self.priorities:
            if (
                case.compute_capability == cap
                and case.use_mla == mla
                and case.kv_cache_dtype == kv
                and case.num_heads == heads
                and case.head_size == size
            ):
                return case.backends
        return None

    def reads_env(self, name: str) -> bool | None:
        """Whether the release reads the ``VLLM_*`` variable ``name`` (None: not known)."""
        return name in self.env_vars if self.env_vars else None

    def flags_refused(self, serve_args: Iterable[str]) -> list[str]:
        """The ``server.args`` names (without ``--``) whose flag this release's parser lacks;
        a dotted name sets one key of a JSON argument, so its head is the flag. Empty when the
        release's flags are not known."""
        if not self.serve_flags:
            return []
        names = [str(name).removeprefix("--") for name in serve_args]
        return [n for n in names if "--" + n.split(".")[0] not in self.serve_flags]

    def kv_dtype_known(self, dtype: str) -> bool:
        """Whether ``--kv-cache-dtype dtype`` is a value this release accepts."""
        return dtype in self.cache_dtypes


EVALUATED: tuple[str, ...] = (
    "7.0",
    "7.5",
    "8.0",
    "8.6",
    "8.9",
    "9.0",
    "10.0",
    "10.3",
    "11.0",
    "12.0",
    "12.1",
)


def is_quantized_kv(dtype: str) -> bool:
    """A KV dtype other than the model's own 16-bit types (fp8*, nvfp4, int8...)."""
    return dtype not in ("auto", "float16", "bfloat16", "half", "float32", "float")


def _cap_tuple(cc: str) -> tuple[int, int]:
    major, _, minor = cc.partition(".")
    return int(major), int(minor or 0)


def nearest_capability(cc: str, evaluated: tuple[str, ...]) -> str:
    """The evaluated capability standing for ``cc``: same major at or below, else the
    highest one below."""
    want = _cap_tuple(cc)
    caps = sorted(_cap_tuple(c) for c in evaluated)
    same = [c for c in caps if c[0] == want[0] and c <= want]
    below = same or [c for c in caps if c <= want] or caps[:1]
    major, minor = below[-1]
    return f"{major}.{minor}"


def version_key(version: str) -> tuple[int, int, int]:
    """``"0.15.1"`` -> ``(0, 15, 1)``; local or pre-release suffixes are ignored."""
    nums = [int(p) for p in re.findall(r"\d+", version.split("+")[0])[:3]]
    if not nums:
        raise OpsbookError(
            f"not a vLLM version: {version!r}", remedy="give a version such as 0.15.1"
        )
    nums += [0] * (3 - len(nums))
    return nums[0], nums[1], nums[2]


@lru_cache(maxsize=1)
def _index() -> tuple[dict[str, Any], ...]:
    return tuple(json.loads(_data_file("index.json"))["releases"])


@lru_cache(maxsize=1)
def releases() -> tuple[str, ...]:
    """The releases with facts, oldest first."""
    return tuple(sorted((str(r["version"]) for r in _index()), key=version_key))


def every_release_mla_model_types() -> tuple[str, ...]:
    """The model types any release's ``is_deepseek_mla`` takes for MLA, from the index (the
    same lists as each release's file, without parsing them all)."""
    return tuple(sorted({str(t) for r in _index() for t in r["mla_model_types"]}))


def every_release_modelopt_kv_map() -> dict[str, str]:
    """Every release's ``MODELOPT_TO_VLLM_KV_CACHE_DTYPE_MAP`` entries, oldest first (a later
    release's value wins), from the index."""
    ordered = sorted(_index(), key=lambda r: version_key(str(r["version"])))
    return {str(k): str(v) for r in ordered for k, v in r["modelopt_kv_map"].items()}


def release_at_or_below(version: str) -> str:
    """The newest release with facts that is not newer than ``version``.

    Raises:
        OpsbookError: ``version`` is older than every release with facts.
    """
    want = version_key(version)
    older = [r for r in releases() if version_key(r) <= want]
    if not older:
        raise OpsbookError(
            f"no vLLM facts for {version}: the oldest release read is {releases()[0]}",
            remedy="run tools/vllm_facts.py on that release's wheel, or upgrade vLLM",
        )
    return older[-1]


def for_version(version: str) -> ReleaseFacts:
    """The facts of the nearest release at or below ``version``."""
    return load(release_at_or_below(version))


@lru_cache(maxsize=64)
def load(release: str) -> ReleaseFacts:
    """The facts of exactly ``release`` (one of :func:`releases`)."""
    if release not in releases():
        raise OpsbookError(
            f"no vLLM facts file for {release}",
            remedy=f"use one of {', '.join(releases())}, or run tools/vllm_facts.py",
        )
    return parse(json.loads(_data_file(f"{release}.json")))


def _data_file(name: str) -> str:
    return (
        resources.files("opsbook.knowledge")
        .joinpath("data", DATA_DIR, name)
        .read_text(encoding="utf-8")
    )


# --------------------------------------------------------------------------------------------
# Parsing the JSON (the only place that reads it by key)


def parse(data: Mapping[str, Any]) -> ReleaseFacts:
    """Typed facts from one release's JSON as ``tools/vllm_facts.py`` writes it."""
    version = str(data["vllm_version"])
    attention = data.get("attention_backends") or {}
    priorities = data.get("backend_priorities") or {}
    mla = data.get("mla_model_types") or {}
    kv = data.get("kv_cache_dtypes") or {}
    literal = kv.get("cache_dtype_literal") or {}
    torch_map = kv.get("str_dtype_to_torch_dtype") or {}
    modelopt = kv.get("modelopt_to_vllm") or {}
    return ReleaseFacts(
        version=version,
        wheel=str(data.get("wheel", "")),
        backends={
            name: _backend(name, raw)
            for name, raw in (attention.get("backends") or {}).items()
            if "error" not in raw
        },
        backends_source=attention.get("source"),
        priorities=tuple(_case(c) for c in priorities.get("cases") or []),
        priorities_source=priorities.get("source"),
        priorities_note=priorities.get("note"),
        mla_model_types=tuple(mla.get("types") or ()),
        mla_model_types_file=mla.get("file"),
        cache_dtypes=tuple(literal.get("values") or ()),
        cache_dtypes_file=literal.get("file"),
        torch_dtypes=dict(torch_map.get("values") or {}),
        torch_dtypes_file=torch_map.get("file"),
        modelopt_kv_map=dict(modelopt.get("values") or {}),
        modelopt_kv_map_file=modelopt.get("file"),
        quant_methods={
            name: QuantMethod(name, raw.get("min_capability"), raw["class"], raw["file"])
            for name, raw in (data.get("quantization_methods") or {}).items()
        },
        serve_flags=frozenset((data.get("serve_flags") or {}).get("flags") or {}),
        metrics={
            name: _metric(name, raw)
            for name, raw in ((data.get("metrics") or {}).get("metrics") or {}).items()
        },
        env_vars=frozenset((data.get("env_vars") or {}).get("names") or ()),
        env_vars_source=(data.get("env_vars") or {}).get("source"),
    )


def _metric(name: str, raw: Mapping[str, Any]) -> MetricFact:
    return MetricFact(
        name=name,
        kind=str(raw["type"]),
        samples=tuple(raw["samples"]),
        hidden=bool(raw["hidden"]),
        deprecated_for=raw.get("deprecated_for"),
        file=str(raw["file"]),
    )


def _value(raw: Mapping[str, Any] | None) -> Any:
    return None if raw is None else raw.get("value")


def _backend(name: str, raw: Mapping[str, Any]) -> BackendFacts:
    kv = raw.get("kv_cache_dtypes")
    cap = raw.get("compute_capability") or {}
    heads = _value(raw.get("head_sizes"))
    gates = raw.get("fp8_kv_gates") or []
    min_caps = [g["value"] for g in gates if g["kind"] == "min_capability"]
    refusals = [g["value"] for g in gates if g["kind"] == "raises"]
    supported = cap.get("supported")
    kv_value = _value(kv)
    return BackendFacts(
        name=name,
        class_path=str(raw["class"]),
        file=str(raw["file"]),
        kv_cache_dtypes=None if kv_value is None else tuple(kv_value),
        kv_cache_dtypes_source=None if kv is None else kv.get("file"),
        compute_capabilities=None if supported is None else tuple(supported),
        capability_expression=cap.get("expression"),
        capability_source=cap.get("file"),
        head_sizes=None if heads is None else tuple(heads),
        mla=_value(raw.get("is_mla")),
        sparse=_value(raw.get("is_sparse")),
        fp8_min_capability=max(min_caps) if min_caps else None,
        fp8_refusal=refusals[0] if refusals else None,
    )


def _case(raw: Mapping[str, Any]) -> PriorityCase:
    return PriorityCase(
        compute_capability=str(raw["compute_capability"]),
        use_mla=bool(raw["use_mla"]),
        kv_cache_dtype=str(raw["kv_cache_dtype"]),
        num_heads=int(raw["num_heads"]),
        head_size=int(raw["head_size"]),
        backends=tuple(raw["backends"]),
    )
