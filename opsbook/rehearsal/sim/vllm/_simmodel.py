"""What the simulated vLLM decides from the model's files and the GPUs, as vLLM decides it.

Pure functions: where the model is, what its config says (architecture, MLA, quantization,
KV-cache dtype), which attention backend vLLM would pick for a compute capability, how much
memory weights and KV cache take, and whether each safetensors shard is complete. Modelled on
vLLM's own code paths (``transformers_utils/config.py``, ``utils/torch_utils.py``,
``platforms/cuda.py``, ``v1/attention/backends/mla/*``, ``v1/core/kv_cache_utils.py``).
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Any

from ._simconfig import at_least
from ._simrelease import Release

GIB = 1024**3
MIB = 1024**2
# vLLM's ModelArchConfigConvertorBase.is_deepseek_mla list (it grows by version).
MLA_MODEL_TYPES = (
    "deepseek_v2",
    "deepseek_v3",
    "deepseek_v32",
    "deepseek_mtp",
    "kimi_k2",
    "kimi_linear",
    "longcat_flash",
    "pangu_ultra_moe",
    "glm_moe_dsa",
)
SPARSE_MODEL_TYPES = ("deepseek_v32", "glm_moe_dsa")
KV_CACHE_DTYPES = ("auto", "bfloat16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_ds_mla")
MODELOPT_TO_VLLM_KV_CACHE_DTYPE_MAP = {"fp8": "fp8_e4m3"}
# The first release whose --kv-cache-dtype auto follows the checkpoint (PR #29980).
KV_FROM_CHECKPOINT_SINCE = "0.13"
MAX_HEADER_SIZE = 100_000_000

_FULL_KV = ["auto", "float16", "bfloat16", "fp8", "fp8_e4m3"]
MLA_BACKENDS: dict[str, dict[str, Any]] = {
    "FLASH_ATTN_MLA": {"majors": (9,), "kv": ["auto", "float16", "bfloat16"], "sparse": False},
    "FLASHMLA": {"majors": (9, 10), "kv": _FULL_KV, "sparse": False},
    "FLASHINFER_MLA": {"majors": (10,), "kv": _FULL_KV, "sparse": False},
    "CUTLASS_MLA": {"majors": (10,), "kv": _FULL_KV, "sparse": False},
    # 0.21.0 on (vllm/v1/attention/backends/mla/tokenspeed_mla.py: FP8 KV only, SM10x).
    "TOKENSPEED_MLA": {"majors": (10,), "kv": ["fp8", "fp8_e4m3"], "sparse": False},
    "TRITON_MLA": {"majors": None, "kv": ["auto", "bfloat16"], "sparse": False},
    "FLASHMLA_SPARSE": {
        "majors": (9, 10),
        "kv": ["auto", "bfloat16", "fp8_ds_mla"],
        "sparse": True,
    },
    "FLASHINFER_MLA_SPARSE": {"majors": (10,), "kv": _FULL_KV, "sparse": True},
    "FLASHINFER_MLA_SPARSE_SM120": {
        "majors": (12,),
        "kv": ["auto", "fp8", "fp8_e4m3", "fp8_ds_mla"],
        "sparse": True,
    },
}
DENSE_BACKENDS: dict[str, dict[str, Any]] = {
    "FLASH_ATTN": {"min_cap": (8, 0), "kv": ["auto", "float16", "bfloat16"]},
    "FLASHINFER": {"min_cap": (7, 5), "kv": _FULL_KV + ["fp8_e5m2"]},
    "TRITON_ATTN": {"min_cap": (0, 0), "kv": _FULL_KV + ["fp8_e5m2"]},
    "FLEX_ATTENTION": {"min_cap": (0, 0), "kv": ["auto", "float16", "bfloat16"]},
}


class SimError(Exception):
    """A failure the real vLLM would raise: the exception's type name and its message."""

    def __init__(
        self, exc_type: str, message: str, where: str = "engine", phase: str = "", rank: int = 0
    ):
        super().__init__(message)
        self.exc_type = exc_type
        self.message = message
        self.where = where
        self.phase = phase
        self.rank = rank


# Where the model is.


def resolve_model_dir(model: str) -> Path | None:
    """The directory holding the model: a local path, or a repo id's snapshot in the HF cache."""
    path = Path(model).expanduser()
    if path.is_dir():
        return path
    if model.startswith(("/", ".", "~")) or model.count("/") != 1:
        return None
    repo = _hub_cache() / ("models--" + model.replace("/", "--"))
    ref = repo / "refs" / "main"
    try:
        snapshot = repo / "snapshots" / ref.read_text().strip()
    except OSError:
        candidates = sorted((repo / "snapshots").glob("*"))
        snapshot = candidates[0] if candidates else repo / "missing"
    return snapshot if snapshot.is_dir() else None


