"""Predict whether vLLM will serve a checkpoint on given GPUs, before it reads 540 GB.

Three parts:

- :func:`model_facts` reads what matters from a checkpoint's ``config.json``,
  ``hf_quant_config.json`` and ``tokenizer_config.json``: MLA or not, the attention head size
  the backend selector sees, the quantization and the KV-cache dtype resolved as vLLM resolves
  it, whether remote code is needed, the layer count.
- :func:`select_backend` chooses an attention backend the way vLLM's selector does: the
  installed vLLM's own answer when :func:`probe_backends` asked it, else the release's own
  priority list and backend declarations (``opsbook/knowledge/data/vllm_facts``, read from its
  source by
  ``tools/vllm_facts.py``), else the fallback table of ``opsbook/knowledge/data/compat_rules.yaml``
  (releases before 0.11.2). The choice names its source.
- :func:`check_compat` evaluates the rules of ``compat_rules.yaml`` (conditions, the real
  failure text, the remedy, the source) and returns a :class:`~opsbook.core.results.Result`.

:func:`kv_cache_bytes_per_token` and :func:`tokens_that_fit` size the KV cache, to explain
what a BF16 KV cache costs against FP8 (or NVFP4).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from functools import lru_cache
from importlib import resources
from typing import Any

import yaml

from opsbook.core.exceptions import OpsbookError
from opsbook.core.results import Finding, Result, Table
from opsbook.knowledge import vllm_facts
from opsbook.knowledge.vllm_facts import ReleaseFacts
from opsbook.remote.protocol import RemoteHost

RULES_FILE = "compat_rules.yaml"
CONFIG_FILES = ("config.json", "hf_quant_config.json", "tokenizer_config.json")
FINDING_COLUMNS = ["severity", "what will happen", "why", "fix", "source"]

# MLA model types: vLLM's is_deepseek_mla list, read per release into
# opsbook/knowledge/data/vllm_facts.
# A checkpoint is read before the version is known, so the union of every release is used here
# and check_compat narrows it to the installed release.
MLA_MODEL_TYPES = tuple(
    sorted({t for r in vllm_facts.releases() for t in vllm_facts.load(r).mla_model_types})
)
# Sparse (DSA) MLA: vLLM's DeepSeek model code sets is_sparse when the config has index_topk
# (vLLM 0.33.0 vllm/model_executor/models/deepseek_v2.py); these types always carry it.
SPARSE_MLA_MODEL_TYPES = ("deepseek_v32", "glm_moe_dsa")
# MODELOPT_TO_VLLM_KV_CACHE_DTYPE_MAP (vllm/utils/torch_utils.py), every release's entries.
MODELOPT_TO_VLLM_KV_CACHE_DTYPE = {
    k: v for r in vllm_facts.releases() for k, v in vllm_facts.load(r).modelopt_kv_map.items()
}
KV_DTYPE_BYTES = {
    "auto": 2,
    "bfloat16": 2,
    "float16": 2,
    "half": 2,
    "float32": 4,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "fp8_inc": 1,
}
# nvfp4 packs each head's values into head_size // 2 bytes of FP4 data plus head_size // 16
# bytes of FP8 block scales (vLLM 0.33.0 vllm/utils/torch_utils.py::nvfp4_kv_cache_full_dim).
NVFP4_KV_DTYPES = ("nvfp4", "nvfp4_4over6")
# fp8_ds_mla packs a 576-wide MLA entry into 656 bytes (vllm-project/vllm#52202).
FP8_DS_MLA_BYTES_PER_LAYER = 656
ATTENTION_BACKEND_ARGS = ("attention-backend", "attention-config.backend", "ac.backend")


@dataclass(frozen=True)
class ModelFacts:
    """What a checkpoint's config files say that decides how vLLM will serve it.

    Attributes:
        architectures: top-level then ``text_config`` architectures, without repeats.
        model_type: the top-level ``model_type``.
        text_model_type: ``model_type`` of the text model (``text_config`` when present).
        mla: whether vLLM will use MLA attention (model type family and ``kv_lora_rank``).
        sparse_mla: whether the MLA is the sparse (DSA) kind of DeepSeek-V3.2.
        head_size: attention head size as the backend selector sees it
            (``kv_lora_rank + qk_rope_head_dim`` for MLA).
        kv_lora_rank: MLA latent size.
        qk_rope_head_dim: MLA rotary part.
        num_layers: decoder layers, for KV sizing.
        num_kv_heads: key/value heads (non-MLA KV sizing).
        head_dim: per-head size (non-MLA KV sizing).
        quant_method: the quantization method as vLLM names it (``modelopt_fp4``...).
        quant_algo: the ModelOpt algorithm (``NVFP4``, ``FP8``...).
        quant_source: which file and key vLLM reads the quantization from.
        quant_sources: every place that declares a quantization.
        kv_cache_algo: the checkpoint's KV-cache algorithm (``FP8``), or None.
        kv_cache_dtype: the KV dtype ``--kv-cache-dtype auto`` resolves to.
        kv_cache_keys: every key that declares a KV-cache quantization.
        remote_code: why remote code is needed (``auto_map`` entries); empty if it is not.
        notes: anything odd found on the way.
    """

    architectures: tuple[str, ...] = ()
    model_type: str | None = None
    text_model_type: str | None = None
    mla: bool = False
    sparse_mla: bool = False
    head_size: int | None = None
    kv_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    num_layers: int | None = None
    num_kv_heads: int | None = None
    head_dim: int | None = None
    quant_method: str | None = None
    quant_algo: str | None = None
    quant_source: str | None = None
    quant_sources: tuple[str, ...] = ()
    kv_cache_algo: str | None = None
    kv_cache_dtype: str = "auto"
    kv_cache_keys: tuple[str, ...] = ()
    remote_code: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def needs_remote_code(self) -> bool:
        return bool(self.remote_code)

    def table(self) -> Table:
        """The facts as a two-column table for a notebook."""
        rows = [[name, _show(value)] for name, value in asdict(self).items()]
        return Table(["fact", "value"], rows)


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


# --------------------------------------------------------------------------------------------
# Model facts


def model_facts(
    config: dict[str, Any],
    hf_quant_config: dict[str, Any] | None,
    tokenizer_config: dict[str, Any] | None = None,
) -> ModelFacts:
    """Read the facts that decide backend selection and KV cache from a checkpoint's configs.

    Args:
        config: the parsed ``config.json``.
        hf_quant_config: the parsed ``hf_quant_config.json``, or None when there is none.
        tokenizer_config: the parsed ``tokenizer_config.json``, or None.

    Returns:
        The :class:`ModelFacts`.
    """
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else None
    tc: dict[str, Any] = text or config
    notes: list[str] = []
    kv_lora_rank = _int_or_none(tc.get("kv_lora_rank"))
    rope = _int_or_none(tc.get("qk_rope_head_dim"))
    text_model_type = tc.get("model_type")
    mla = text_model_type in MLA_MODEL_TYPES and kv_lora_rank is not None
    if kv_lora_rank is not None and not mla:
        notes.append(
            f"kv_lora_rank is set but model_type {text_model_type!r} is not in vLLM's MLA list: "
            "assumed to use standard attention"
        )
    sparse = mla and (text_model_type in SPARSE_MLA_MODEL_TYPES or "index_topk" in tc)
    heads = _int_or_none(tc.get("num_attention_heads"))
    head_dim = _int_or_none(tc.get("head_dim"))
    hidden = _int_or_none(tc.get("hidden_size"))
    if head_dim is None and heads and hidden:
        head_dim = hidden // heads
    head_size = kv_lora_rank + (rope or 0) if mla and kv_lora_rank is not None else head_dim
    quant = _read_quantization(config, hf_quant_config, notes)
    return ModelFacts(
        architectures=_architectures(config),
        model_type=config.get("model_type"),
        text_model_type=text_model_type,
        mla=mla,
        sparse_mla=sparse,
        head_size=head_size,
        kv_lora_rank=kv_lora_rank,
        qk_rope_head_dim=rope,
        num_layers=_int_or_none(tc.get("num_hidden_layers")),
        num_kv_heads=_int_or_none(tc.get("num_key_value_heads")) or heads,
        head_dim=head_dim,
        quant_method=quant["method"],
        quant_algo=quant["algo"],
        quant_source=quant["source"],
        quant_sources=tuple(quant["sources"]),
        kv_cache_algo=quant["kv_algo"],
        kv_cache_dtype=quant["kv_dtype"],
        kv_cache_keys=tuple(quant["kv_keys"]),
        remote_code=_remote_code_reasons(config, tokenizer_config),
        notes=tuple(notes),
    )


def facts_from_texts(files: Mapping[str, str | None]) -> ModelFacts:
    """:func:`model_facts` from the texts of the config files (as :func:`read_configs` gives).

    Args:
        files: file name to text (or None when the file is absent); ``config.json`` is required.

    Returns:
        The :class:`ModelFacts`.

    Raises:
        OpsbookError: ``config.json`` is missing or a file is not valid JSON.
    """
    if not files.get("config.json"):
        raise OpsbookError(
            "config.json is missing from the model directory",
            remedy="point model.path at the checkpoint directory (the one holding config.json)",
        )
    parsed = {name: parse_json(name, text) for name, text in files.items() if text}
    return model_facts(
        parsed["config.json"],
        parsed.get("hf_quant_config.json"),
        parsed.get("tokenizer_config.json"),
    )


def _architectures(config: Mapping[str, Any]) -> tuple[str, ...]:
    found: list[str] = list(config.get("architectures") or [])
    text = config.get("text_config")
    if isinstance(text, dict):
        found += list(text.get("architectures") or [])
    return tuple(dict.fromkeys(found))


def _read_quantization(
    config: Mapping[str, Any], hf_quant: Mapping[str, Any] | None, notes: list[str]
) -> dict[str, Any]:
    """Which quantization vLLM uses, and the KV dtype that follows from it.

    vLLM reads config.json's ``quantization_config`` first (ModelOpt >= 0.31) and loads
    ``hf_quant_config.json`` (ModelOpt <= 0.29) only when that is absent; multimodal wrappers
    may keep it in ``text_config``.
    """
    text = config.get("text_config")
    text = text if isinstance(text, dict) else {}
    places: list[tuple[str, Mapping[str, Any]]] = []
    if isinstance(config.get("quantization_config"), dict):
        places.append(("config.json:quantization_config", config["quantization_config"]))
    if isinstance(hf_quant, dict) and hf_quant:
        places.append(("hf_quant_config.json", hf_quant))
    if isinstance(text.get("quantization_config"), dict):
        places.append(("config.json:text_config.quantization_config", text["quantization_config"]))
    kv_keys = [key for place, qc in places for key in _kv_keys(place, qc)]
    if not places:
        return {
            "method": None,
            "algo": None,
            "source": None,
            "sources": [],
            "kv_algo": None,
            "kv_dtype": "auto",
            "kv_keys": kv_keys,
        }
    source, chosen = places[0]
    method, algo = _quant_method(chosen)
    kv_raw = _kv_value(chosen)
    kv_algo, kv_dtype = _resolve_kv(kv_raw, method, notes)
    for other, qc in places[1:]:
        other_algo, _ = _resolve_kv(_kv_value(qc), _quant_method(qc)[0], [])
        if other_algo != kv_algo:
            notes.append(
                f"{other} declares KV cache {other_algo or 'none'} but vLLM reads {source} "
                f"({kv_algo or 'none'}); edit both to keep them consistent"
            )
    return {
        "method": method,
        "algo": algo,
        "source": source,
        "sources": [p for p, _ in places],
        "kv_algo": kv_algo,
        "kv_dtype": kv_dtype,
        "kv_keys": kv_keys,
    }


def _quant_method(qc: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """vLLM's name for a quantization config, normalised as ModelConfig does for ModelOpt."""
    legacy = qc.get("quantization")
    algo = (legacy if isinstance(legacy, dict) else qc).get("quant_algo")
    algo = str(algo).upper() if algo else None
    method = qc.get("quant_method")
    producer = qc.get("producer")
    producer = producer if isinstance(producer, dict) else {}
    is_modelopt = (method and str(method).lower().startswith("modelopt")) or (
        str(producer.get("name", "")).lower() == "modelopt"
    )
    if is_modelopt:
        return ("modelopt_fp4" if algo and "FP4" in algo else "modelopt"), algo
    return (str(method).lower() if method else None), algo


