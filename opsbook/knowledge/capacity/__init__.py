"""The capacity of a vLLM start, worked out before the load.

- :mod:`.kv_arithmetic`: the weights one GPU holds, the KV bytes one token takes on it, and
  the tokens and concurrency vLLM will report for the memory left to the KV cache; each
  formula names the vLLM source it mirrors.
- :mod:`.start_figures`: what a start's log says of its memory, read back so that the plan
  learns the host's non-KV overhead.
"""

from opsbook.knowledge.capacity.kv_arithmetic import (
    DEFAULT_OVERHEAD,
    GIB,
    LEARNED_MARGIN,
    Capacity,
    KvShape,
    Parallel,
    Weights,
    block_size_for,
    blocks_per_request,
    default_max_num_seqs,
    default_overhead,
    indexer_bytes,
    kv_capacity,
    kv_memory_band,
    kv_shape,
    learned_overhead,
    longest_request,
    measured_overhead,
    model_dtype_bytes,
    one_request_bytes,
    pp_layer_ranges,
    stored_kv_dtype,
    tensor_kind,
    weights_per_rank,
)
from opsbook.knowledge.capacity.start_figures import (
    DEFAULT_UTILIZATION,
    OVERHEAD_FLAGS,
    Observed,
    default_utilization,
    extensible_kv_cache,
    observed_in_log,
    overhead_flags,
    same_release,
)

__all__ = [
    "DEFAULT_OVERHEAD",
    "DEFAULT_UTILIZATION",
    "default_utilization",
    "GIB",
    "LEARNED_MARGIN",
    "OVERHEAD_FLAGS",
    "Capacity",
    "KvShape",
    "Observed",
    "Parallel",
    "Weights",
    "block_size_for",
    "blocks_per_request",
    "default_max_num_seqs",
    "default_overhead",
    "extensible_kv_cache",
    "indexer_bytes",
    "kv_capacity",
    "kv_memory_band",
    "kv_shape",
    "learned_overhead",
    "longest_request",
    "measured_overhead",
    "model_dtype_bytes",
    "observed_in_log",
    "one_request_bytes",
    "overhead_flags",
    "pp_layer_ranges",
    "same_release",
    "stored_kv_dtype",
    "tensor_kind",
    "weights_per_rank",
]