def _hub_cache() -> Path:
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]) / "hub"
    return Path.home() / ".cache" / "huggingface" / "hub"


def invalid_model_error(model: str) -> SimError:
    return SimError(
        "ValueError",
        f"Invalid repository ID or local directory specified: '{model}'.\n"
        "Please verify the following requirements:\n"
        "1. Provide a valid Hugging Face repository ID.\n"
        "2. Specify a local directory that contains a recognized configuration file.\n"
        "   - For Hugging Face models: ensure the presence of a 'config.json'.\n"
        "   - For Mistral models: ensure the presence of a 'params.json'.\n",
        where="api",
    )


def load_model_config(model_dir: Path) -> dict[str, Any]:
    """config.json as a dict; raises the error vLLM gives when it is missing or unreadable."""
    try:
        config = json.loads((model_dir / "config.json").read_text())
    except OSError as error:
        raise invalid_model_error(str(model_dir)) from error
    except ValueError as error:
        raise SimError("json.decoder.JSONDecodeError", f"{error}", where="api") from error
    if not isinstance(config, dict):
        raise invalid_model_error(str(model_dir))
    return config


# What the config says.


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    """``hf_text_config``: the ``text_config`` of multimodal wrappers, else the config."""
    inner = config.get("text_config")
    return inner if isinstance(inner, dict) else config


def needs_remote_code(config: dict[str, Any]) -> bool:
    """Whether loading the config runs the repository's own code (``auto_map`` names it)."""
    auto_map = config.get("auto_map")
    return isinstance(auto_map, dict) and "AutoConfig" in auto_map


def remote_code_message(model: str) -> str:
    """transformers' refusal (4.57 wording) as vLLM's config validation reports it."""
    return (
        f"The repository {model} contains custom code which must be executed to correctly "
        f"load the model. You can inspect the repository content at {model} .\n"
        f" You can inspect the repository content at https://hf.co/{model}.\n"
        "Please pass the argument `trust_remote_code=True` to allow custom code to be run."
    )


def architecture(config: dict[str, Any]) -> str:
    names = config.get("architectures") or text_config(config).get("architectures") or []
    return str(names[0]) if names else "LlamaForCausalLM"


def derived_max_model_len(config: dict[str, Any]) -> int:
    for holder in (text_config(config), config):
        for key in ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length"):
            value = holder.get(key)
            if isinstance(value, int) and value > 0:
                return value
    return 2048


def uses_mla(config: dict[str, Any]) -> bool:
    """vLLM's rule: an MLA model type with a ``kv_lora_rank``, unless VLLM_MLA_DISABLE=1."""
    if os.environ.get("VLLM_MLA_DISABLE", "0") not in ("", "0"):
        return False
    text = text_config(config)
    return text.get("model_type") in MLA_MODEL_TYPES and text.get("kv_lora_rank") is not None


def uses_sparse(config: dict[str, Any]) -> bool:
    text = text_config(config)
    return text.get("model_type") in SPARSE_MODEL_TYPES or "index_topk" in text


def head_size(config: dict[str, Any], mla: bool) -> int:
    text = text_config(config)
    if mla:
        return int(text.get("kv_lora_rank") or 0) + int(text.get("qk_rope_head_dim") or 0)
    if text.get("head_dim"):
        return int(text["head_dim"])
    heads = int(text.get("num_attention_heads") or 32)
    return int(text.get("hidden_size") or 4096) // heads


def num_layers(config: dict[str, Any]) -> int:
    return int(text_config(config).get("num_hidden_layers") or 32)


def num_attention_heads(config: dict[str, Any]) -> int:
    return int(text_config(config).get("num_attention_heads") or 32)


def num_kv_heads(config: dict[str, Any]) -> int:
    text = text_config(config)
    return int(text.get("num_key_value_heads") or text.get("num_attention_heads") or 32)


# Quantization and the KV-cache dtype.


def quant_config(model_dir: Path, config: dict[str, Any]) -> dict[str, Any] | None:
    """config.json's ``quantization_config`` (ModelOpt >= 0.31), else hf_quant_config.json."""
    found = config.get("quantization_config")
    if isinstance(found, dict):
        return found
    try:
        legacy = json.loads((model_dir / "hf_quant_config.json").read_text())
    except (OSError, ValueError):
        return None
    return legacy if isinstance(legacy, dict) else None