def _kv_value(qc: Mapping[str, Any]) -> Any:
    legacy = qc.get("quantization")
    for holder in (qc, legacy if isinstance(legacy, dict) else {}):
        for key in ("kv_cache_scheme", "kv_cache_quant_algo"):
            if holder.get(key) is not None:
                return holder[key]
    return None


def _kv_keys(place: str, qc: Mapping[str, Any]) -> list[str]:
    keys = [f"{place}.{k}" for k in ("kv_cache_scheme", "kv_cache_quant_algo") if qc.get(k)]
    legacy = qc.get("quantization")
    if isinstance(legacy, dict) and legacy.get("kv_cache_quant_algo"):
        keys.append(f"{place}:quantization.kv_cache_quant_algo")
    return keys


def _resolve_kv(raw: Any, method: str | None, notes: list[str]) -> tuple[str | None, str]:
    """The KV algorithm and the dtype ``--kv-cache-dtype auto`` gives, as vLLM resolves them.

    Mirrors ``resolve_kv_cache_dtype_string``: only ModelOpt configs set the KV dtype; a
    ``{"type": "float", "num_bits": 8}`` scheme means fp8; strings go through the ModelOpt map.
    """
    if raw is None:
        return None, "auto"
    if isinstance(raw, dict):
        if str(raw.get("type", "")).lower() == "float" and raw.get("num_bits") == 8:
            algo = "FP8"
        else:
            notes.append(f"KV cache scheme {json.dumps(raw)} is not FP8: KV dtype left to 'auto'")
            return json.dumps(raw), "auto"
    else:
        algo = str(raw).upper()
    if not (method or "").startswith("modelopt"):
        notes.append(
            f"KV cache {algo} is declared by a {method} config; vLLM resolves it only "
            "for ModelOpt checkpoints"
        )
        return algo, "auto"
    dtype = MODELOPT_TO_VLLM_KV_CACHE_DTYPE.get(algo.lower())
    if dtype is None:
        notes.append(f"Unknown kv_cache_quant_algo '{algo}': vLLM falls back to 'auto'")
        return algo, "auto"
    return algo, dtype


