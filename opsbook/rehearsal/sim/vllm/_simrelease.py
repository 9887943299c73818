"""What the simulated vLLM does differently from one release to the next.

Every rule here was read from the source of the releases' wheels (the file is named with each
rule). When the rehearsal host installed facts sheets (``_facts/<release>.json`` next to this
file, written by ``opsbook.rehearsal.sim.vllm_install`` from the facts extracted from vLLM's
wheels), the
sheet of the newest release at or below the one played is used:
its backends, priority lists, KV-cache dtypes and serve flags take precedence over the tables
below, which were read by hand from releases 0.10.2 to 0.34.0 and stay as the fallback.

Standard library only: this package runs on the rehearsal host.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ._simconfig import at_least, version_tuple

FACTS_DIR = "_facts"

# vllm/config/cache.py CacheDType (0.15.1); 0.18.0 added float16, 0.33.0 nvfp4_ds_mla and more.
_CACHE_DTYPES_0_15 = ["auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla"]

# supported_kv_cache_dtypes of the MLA backends (vllm/v1/attention/backends/mla/*.py):
# 0.11.2-0.14.1 listed "auto" and the fp8 names only, 0.15.1 added "bfloat16", 0.18.0
# "float16", and TRITON_MLA gained fp8/fp8_e4m3 in 0.18.0 (PR #34597).
_FP8 = ["fp8", "fp8_e4m3"]

# vllm/v1/metrics/loggers.py PrometheusStatLogger (0.32.0): the fallback without a facts sheet.
_METRIC_NAMES_0_32 = {
    "running": "vllm:num_requests_running",
    "waiting": "vllm:num_requests_waiting",
    "kv_cache_usage": "vllm:kv_cache_usage_perc",
    "prompt_tokens": "vllm:prompt_tokens_total",
    "generation_tokens": "vllm:generation_tokens_total",
    "preemptions": "vllm:num_preemptions_total",
    "requests_succeeded": "vllm:request_success_total",
}
_FLASH_ATTN_MLA_SUPPORTED = (9,)


def _mla_kv(version: str, fp8: bool) -> list[str]:
    if at_least(version, "0.18"):
        base = ["auto", "float16", "bfloat16"]
    elif at_least(version, "0.15"):
        base = ["auto", "bfloat16"]
    else:
        base = ["auto"]
    return base + (_FP8 if fp8 else [])


class Release:
    """The behaviour of one vLLM release, as far as the simulation plays it.

    Args:
        version: the release played (``0.15.1``).
        facts: the release's facts sheet, when the rehearsal host installed one.
    """

    def __init__(self, version: str, facts: dict[str, Any] | None = None):
        self.version = version
        self.facts = facts or {}

    # Command line.

    @property
    def serve_flags(self) -> set[str] | None:
        """Every ``--flag`` of ``vllm serve`` in this release (None: no facts sheet)."""
        flags = self.facts.get("serve_flags")
        return set(flags) if flags else None

    @property
    def has_disable_log_requests(self) -> bool:
        # vllm/engine/arg_utils.py AsyncEngineArgs: present up to 0.16.0, gone in 0.17.1, back
        # in 0.33.0 as --enable-log-requests's inverse (disable_log_requests_inverts).
        flags = self.serve_flags
        if flags is not None:
            return "--disable-log-requests" in flags
        return not at_least(self.version, "0.17") or self.disable_log_requests_inverts

    @property
    def disable_log_requests_inverts(self) -> bool:
        # 0.33.0's FlexibleArgumentParser registers EnableDisableAction for
        # BooleanOptionalAction (vllm/utils/argparse_utils.py): --disable-x sets enable_x False.
        return at_least(self.version, "0.33")

    @property
    def has_attention_backend_flag(self) -> bool:
        # --attention-backend and --attention-config arrive in 0.13.0 (vllm/engine/arg_utils.py);
        # before, the backend was forced with VLLM_ATTENTION_BACKEND.
        flags = self.serve_flags
        if flags is not None:
            return "--attention-backend" in flags
        return at_least(self.version, "0.13")

    # Environment.

    def reads_env(self, name: str) -> bool:
        """Whether the release reads the ``VLLM_*`` variable ``name``: its facts sheet's list
        (vllm/envs.py environment_variables); without a sheet, VLLM_ATTENTION_BACKEND up to
        0.14.1 (gone from 0.15.1's vllm/envs.py) and every other name."""
        known = self.facts.get("env_vars")
        if known:
            return name in known
        return name != "VLLM_ATTENTION_BACKEND" or not at_least(self.version, "0.15")

    @property
    def warns_unknown_env(self) -> bool:
        # 0.31.0 adds Platform.validate_environ (vllm/platforms/interface.py), called while
        # the engine's config is built (vllm/engine/arg_utils.py): a warning per VLLM_*
        # variable set that vllm/envs.py does not list. Before, such a variable was ignored
        # without a word (vllm issue 50292).
        return at_least(self.version, "0.31")

    @property
    def kv_cache_dtypes(self) -> list[str]:
        """The values ``--kv-cache-dtype`` accepts (vllm/config/cache.py CacheDType)."""
        known = self.facts.get("kv_cache_dtypes")
        if known:
            return list(known)
        if at_least(self.version, "0.18"):
            return ["auto", "float16", *_CACHE_DTYPES_0_15[1:]]
        return list(_CACHE_DTYPES_0_15)

    @property
    def kv_dtype_checked_after_load(self) -> bool:
        # 0.33.0 types cache_dtype as `CacheDType | str`: argparse takes any value and
        # CacheConfig._validate_cache_dtype refuses it after the model config is loaded;
        # before, the Literal made argparse refuse it (vllm/config/cache.py).
        return at_least(self.version, "0.33")

    @property
    def metric_names(self) -> dict[str, str]:
        """What ``/metrics`` calls each figure the simulation exports (a counter's sample
        name with ``_total``): the facts sheet's, extracted from the release's
        vllm/v1/metrics/loggers.py; without a sheet, 0.32.0's names."""
        return {**_METRIC_NAMES_0_32, **(self.facts.get("metric_names") or {})}

    # Logs.

    def fp8_kv_log(self, kv_cache_dtype: str) -> tuple[str, str]:
        """CacheConfig._validate_cache_dtype's line: (file:line, text)."""
        if at_least(self.version, "0.33"):
            return (
                "cache.py:484",
                f"Using {kv_cache_dtype} data type to store kv cache. It reduces the GPU memory "
                "footprint and boosts the performance. Meanwhile, it may cause accuracy drop "
                "without a proper scaling factor",
            )
        return (
            "cache.py:216",
            "Using fp8 data type to store kv cache. It reduces the GPU memory footprint and "
            "boosts the performance. Meanwhile, it may cause accuracy drop without a proper "
            "scaling factor.",
        )

    def cuda_line(self, kind: str) -> str:
        """Where vllm/platforms/cuda.py logs: ``selected``, ``chosen`` or ``forcing``."""
        if at_least(self.version, "0.33"):
            lines = {"selected": 448, "chosen": 508, "forcing": 0}
        else:
            lines = {"selected": 328, "chosen": 364, "forcing": 238}
        return f"cuda.py:{lines[kind]}"

    def backend_name(self, name: str) -> str:
        """How a selected backend prints: an AttentionBackendEnum member since 0.11.2."""
        return f"AttentionBackendEnum.{name}" if at_least(self.version, "0.11") else name

    def candidates_text(self, names: list[str]) -> str:
        """The list in 'Using X attention backend out of potential backends: ...'.

        0.12.0 logs a list, 0.13.0-0.15.1 a tuple, 0.16.0 on "['A', 'B']." with a full stop
        (vllm/platforms/cuda.py get_attn_backend_cls).
        """
        if at_least(self.version, "0.16"):
            return "[" + ", ".join(f"'{n}'" for n in names) + "]."
        if at_least(self.version, "0.13"):
            return repr(tuple(names))
        return repr(list(names))

    # Attention backends.

    @property
    def selector_checks_kv_dtype(self) -> bool:
        # validate_configuration (vllm/v1/attention/backend.py) checks supported_kv_cache_dtypes
        # since 0.11.2; 0.10.2 picked MLA backends by capability and the impl refused FP8.
        return at_least(self.version, "0.11")

    def backend_kv_dtypes(self, name: str, default: list[str]) -> list[str]:
        sheet = self.facts.get("backends", {}).get(name)
        if sheet is not None and sheet.get("kv_cache_dtypes") is not None:
            return list(sheet["kv_cache_dtypes"])
        if name == "TRITON_MLA":
            return _mla_kv(self.version, fp8=at_least(self.version, "0.18"))
        if name == "FLASH_ATTN_MLA":
            return _mla_kv(self.version, fp8=False)
        if name in ("FLASHMLA", "FLASHINFER_MLA", "CUTLASS_MLA"):
            return _mla_kv(self.version, fp8=True)
        return default

    def backend_sheet(self, name: str) -> dict[str, Any] | None:
        """What the facts sheet says of a backend: KV dtypes, capabilities, mla, sparse."""
        sheet = self.facts.get("backends", {}).get(name)
        return dict(sheet) if isinstance(sheet, dict) else None

    def backend_capabilities(self, name: str) -> list[str] | None:
        """Compute capabilities the facts sheet says the backend accepts (None: no sheet)."""
        sheet = self.facts.get("backends", {}).get(name)
        if sheet is None or sheet.get("compute_capabilities") is None:
            return None
        return list(sheet["compute_capabilities"])

    def mla_priority(self, capability: tuple[int, int], kv_cache_dtype: str) -> list[str]:
        """_get_backend_priorities for an MLA model (vllm/platforms/cuda.py)."""
        cc = f"{capability[0]}.{capability[1]}"
        quantized = kv_cache_dtype.startswith("fp8")
        for case in self.facts.get("mla_priorities", []):
            if case["compute_capability"] == cc and bool(case["quantized_kv"]) == quantized:
                return list(case["backends"])
        major, version = capability[0], self.version
        if major == 10:
            first = ["FLASHINFER_MLA", "CUTLASS_MLA"]
            if not at_least(version, "0.15"):
                first = ["CUTLASS_MLA", "FLASHINFER_MLA"]
            elif at_least(version, "0.21"):
                first = ["FLASHINFER_MLA", "TOKENSPEED_MLA", "CUTLASS_MLA"]
            sparse = ["FLASHMLA_SPARSE"]
            if at_least(version, "0.17"):
                sparse = ["FLASHINFER_MLA_SPARSE", "FLASHMLA_SPARSE"]
            return [*first, "FLASH_ATTN_MLA", "FLASHMLA", "TRITON_MLA", *sparse]
        if major == 12 and at_least(version, "0.24"):
            # The SM12x branch appears in 0.24.0.
            return ["TRITON_MLA", "FLASHINFER_MLA_SPARSE_SM120"]
        return ["FLASH_ATTN_MLA", "FLASHMLA", "FLASHINFER_MLA", "TRITON_MLA", "FLASHMLA_SPARSE"]

    def blackwell_default(self, capability: tuple[int, int], qk_nope: int, sparse: bool) -> bool:
        """Whether check_and_update_config sets FLASHINFER_MLA for an MLA model on SM10x.

        0.13.0-0.17.1 set attention_config.backend = FLASHINFER_MLA on the 10.x family when
        qk_nope_head_dim == 128 and the model is not sparse (vllm/platforms/cuda.py); the
        selector then takes the 'selected backend' path.
        """
        return (
            at_least(self.version, "0.13")
            and not at_least(self.version, "0.18")
            and capability[0] == 10
            and qk_nope == 128
            and not sparse
        )

    def flashinfer_mla_head_reason(self, qk_nope: int) -> str | None:
        """FlashInferMLABackend.supports_combination's text (flashinfer_mla.py)."""
        if at_least(self.version, "0.24"):
            allowed = (64, 128, 192)
            shown = "in [64, 128, 192]"
        elif at_least(self.version, "0.18"):
            allowed, shown = (64, 128), "in [64, 128]"
        elif at_least(self.version, "0.15"):
            allowed, shown = (128,), "== 128"
        else:
            return None
        if qk_nope in allowed:
            return None
        return f"FlashInfer MLA kernel requires qk_nope_head_dim {shown}, but got {qk_nope}"


def load(version: str, folder: Path | None = None) -> Release:
    """The release played, with the facts sheet of the newest release read at or below it
    (installed in ``_facts/`` next to this file), else with the tables of this module."""
    sheets = folder or Path(__file__).resolve().parent / FACTS_DIR
    want = version_tuple(version)
    candidates = []
    for path in sheets.glob("*.json") if sheets.is_dir() else []:
        release = version_tuple(path.stem)
        if release <= want:
            candidates.append((release, path))
    if not candidates:
        return Release(version)
    try:
        facts = json.loads(max(candidates)[1].read_text())
    except (OSError, ValueError):
        return Release(version)
    return Release(version, facts if isinstance(facts, dict) else None)