def _is_modelopt(quant: dict[str, Any]) -> bool:
    producer = quant.get("producer") or {}
    method = str(quant.get("quant_method") or "")
    return method.startswith("modelopt") or (
        isinstance(producer, dict) and producer.get("name") == "modelopt"
    )


def quant_algo(quant: dict[str, Any]) -> str | None:
    legacy = quant.get("quantization") or {}
    algo = quant.get("quant_algo") or (
        legacy.get("quant_algo") if isinstance(legacy, dict) else None
    )
    return str(algo) if algo else None


def quantization_method(quant: dict[str, Any] | None) -> str | None:
    """The name vLLM normalises the checkpoint's quantization to (``modelopt_fp4``...)."""
    if not quant:
        return None
    if _is_modelopt(quant):
        algo = (quant_algo(quant) or "").upper()
        if algo in ("NVFP4", "W4A16_NVFP4"):
            return "modelopt_fp4"
        if algo.startswith("FP8") or algo in ("MXFP8", "MIXED_PRECISION"):
            return "modelopt"
        raise SimError("ValueError", f"Unknown ModelOpt quant algo: {quant_algo(quant)}", "api")
    method = quant.get("quant_method")
    return str(method) if method else None


def checkpoint_kv_algo(quant: dict[str, Any]) -> Any:
    """``kv_cache_scheme`` or ``kv_cache_quant_algo``, top level or under ``quantization``."""
    legacy = quant.get("quantization")
    for holder in (quant, legacy if isinstance(legacy, dict) else {}):
        for key in ("kv_cache_scheme", "kv_cache_quant_algo"):
            if holder.get(key) is not None:
                return holder[key]
    return None


def resolve_kv_cache_dtype(
    requested: str, quant: dict[str, Any] | None, version: str, warnings: list[str]
) -> str:
    """``resolve_kv_cache_dtype_string``: an explicit dtype wins; ``auto`` follows the checkpoint.

    Args:
        requested: the ``--kv-cache-dtype`` value.
        quant: the checkpoint's quantization config.
        version: the simulated vLLM version.
        warnings: receives the warning vLLM logs for an unknown algorithm.
    """
    if requested != "auto" or not quant or not at_least(version, KV_FROM_CHECKPOINT_SINCE):
        return requested
    if not _is_modelopt(quant):
        return requested
    algo = checkpoint_kv_algo(quant)
    if algo is None:
        return "auto"
    if isinstance(algo, dict):
        name = "fp8" if algo.get("type") == "float" and algo.get("num_bits") == 8 else str(algo)
    else:
        name = str(algo).lower()
    if name in MODELOPT_TO_VLLM_KV_CACHE_DTYPE_MAP:
        return MODELOPT_TO_VLLM_KV_CACHE_DTYPE_MAP[name]
    warnings.append(
        f"Unknown kv_cache_quant_algo '{algo}' in model config. Supported values: "
        f"{sorted(MODELOPT_TO_VLLM_KV_CACHE_DTYPE_MAP)}. Falling back to 'auto'."
    )
    return "auto"


def is_quantized_kv(kv_cache_dtype: str) -> bool:
    return kv_cache_dtype.startswith("fp8")


# Attention backend selection.


def triton_mla_kv_dtypes(release: Release) -> list[str]:
    """``TritonMLABackend.supported_kv_cache_dtypes`` of a release."""
    return release.backend_kv_dtypes("TRITON_MLA", ["auto", "bfloat16"])


def dense_priority(major: int) -> list[str]:
    if major == 10:
        return ["FLASHINFER", "FLASH_ATTN", "TRITON_ATTN", "FLEX_ATTENTION"]
    return ["FLASH_ATTN", "FLASHINFER", "TRITON_ATTN", "FLEX_ATTENTION"]


def selector_config(head: int, kv_cache_dtype: str, mla: bool, sparse: bool) -> str:
    return (
        f"AttentionSelectorConfig(head_size={head}, dtype=torch.bfloat16, "
        f"kv_cache_dtype={kv_cache_dtype}, block_size=None, use_mla={mla}, has_sink=False, "
        f"use_sparse={sparse}, use_mm_prefix=False, attn_type=decoder)"
    )


def _supports_capability(name: str, capability: tuple[int, int], release: Release) -> bool:
    listed = release.backend_capabilities(name)
    if listed is not None:
        return f"{capability[0]}.{capability[1]}" in listed
    if name not in MLA_BACKENDS and name not in DENSE_BACKENDS:
        return False
    spec = MLA_BACKENDS.get(name)
    if spec is None:
        return capability >= DENSE_BACKENDS[name]["min_cap"]
    return spec["majors"] is None or capability[0] in spec["majors"]