def _remote_code_reasons(
    config: Mapping[str, Any], tokenizer_config: Mapping[str, Any] | None
) -> tuple[str, ...]:
    reasons: list[str] = []
    auto_map = config.get("auto_map")
    if isinstance(auto_map, dict) and auto_map.get("AutoConfig"):
        reasons.append(f"config.json auto_map.AutoConfig = {auto_map['AutoConfig']}")
    tok_map = (tokenizer_config or {}).get("auto_map")
    if isinstance(tok_map, dict) and tok_map.get("AutoTokenizer"):
        entry = tok_map["AutoTokenizer"]
        names = [n for n in entry if n] if isinstance(entry, list) else [entry]
        reasons.append(f"tokenizer_config.json auto_map.AutoTokenizer = {', '.join(names)}")
    return tuple(reasons)


# --------------------------------------------------------------------------------------------
# The rules table


@lru_cache(maxsize=1)
def load_rules() -> dict[str, Any]:
    """The compatibility table shipped in the package
    (``opsbook/knowledge/data/compat_rules.yaml``).

    Returns:
        The parsed table: ``backends``, ``priorities``, ``quantization_methods``, ``rules``...

    Raises:
        OpsbookError: the table is missing or malformed (a broken installation).
    """
    try:
        text = resources.files("opsbook.knowledge").joinpath("data", RULES_FILE).read_text()
        table = yaml.safe_load(text)
    except (FileNotFoundError, yaml.YAMLError) as e:
        raise OpsbookError(
            f"the compatibility table {RULES_FILE} cannot be read: {e}",
            remedy="reinstall opsbook (pip install -e .)",
        ) from None
    for key in ("backends", "priorities", "quantization_methods", "rules"):
        if key not in table:
            raise OpsbookError(f"the compatibility table {RULES_FILE} lacks '{key}'")
    unknown = {c for r in table["rules"] for c in r["when"]} - set(CONDITIONS)
    if unknown:
        raise OpsbookError(f"{RULES_FILE} uses unknown conditions {sorted(unknown)}")
    return table


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


