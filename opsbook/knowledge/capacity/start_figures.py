"""What a start's log says of its memory, read back for the capacity plan: vLLM's tokens,
concurrency, KV memory and weights, its version, and the flags that move its non-KV memory.

The patterns are logscan's (:mod:`opsbook.knowledge.logscan.line_grammar`); this module says
what the plan keeps of them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

GIB = 2**30
# vLLM's --gpu-memory-utilization default (vllm/config/cache.py, CacheConfig): 0.9 in 0.10.2 -
# 0.19.1, 0.92 in 0.20.2 - 0.33.0 (the releases between were not read: 0.20 counts as the
# change). 0.34.0 leaves it unset: 1.0 with its extensible KV cache, else
# CacheConfig.DEFAULT_GPU_MEMORY_UTILIZATION 0.92 (resolved_gpu_memory_utilization).
DEFAULT_UTILIZATION = 0.92
EARLIER_DEFAULT_UTILIZATION = 0.9
DEFAULT_CHANGED_IN = (0, 20, 0)
# 0.34.0's extensible KV cache sizes the cache from the memory free after CUDA graph capture
# and warmup, not from the profiling estimate (vllm/config/cache.py enable_extensible_kv_cache,
# vllm/v1/worker/extensible_kv_cache.py measure_kv_cache_bytes). It is on unless asked off, on
# CUDA and ROCm, when neither kv_cache_memory_bytes nor num_gpu_blocks_override is set
# (vllm/config/vllm.py _resolve_extensible_kv_cache; connectors and elastic EP aside).
EXTENSIBLE_FROM = (0, 34, 0)
EXTENSIBLE_UTILIZATION = 1.0


def release_of(vllm_version: str | None) -> tuple[int, ...] | None:
    """``(major, minor, patch)`` of a version (its local part and suffixes left out)."""
    numbers = [int(n) for n in re.findall(r"\d+", (vllm_version or "").split("+")[0])[:3]]
    return tuple(numbers + [0, 0])[:3] if numbers else None


def extensible_kv_cache(vllm_version: str | None, platform: str, args: Mapping[str, Any]) -> bool:
    """Whether a start of ``vllm_version`` on ``platform`` (``cuda``, ``cpu``) with serve
    ``args`` sizes an extensible KV cache (see :data:`EXTENSIBLE_FROM`)."""
    release = release_of(vllm_version)
    if release is None or release < EXTENSIBLE_FROM or platform != "cuda":
        return False
    if args.get("kv-cache-memory-bytes") or args.get("num-gpu-blocks-override"):
        return False
    return flag_text(args.get("enable-extensible-kv-cache", True)) not in ("false", "0")


def default_utilization(vllm_version: str | None, extensible: bool = False) -> float:
    """The utilization a start of ``vllm_version`` runs at without the flag (the newer
    default when the version is not known)."""
    if extensible:
        return EXTENSIBLE_UTILIZATION
    release = release_of(vllm_version)
    if release is not None and release < DEFAULT_CHANGED_IN:
        return EARLIER_DEFAULT_UTILIZATION
    return DEFAULT_UTILIZATION


# The flags that move a start's non-KV memory (activations, CUDA graphs, NCCL, the loader,
# the encoder): an earlier run's measured overhead is a prior only when these match, with the
# same vLLM version. KV dtype, max-model-len and utilization leave it as it is, so that the
# knobs can be priced with it.
OVERHEAD_FLAGS = (
    "tensor-parallel-size", "pipeline-parallel-size", "decode-context-parallel-size",
    "data-parallel-size", "enable-expert-parallel", "max-num-seqs", "max-num-batched-tokens",
    "enforce-eager", "load-format", "quantization", "language-model-only",
    "mm-encoder-tp-mode", "max-cudagraph-capture-size", "speculative-config",
)  # fmt: skip
_FLAG_DEFAULTS = {
    "tensor-parallel-size": "1", "pipeline-parallel-size": "1",
    "decode-context-parallel-size": "1", "data-parallel-size": "1",
    "enable-expert-parallel": "false", "enforce-eager": "false", "language-model-only": "false",
}  # fmt: skip


@dataclass(frozen=True)
class Observed:
    """What vLLM logged of a start's memory (None where the log did not say), with the
    utilization it ran at and whether its KV size was fixed (``kv-cache-memory-bytes``)."""

    kv_tokens: int | None = None
    concurrency: float | None = None
    max_model_len: int | None = None
    kv_memory: int | None = None
    weights: int | None = None
    version: str | None = None
    flags: Mapping[str, str] = field(default_factory=dict)
    utilization: float = DEFAULT_UTILIZATION
    fixed_kv: bool = False

    @property
    def sized(self) -> bool:
        """Whether the start got as far as sizing its KV cache."""
        return self.kv_tokens is not None


# The figures a start-up's sizing gives; a new start-up in the same log forgets the last's.
_SIZING = ("kv_tokens", "concurrency", "max_model_len", "kv_memory", "weights")


def observed_in_log(text: str | Sequence[str]) -> Observed | None:
    """vLLM's figures from a start's log (its text, or lines of it): tokens, concurrency, KV
    memory, weights, version and the overhead flags of its ``non-default args``; None when it
    says none of them.

    The one reader of these lines (the plan, 04's record, 06's receipt). Sizing figures are
    the last start-up's: an engine's "Initializing ... LLM engine" line begins one, so that a
    log of several starts does not mix them. Where engines or workers each log a size, the
    tokens are the smallest (the engine that runs out first); the other figures the last said.
    """
    from opsbook.knowledge.logscan import line_grammar as said

    found: dict[str, Any] = {}
    tokens: list[int] = []
    logged: dict[str, Any] = {}
    platform = "cuda"
    for line in text.splitlines() if isinstance(text, str) else text:
        if "LLM engine" in line and said.ENGINE_START_SAID.search(line):
            tokens = []
            for name in _SIZING:
                found.pop(name, None)
        if "KV cache size" in line and (m := said.KV_CACHE_SIZE_SAID.search(line)):
            tokens.append(int(m["tokens"].replace(",", "")))
        if "Maximum concurrency" in line and (m := said.MAX_CONCURRENCY_SAID.search(line)):
            found["max_model_len"] = int(m["max_model_len"].replace(",", ""))
            found["concurrency"] = float(m["concurrency"])
        if "Available KV" in line and (m := said.KV_MEMORY_SAID.search(line)):
            found["kv_memory"] = int(float(m["gib"]) * GIB)
        if "Model loading took" in line and (m := said.WEIGHTS_MEMORY_SAID.search(line)):
            found["weights"] = int(float(m["gib"]) * GIB)
        if "version" not in found and (m := said.VLLM_VERSION_SAID.search(line)):
            found["version"] = m["version"]
        if "device_config=cpu" in line or "detected platform cpu" in line:
            platform = "cpu"
        if "non-default args" in line and (m := said.NON_DEFAULT_ARGS_SAID.search(line)):
            logged = _logged_args(m["args"])
            found["flags"] = overhead_flags(logged)
            found["utilization"] = logged.get("gpu-memory-utilization")
            found["fixed_kv"] = bool(logged.get("kv-cache-memory-bytes"))
    if tokens:
        found["kv_tokens"] = min(tokens)
    if "flags" in found:
        extensible = extensible_kv_cache(found.get("version"), platform, logged)
        found["utilization"] = float(
            found["utilization"] or default_utilization(found.get("version"), extensible)
        )
    keys = ("kv_tokens", "kv_memory", "weights")
    return Observed(**found) if any(k in found for k in keys) else None


def _logged_args(text: str) -> dict[str, Any]:
    """The simple ``'name': value`` pairs of a logged ``non-default args`` dict, keyed by CLI
    spelling (nested dicts and reprs of objects are not needed and not parsed)."""
    found: dict[str, Any] = {}
    for name, value in re.findall(r"'(\w+)': ('[^']*'|True|False|None|-?[\d.]+)", text):
        # The top level comes first; a nested config's key of the same name does not count.
        found.setdefault(name.replace("_", "-"), None if value == "None" else value.strip("'"))
    return found


def same_release(logged: str | None, installed: str | None) -> bool:
    """Whether a logged vLLM version is the installed one: equal, or equal but for a local
    part one of them lacks (a CPU build logs ``0.32.0``, its package says ``0.32.0+cpu``)."""
    if logged is None or installed is None:
        return logged == installed
    return (
        logged == installed
        or logged.split("+")[0] == installed.split("+")[0]
        and ("+" not in logged or "+" not in installed)
    )


def overhead_flags(args: Mapping[str, Any]) -> dict[str, str]:
    """The :data:`OVERHEAD_FLAGS` of serve arguments, as text, defaults left out."""
    flags = {}
    for name in OVERHEAD_FLAGS:
        if name in args and args[name] is not None:
            value = flag_text(args[name])
            if _FLAG_DEFAULTS.get(name) != value:
                flags[name] = value
    return flags


def flag_text(value: Any) -> str:
    """A flag's value as text, booleans as YAML writes them (``true``)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value).lower() if str(value) in ("True", "False") else str(value)