def backend_reasons(
    name: str,
    capability: tuple[int, int],
    kv_cache_dtype: str,
    mla: bool,
    sparse: bool,
    qk_nope_head_dim: int,
    release: Release,
) -> list[str]:
    """Why ``name`` cannot serve this configuration (``validate_configuration``); [] if it can.

    The reasons come in vLLM's order (vllm/v1/attention/backend.py): KV dtype, MLA, sparse,
    compute capability, then the backend's own ``supports_combination``.
    """
    checks_kv = release.selector_checks_kv_dtype
    if name in DENSE_BACKENDS:
        spec = DENSE_BACKENDS[name]
        reasons = []
        if checks_kv and kv_cache_dtype not in release.backend_kv_dtypes(name, spec["kv"]):
            reasons.append("kv_cache_dtype not supported")
        if mla:
            reasons.append("MLA not supported")
        if not _supports_capability(name, capability, release):
            reasons.append("compute capability not supported")
        return reasons
    spec = MLA_BACKENDS[name]
    reasons = []
    if checks_kv and kv_cache_dtype not in release.backend_kv_dtypes(name, spec["kv"]):
        reasons.append("kv_cache_dtype not supported")
    if not mla:
        reasons.append("non-MLA not supported")
    if sparse and not spec["sparse"]:
        reasons.append("sparse not supported")
    if not sparse and spec["sparse"]:
        reasons.append("non-sparse not supported")
    if not _supports_capability(name, capability, release):
        reasons.append("compute capability not supported")
    reasons += _combination_reasons(name, capability, sparse, qk_nope_head_dim, release)
    return reasons


def _sheet_reasons(
    name: str,
    capability: tuple[int, int],
    kv_cache_dtype: str,
    mla: bool,
    sparse: bool,
    release: Release,
) -> list[str]:
    """The reasons of a backend this simulation has no table for, from the facts sheet (its
    own supports_combination is not played)."""
    sheet = release.backend_sheet(name)
    if sheet is None:
        return ["ImportError"]
    reasons = []
    kv = sheet.get("kv_cache_dtypes")
    if release.selector_checks_kv_dtype and kv and kv_cache_dtype not in kv:
        reasons.append("kv_cache_dtype not supported")
    if bool(sheet.get("mla")) != mla:
        reasons.append("MLA not supported" if mla else "non-MLA not supported")
    if bool(sheet.get("sparse")) != sparse:
        reasons.append("sparse not supported" if sparse else "non-sparse not supported")
    if not _supports_capability(name, capability, release):
        reasons.append("compute capability not supported")
    return reasons


def _combination_reasons(
    name: str, capability: tuple[int, int], sparse: bool, qk_nope: int, release: Release
) -> list[str]:
    """The backends' own ``supports_combination`` texts (vllm/v1/attention/ops/flashmla.py,
    fa_utils.py, backends/mla/flashinfer_mla.py)."""
    if name == "FLASH_ATTN_MLA" and capability[0] != 9:
        return ["FlashAttention MLA not supported on this device"]
    if name == "FLASHMLA" and not sparse and capability[0] != 9:
        return ["FlashMLA Dense is only supported on Hopper devices."]
    if name == "FLASHMLA" and sparse and capability[0] not in (9, 10):
        return ["FlashMLA Sparse is only supported on Hopper and Blackwell devices."]
    if name == "FLASHINFER_MLA":
        reason = release.flashinfer_mla_head_reason(qk_nope)
        return [reason] if reason else []
    return []