def capability_matches(cc: str | None, patterns: Any) -> bool:
    """Whether compute capability ``cc`` (``"12.0"``) matches ``"12.x"``/``"9.0"``/``"any"``."""
    if patterns == "any":
        return True
    if cc is None:
        return False
    major = cc.split(".")[0]
    return any(p == cc or p == f"{major}.x" or p == "any" for p in patterns)


TABLE_SOURCE = "opsbook table compat_rules.yaml"


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
    entries = load_rules()["backends"][name]["kv_cache_dtypes"]
    version = parse_version(vllm_version)
    for entry in entries:
        if version_in(version, entry.get("versions")) is True and version is not None:
            return list(entry["dtypes"]), True, str(entry.get("source", ""))
    common = set.intersection(*(set(e["dtypes"]) for e in entries))
    ordered = [d for d in entries[0]["dtypes"] if d in common]
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
    table = load_rules()
    priority = next(
        p for p in table["priorities"] if capability_matches(compute_cap, p["compute_capability"])
    )
    kind = "non_mla" if not mla else ("sparse_mla" if sparse else "mla")
    candidates = [
        n for n in priority[kind] if _available(n, vllm_version, probed_backends) is not False
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
    spec = load_rules()["backends"][name].get("available")
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
    spec = load_rules()["backends"].get(name)
    if spec is None:
        return ["unknown backend"], True
    reasons = []
    if bool(spec["mla"]) != mla:
        reasons.append("MLA not supported" if mla else "non-MLA not supported")
    if bool(spec.get("sparse")) != sparse:
        reasons.append("sparse not supported" if sparse else "non-sparse not supported")
    if not capability_matches(cc, spec["compute_capability"]):
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
    spec = load_rules()["quantization_methods"].get(method)
    if spec is None:
        return None, True, TABLE_SOURCE
    return int(spec["min_capability"]), True, str(spec.get("source", TABLE_SOURCE))


# --------------------------------------------------------------------------------------------
# Checking


@dataclass
class _Context:
    """Everything a rule condition may look at, for one compute capability."""

    facts: ModelFacts
    cc: str | None
    version: str | None
    args: dict[str, Any]
    kv_dtype: str
    kv_origin: str
    choice: BackendChoice | None
    probed: Mapping[str, Sequence[str]] | None
    table: dict[str, Any]
    values: dict[str, str] = field(default_factory=dict)


Condition = Callable[[_Context, Any], "bool | None"]


def _cond_mla(ctx: _Context, want: Any) -> bool:
    return ctx.facts.mla == bool(want)


def _cond_sparse(ctx: _Context, want: Any) -> bool:
    return ctx.facts.sparse_mla == bool(want)


def _cond_compute_capability(ctx: _Context, patterns: Any) -> bool:
    return capability_matches(ctx.cc, patterns)


def _cond_kv_cache_dtype(ctx: _Context, dtypes: Any) -> bool:
    return ctx.kv_dtype in dtypes


def _cond_kv_flag(ctx: _Context, dtypes: Any) -> bool:
    return str(ctx.args.get("kv-cache-dtype", "auto")) in dtypes


def _cond_checkpoint_kv_quant(ctx: _Context, want: Any) -> bool:
    return (ctx.facts.kv_cache_algo is not None) == bool(want)


def _cond_backend_lacks_kv_dtype(ctx: _Context, name: Any) -> bool | None:
    dtypes, certain, _ = backend_kv_dtypes(str(name), ctx.version, ctx.probed)
    ctx.values.update(backend=str(name), backend_dtypes=", ".join(dtypes))
    if ctx.kv_dtype in dtypes:
        return False
    return True if certain else None


def _cond_kv_flag_unknown(ctx: _Context, want: Any) -> bool | None:
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


def _cond_fp8_kv_gate(ctx: _Context, want: Any) -> bool:
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


def _cond_backend_forced(ctx: _Context, name: Any) -> bool:
    return ctx.choice is not None and ctx.choice.forced == name


def _cond_backend_forced_invalid(ctx: _Context, want: Any) -> bool | None:
    found = ctx.choice is not None and ctx.choice.forced is not None and ctx.choice.name is None
    if found and ctx.choice is not None and ctx.choice.uncertain:
        return None
    return found == bool(want)


def _cond_no_backend(ctx: _Context, want: Any) -> bool | None:
    found = ctx.choice is not None and ctx.choice.forced is None and ctx.choice.name is None
    if found and ctx.choice is not None and ctx.choice.uncertain:
        return None
    return found == bool(want)


def _cond_quant_below_min_capability(ctx: _Context, want: Any) -> bool | None:
    method = ctx.facts.quant_method
    value, certain, _ = min_capability(method or "", ctx.version)
    if value is None or ctx.cc is None:
        return not want
    ctx.values["min_capability"] = str(value)
    below = capability_int(ctx.cc) < value
    if below == bool(want) and not certain:
        return None
    return below == bool(want)


def _cond_vllm_version(ctx: _Context, spec: Any) -> bool | None:
    return version_in(parse_version(ctx.version), str(spec))


def _cond_serve_arg_set(ctx: _Context, names: Any) -> bool:
    return all(_is_set(ctx.args.get(n)) for n in names)


def _cond_serve_arg_missing(ctx: _Context, names: Any) -> bool:
    return not any(_is_set(ctx.args.get(n)) for n in names)


def _cond_needs_remote_code(ctx: _Context, want: Any) -> bool:
    return ctx.facts.needs_remote_code == bool(want)


def _cond_model_type_native(ctx: _Context, want: Any) -> bool:
    native = ctx.facts.model_type in ctx.table.get("native_model_types", [])
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


def capability_int(cc: str) -> int:
    """``"12.0"`` -> ``120``, ``"8.9"`` -> ``89``, as vLLM's ``to_int()``."""
    major, _, minor = cc.partition(".")
    return int(major) * 10 + int(minor or 0)


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
) -> Result:
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
        A :class:`Result`, not ok when an error finding is present. ``data`` holds
        ``kv_cache_dtype``, ``kv_origin``, ``backends`` (per compute capability),
        ``findings_table`` (a :class:`Table` with severity, what will happen, why, fix, source)
        and ``table_version``.
    """
    table = load_rules()
    args = normalize_serve_args(serve_args)
    facts = narrow_to_release(facts, vllm_version)
    kv_dtype, kv_origin = resolve_kv_cache_dtype(facts, args)
    forced = next((str(args[a]) for a in ATTENTION_BACKEND_ARGS if _is_set(args.get(a))), None)
    caps = list(dict.fromkeys(cc for cc in map(compute_capability, gpus) if cc))
    findings: list[Finding] = []
    rows: list[list[str]] = []
    backends: dict[str, dict[str, Any]] = {}
    reported: dict[str, int] = {}
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
            backends[cc] = asdict(choice)
        ctx = _Context(
            facts, cc, vllm_version, args, kv_dtype, kv_origin, choice, probed_backends, table
        )
        ctx.values.update(_base_values(ctx))
        for finding, row in _evaluate_rules(ctx, table["rules"]):
            if finding.subject in reported:
                continue
            reported[finding.subject] = len(findings)
            findings.append(finding)
            rows.append(row)
    findings += _backend_notes(backends, facts)
    if not caps:
        findings.append(
            Finding(
                "info",
                "GPUs",
                "no GPU facts given: rules that depend on the compute capability were not checked",
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
    return Result(
        ok=not errors,
        message=message,
        data={
            "kv_cache_dtype": kv_dtype,
            "kv_origin": kv_origin,
            "backends": backends,
            "findings_table": Table(FINDING_COLUMNS, rows),
            "table_version": str(table.get("version", "")),
            "prediction_source": source,
        },
        findings=findings,
    )


def prediction_source(
    backends: Mapping[str, Mapping[str, Any]],
    vllm_version: str | None,
    probed: Mapping[str, Sequence[str]] | None,
) -> str:
    """Which source the prediction used: the installed vLLM, a release's source, the table."""
    sources = list(dict.fromkeys(str(c["source"]) for c in backends.values() if c["source"]))
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


