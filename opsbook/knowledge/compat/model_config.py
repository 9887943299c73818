"""Read what matters from a checkpoint's ``config.json``, ``hf_quant_config.json`` and
``tokenizer_config.json``: MLA or not, the attention head size the backend selector sees, the
quantization and the KV-cache dtype resolved as vLLM resolves it, whether remote code is
needed, the layer count.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from opsbook.core.exceptions import OpsbookError
from opsbook.core.results import Table
from opsbook.knowledge import vllm_facts

CONFIG_FILES = ("config.json", "hf_quant_config.json", "tokenizer_config.json")
# MLA model types: vLLM's is_deepseek_mla list, read per release into
# opsbook/knowledge/data/vllm_facts.
# A checkpoint is read before the version is known, so the union of every release is used here
# and check_compat narrows it to the installed release.
MLA_MODEL_TYPES = vllm_facts.every_release_mla_model_types()
# Sparse (DSA) MLA: vLLM's DeepSeek model code sets is_sparse when the config has index_topk
# (vLLM 0.33.0 vllm/model_executor/models/deepseek_v2.py); these types always carry it.
SPARSE_MLA_MODEL_TYPES = ("deepseek_v32", "glm_moe_dsa")
# MODELOPT_TO_VLLM_KV_CACHE_DTYPE_MAP (vllm/utils/torch_utils.py), every release's entries.
MODELOPT_TO_VLLM_KV_CACHE_DTYPE = vllm_facts.every_release_modelopt_kv_map()


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
        quant_method=quant.method,
        quant_algo=quant.algo,
        quant_source=quant.source,
        quant_sources=quant.sources,
        kv_cache_algo=quant.kv_algo,
        kv_cache_dtype=quant.kv_dtype,
        kv_cache_keys=quant.kv_keys,
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


@dataclass(frozen=True)
class _Quantization:
    """The quantization vLLM reads, as :class:`ModelFacts` names its parts."""

    method: str | None = None
    algo: str | None = None
    source: str | None = None
    sources: tuple[str, ...] = ()
    kv_algo: str | None = None
    kv_dtype: str = "auto"
    kv_keys: tuple[str, ...] = ()


def _read_quantization(
    config: Mapping[str, Any], hf_quant: Mapping[str, Any] | None, notes: list[str]
) -> _Quantization:
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
        return _Quantization(kv_keys=tuple(kv_keys))
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
    return _Quantization(
        method, algo, source, tuple(p for p, _ in places), kv_algo, kv_dtype, tuple(kv_keys)
    )


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