def select_backend(
    config: dict[str, Any],
    capability: tuple[int, int],
    kv_cache_dtype: str,
    release: Release,
    forced: str | None,
) -> tuple[str, list[str], bool]:
    """Pick the attention backend as vLLM's CUDA platform does.

    Returns:
        The chosen backend, the valid candidates in priority order, and whether it was a
        selected backend (``--attention-backend``, or the Blackwell default of 0.13-0.17)
        rather than the first valid one of the priority list.

    Raises:
        SimError: the selected backend is invalid, or no backend fits (with per-backend
            reasons).
    """
    mla = uses_mla(config)
    sparse = mla and uses_sparse(config)
    head = head_size(config, mla)
    nope = int(text_config(config).get("qk_nope_head_dim") or 0)
    if not forced and mla and release.blackwell_default(capability, nope, sparse):
        forced = "FLASHINFER_MLA"
    if mla:
        priority = release.mla_priority(capability, kv_cache_dtype)
    else:
        priority = dense_priority(capability[0])

    def reasons_of(name: str) -> list[str]:
        if name not in MLA_BACKENDS and name not in DENSE_BACKENDS:
            return _sheet_reasons(name, capability, kv_cache_dtype, mla, sparse, release)
        return backend_reasons(name, capability, kv_cache_dtype, mla, sparse, nope, release)

    if forced:
        if forced not in MLA_BACKENDS and forced not in DENSE_BACKENDS:
            known = sorted(list(MLA_BACKENDS) + list(DENSE_BACKENDS))
            raise SimError(
                "ValueError",
                f"Invalid attention backend: '{forced}'. Valid backends are: {known}",
                "worker",
            )
        reasons = reasons_of(forced)
        if reasons:
            raise SimError(
                "ValueError",
                f"Selected backend {release.backend_name(forced)} is not valid for this "
                f"configuration. Reason: {reasons}",
                "worker",
            )
        return forced, [forced], True
    valid = [name for name in priority if not reasons_of(name)]
    if not valid:
        listed = ", ".join(f"{name}: [{', '.join(reasons_of(name))}]" for name in priority)
        raise SimError(
            "ValueError",
            f"No valid attention backend found for cuda with "
            f"{selector_config(head, kv_cache_dtype, mla, sparse)}. Reasons: {{{listed}}}.",
            "worker",
        )
    return valid[0], valid, False


def backend_init_error(backend: str, kv_cache_dtype: str, release: Release) -> SimError | None:
    """The NotImplementedError an MLA impl raises in ``__init__`` for an FP8 KV cache.

    Only 0.10.2 gets here: from 0.11.2 on the selector refuses the KV dtype first.
    """
    if not is_quantized_kv(kv_cache_dtype) or release.selector_checks_kv_dtype:
        return None
    if backend == "TRITON_MLA":
        return SimError(
            "NotImplementedError", "TritonMLA V1 with FP8 KV cache not yet supported", "worker"
        )
    return None


# Shards.


def listed_shards(model_dir: Path) -> tuple[list[str], dict[str, list[str]]]:
    """Shard file names the model has, and the tensor names the index assigns to each."""
    tensors: dict[str, list[str]] = {}
    try:
        index = json.loads((model_dir / "model.safetensors.index.json").read_text())
        for tensor, shard in (index.get("weight_map") or {}).items():
            tensors.setdefault(str(shard), []).append(str(tensor))
    except (OSError, ValueError, AttributeError):
        tensors = {}
    on_disk = {path.name for path in model_dir.glob("*.safetensors")}
    return sorted(set(tensors) | on_disk), tensors


def shard_error(path: Path) -> str | None:
    """The safetensors header error of one shard, or None if the file is complete.

    Follows ``safetensors/src/tensor.rs``: the file must be exactly 8 + header length +
    the largest ``data_offsets`` end, with contiguous tensors.
    """
    try:
        size = path.stat().st_size
        with open(path, "rb") as handle:
            prefix = handle.read(8)
            if len(prefix) < 8:
                return "HeaderTooSmall"
            (length,) = struct.unpack("<Q", prefix)
            if length > MAX_HEADER_SIZE:
                return "HeaderTooLarge"
            if 8 + length > size:
                return "InvalidHeaderLength"
            raw = handle.read(length)
    except OSError:
        return None
    try:
        header = json.loads(raw.decode("utf-8"))
        spans = sorted(
            (int(info["data_offsets"][0]), int(info["data_offsets"][1]), name)
            for name, info in header.items()
            if name != "__metadata__"
        )
    except (ValueError, KeyError, TypeError, IndexError, AttributeError):
        return "InvalidHeaderDeserialization"
    end = 0
    for begin, stop, name in spans:
        if begin != end or stop < begin:
            return f'InvalidOffset("{name}")'
        end = stop
    if 8 + length + end != size:
        return "MetadataIncompleteBuffer"
    return None


def weights_bytes(model_dir: Path, shards: list[str]) -> int:
    total = 0
    for name in shards:
        try:
            total += (model_dir / name).stat().st_size
        except OSError:
            continue
    return total


# Memory.


def kv_bytes_per_token(config: dict[str, Any], kv_cache_dtype: str, tp: int) -> int:
    """KV-cache bytes one token takes on one GPU (MLA's latent cache is not split by TP)."""
    size = 1 if is_quantized_kv(kv_cache_dtype) else 2
    layers = num_layers(config)
    mla = uses_mla(config)
    if mla:
        return head_size(config, True) * size * layers
    heads = max(1, num_kv_heads(config) // max(1, tp))
    return 2 * heads * head_size(config, False) * size * layers


def fmt_tokens(count: int) -> str:
    return f"{count:,}"