def _base_values(ctx: _Context) -> dict[str, str]:
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


def _evaluate_rules(
    ctx: _Context, rules: Sequence[Mapping[str, Any]]
) -> list[tuple[Finding, list[str]]]:
    """Findings of every rule whose conditions all hold; one per group."""
    out: list[tuple[Finding, list[str]]] = []
    groups_hit: set[str] = set()
    for rule in rules:
        group = rule.get("group")
        if group and group in groups_hit:
            continue
        base = dict(ctx.values)
        outcomes = [CONDITIONS[name](ctx, want) for name, want in rule["when"].items()]
        if not any(o is False for o in outcomes):
            if group:
                groups_hit.add(group)
            out.append(_finding(rule, ctx, certain=all(o is True for o in outcomes)))
        # Conditions may add values for their rule's texts; they must not leak into the next.
        ctx.values = base
    return out


def _finding(rule: Mapping[str, Any], ctx: _Context, certain: bool) -> tuple[Finding, list[str]]:
    severity = str(rule["severity"])
    what = _fill(rule["what"], ctx.values)
    failure = _fill(rule.get("failure", ""), ctx.values)
    why = _fill(rule["why"], ctx.values)
    if not certain and severity == "error":
        severity = "warning"
        why += " The vLLM version is unknown: this is what happens in the affected releases."
    remedy = _fill(rule["remedy"], ctx.values)
    source = str(rule.get("source", "")).strip()
    happens = f"{what}: {failure}" if failure else what
    happens = happens.rstrip(".")
    subject = str(rule.get("title", rule["id"]))
    finding = Finding(severity, subject, f"{happens}. Why: {why}", remedy, source)
    return finding, [severity, happens, why, remedy, source]


