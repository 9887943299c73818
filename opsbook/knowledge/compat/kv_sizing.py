"""Size the KV cache: bytes per token for each KV dtype, and the tokens that fit in one GPU,
to show what a BF16 KV cache costs against FP8 (or NVFP4)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from opsbook.core.exceptions import OpsbookError
from opsbook.core.results import Table
from opsbook.knowledge.compat.model_config import ModelFacts

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


def _memory_total_bytes(gpu: Any) -> int:
    if isinstance(gpu, Mapping):
        mib = gpu.get("memory_total_mib")
    else:
        mib = getattr(gpu, "memory_total_mib", None)
    return int(mib or 0) * 2**20