def _fill(template: Any, values: Mapping[str, str]) -> str:
    """Put ``{name}`` values into a rule text; ``{{``/``}}`` stand for literal braces."""
    text = re.sub(
        r"\{([A-Za-z0-9_:\-]+)\}", lambda m: values.get(m.group(1), m.group(0)), str(template)
    )
    return " ".join(text.replace("{{", "{").replace("}}", "}").split())


def _backend_notes(backends: Mapping[str, Mapping[str, Any]], facts: ModelFacts) -> list[Finding]:
    notes = []
    for cc, choice in backends.items():
        if choice["name"]:
            kind = "MLA" if facts.mla else "attention"
            notes.append(
                Finding(
                    "ok",
                    f"attention backend on {cc}",
                    f"vLLM will use {choice['name']} "
                    f"({kind}; tried {', '.join(choice['candidates'])})",
                    source=choice["source"] or "vllm/platforms/cuda.py priorities",
                )
            )
    return notes


# --------------------------------------------------------------------------------------------
# KV-cache sizing


def kv_cache_bytes_per_token_per_layer(facts: ModelFacts, kv_dtype: str) -> int:
    """Bytes of KV cache one token takes in one layer.

    MLA caches one latent of ``kv_lora_rank + qk_rope_head_dim`` (576) values per token and
    layer; standard attention caches K and V for every KV head.

    Args:
        facts: from :func:`model_facts`.
        kv_dtype: ``auto``/``bfloat16`` (2 bytes), ``fp8``/``fp8_e4m3`` (1 byte),
            ``nvfp4`` (half a byte plus a scale byte per 16 values)...

    Returns:
        The size in bytes.

    Raises:
        OpsbookError: the dtype is unknown or the config lacks the sizes.
    """
    if facts.mla and kv_dtype == "fp8_ds_mla":
        return FP8_DS_MLA_BYTES_PER_LAYER
    if kv_dtype in NVFP4_KV_DTYPES:
        if facts.mla and facts.head_size:
            return nvfp4_packed_bytes(facts.head_size)
        if facts.num_kv_heads and facts.head_dim:
            return 2 * facts.num_kv_heads * nvfp4_packed_bytes(facts.head_dim)
        raise OpsbookError("the config lacks the attention sizes needed to size the KV cache")
    if kv_dtype not in KV_DTYPE_BYTES:
        raise OpsbookError(
            f"unknown KV cache dtype {kv_dtype!r}",
            remedy=f"use one of {sorted([*KV_DTYPE_BYTES, *NVFP4_KV_DTYPES])}",
        )
    width = KV_DTYPE_BYTES[kv_dtype]
    if facts.mla and facts.head_size:
        return facts.head_size * width
    if facts.num_kv_heads and facts.head_dim:
        return 2 * facts.num_kv_heads * facts.head_dim * width
    raise OpsbookError("the config lacks the attention sizes needed to size the KV cache")


def nvfp4_packed_bytes(head_size: int) -> int:
    """Bytes of one head's NVFP4 KV entry: FP4 data plus FP8 scales per 16 values."""
    return head_size // 2 + head_size // 16


def kv_cache_bytes_per_token(facts: ModelFacts, kv_dtype: str) -> int:
    """Bytes of KV cache one token takes across all layers (per GPU holding all layers).

    MLA's latent cache is not split across tensor-parallel ranks: each GPU keeps it whole.

    Args:
        facts: from :func:`model_facts`.
        kv_dtype: the KV-cache dtype.

    Returns:
        ``kv_cache_bytes_per_token_per_layer × num_layers``.

    Raises:
        OpsbookError: the dtype is unknown or the config lacks the sizes.
    """
    if not facts.num_layers:
        raise OpsbookError("the config lacks num_hidden_layers, needed to size the KV cache")
    return kv_cache_bytes_per_token_per_layer(facts, kv_dtype) * facts.num_layers


def tokens_that_fit(free_bytes: int, facts: ModelFacts, kv_dtype: str) -> int:
    """How many tokens of KV cache fit in ``free_bytes`` of one GPU's KV memory.

    Args:
        free_bytes: the memory vLLM has for the KV cache on one GPU
            (its log line ``Available KV cache memory``).
        facts: from :func:`model_facts`.
        kv_dtype: the KV-cache dtype.

    Returns:
        The number of tokens (all sequences together).
    """
    return max(0, int(free_bytes)) // kv_cache_bytes_per_token(facts, kv_dtype)


@dataclass(frozen=True)
class ProbedSelection:
    """What the installed vLLM chose for one compute capability, model kind and KV dtype."""

    compute_capability: str
    use_mla: bool
    kv_cache_dtype: str
    chosen: str | None
    order: tuple[str, ...]
    reasons: Mapping[str, list[str]]


@dataclass(frozen=True)
class InstalledVllm(Mapping[str, Sequence[str]]):
    """The answer of the ``backends`` probe: the installed vLLM's own backend selection.

    As a mapping it gives backend name -> ``supported_kv_cache_dtypes`` of the backends it
    imported (what ``probed_backends`` has always been), so it can be passed wherever that is.

    Attributes:
        version: the installed vLLM version (from its distribution metadata).
        kv_dtypes: backend -> its ``supported_kv_cache_dtypes``.
        selections: the selections asked for.
        import_errors: backend -> why it did not import on this host (kept, not dropped).
        priorities_from: where the priority function came from (imported, or compiled from
            the installed ``vllm/platforms/cuda.py`` when that module does not import).
        note: why only KV dtypes were read (an older vLLM, the simulator), or None.
        cached: the answer came from the host's cache.
        seconds: how long the probe took.
    """

    version: str | None
    kv_dtypes: Mapping[str, tuple[str, ...]]
    selections: tuple[ProbedSelection, ...] = ()
    import_errors: Mapping[str, str] = field(default_factory=dict)
    priorities_from: str | None = None
    note: str | None = None
    cached: bool = False
    seconds: float | None = None

    def __getitem__(self, name: str) -> Sequence[str]:
        return self.kv_dtypes[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.kv_dtypes)

    def __len__(self) -> int:
        return len(self.kv_dtypes)

    @property
    def source(self) -> str:
        return f"asked the installed vLLM {self.version or '(version unknown)'}"

    def __str__(self) -> str:
        parts = [f"{n} [{', '.join(d)}]" for n, d in self.kv_dtypes.items()]
        for s in self.selections:
            parts.append(f"on {s.compute_capability} with {s.kv_cache_dtype}: {s.chosen or 'none'}")
        if self.import_errors:
            parts.append("not importable: " + ", ".join(self.import_errors))
        return f"{self.source}: " + "; ".join(parts)

    def selection(self, cc: str, mla: bool, kv_cache_dtype: str) -> ProbedSelection | None:
        """The installed vLLM's answer for this case, if it was asked."""
        for s in self.selections:
            if (s.compute_capability, s.use_mla, s.kv_cache_dtype) == (cc, mla, kv_cache_dtype):
                return s
        return None


def probe_backends(
    host: RemoteHost,
    python: str,
    facts: ModelFacts | None = None,
    capabilities: Sequence[str] = (),
    kv_cache_dtypes: Sequence[str] = (),
) -> InstalledVllm | None:
    """Ask the installed vLLM on the host which attention backend it chooses.

    The probe calls the release's own ``_get_backend_priorities`` and each backend's
    ``validate_configuration`` (see ``opsbook/remote/probes/backends.py``) and caches the answer on
    the host. Pass the result to :func:`check_compat` as ``probed_backends``.

    Args:
        host: where vLLM is installed.
        python: the deployment's interpreter.
        facts: the model (MLA or not, head size); without it an MLA model of head size 576.
        capabilities: the GPUs' compute capabilities; without them the host's own GPUs.
        kv_cache_dtypes: the KV dtypes to ask about; without them ``auto`` and ``fp8_e4m3``.

    Returns:
        The :class:`InstalledVllm`, or None when vLLM is not importable there.
    """
    args: dict[str, Any] = {"python": python}
    if facts is not None:
        args["model"] = {
            "use_mla": facts.mla,
            "use_sparse": facts.sparse_mla,
            "head_size": facts.head_size,
        }
    if capabilities:
        args["capabilities"] = list(dict.fromkeys(capabilities))
    if kv_cache_dtypes:
        args["kv_cache_dtypes"] = list(dict.fromkeys(kv_cache_dtypes))
    return installed_vllm(host.probe("backends", args, timeout=240))


def installed_vllm(answer: Mapping[str, Any]) -> InstalledVllm | None:
    """The probe's JSON answer as a typed :class:`InstalledVllm` (None: vLLM not there)."""
    backends = answer.get("backends")
    if not backends and not answer.get("selections"):
        return None
    cases = {
        "|".join([c["compute_capability"], str(c["use_mla"]), c["kv_cache_dtype"]]): c
        for c in answer.get("cases") or []
    }
    selections = []
    for key, raw in (answer.get("selections") or {}).items():
        case = cases.get(key)
        if case is None:
            continue
        selections.append(
            ProbedSelection(
                compute_capability=str(case["compute_capability"]),
                use_mla=bool(case["use_mla"]),
                kv_cache_dtype=str(case["kv_cache_dtype"]),
                chosen=raw.get("chosen"),
                order=tuple(raw.get("order") or ()),
                reasons={
                    str(k): [str(r) for r in v] for k, v in (raw.get("reasons") or {}).items()
                },
            )
        )
    return InstalledVllm(
        version=answer.get("vllm_version"),
        kv_dtypes={str(k): tuple(str(d) for d in v) for k, v in (backends or {}).items()},
        selections=tuple(selections),
        import_errors={str(k): str(v) for k, v in (answer.get("import_errors") or {}).items()},
        priorities_from=answer.get("priorities_from"),
        note=answer.get("note"),
        cached=bool(answer.get("cached")),
        seconds=answer.get("seconds"),
    )


def kv_budget_bytes(gpus: Sequence[Any], weight_bytes: int, utilization: float = 0.9) -> int:
    """A first estimate of one GPU's KV-cache memory: its share of ``utilization`` of the
    memory left after its slice of the weights (tensor parallel over all ``gpus``).

    vLLM also keeps activations and CUDA graphs out of it, so its own ``Available KV cache
    memory`` line will be somewhat lower.
    """
    totals = [_memory_total_bytes(g) for g in gpus]
    if not totals:
        return 0
    return max(0, int(min(totals) * utilization - weight_bytes / len(totals)))


def kv_tradeoff_table(free_bytes: int, facts: ModelFacts) -> Table:
    """Tokens that fit with an FP8 and with a BF16 KV cache, side by side (and with the
    checkpoint's own KV dtype first when it is another one, such as nvfp4)."""
    rows = []
    own = (
        () if facts.kv_cache_dtype in ("auto", "fp8_e4m3", "bfloat16") else (facts.kv_cache_dtype,)
    )
    for dtype in (*own, "fp8_e4m3", "bfloat16"):
        per_layer = kv_cache_bytes_per_token_per_layer(facts, dtype)
        rows.append(
            [
                dtype,
                per_layer,
                kv_cache_bytes_per_token(facts, dtype),
                f"{tokens_that_fit(free_bytes, facts, dtype):,}",
            ]
        )
    return Table(["KV dtype", "bytes/token/layer", "bytes/token", "tokens that fit"], rows)


# --------------------------------------------------------------------------------------------
# Small helpers


def _memory_total_bytes(gpu: Any) -> int:
    if isinstance(gpu, Mapping):
        mib = gpu.get("memory_total_mib")
    else:
        mib = getattr(gpu, "memory_total_mib", None)
    return int(mib or 0) * 2**20


def compute_capability(gpu: Any) -> str | None:
    """A GPU's compute capability (``"12.0"``), from preflight facts or a mapping."""
    if isinstance(gpu, Mapping):
        value = gpu.get("compute_cap")
    else:
        value = getattr(gpu, "compute_cap", None)
    return str(value) if value else None


def _is_set(value: Any) -> bool:
    """Whether a serve argument is given: a flag without value (``""``/True) counts."""
    return value is not None and value is not False and str(value).lower() != "false"


def _int_or_none(value: Any) -> int | None:
    try:
        return int(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def parse_json(name: str, text: str) -> Any:
    """A config file's JSON, or an error naming the file and how to recover it."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise OpsbookError(
            f"{name} is not valid JSON: {e}",
            remedy=f"restore {name} from its backup or re-download it",
        ) from None


def _show(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return ", ".join(str(v) for v in value) or "—"
    return "—" if value is None else str(value)
