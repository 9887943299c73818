"""``TritonMLABackend`` as opsbook probes it: its supported KV-cache dtypes for this version."""

from __future__ import annotations

from ..... import __version__
from ....._simmodel import triton_mla_kv_dtypes
from ....._simrelease import load


class TritonMLABackend:
    """The dense MLA backend that runs on any compute capability (the only one on SM 12.x)."""

    supported_dtypes = ["float16", "bfloat16"]
    supported_kv_cache_dtypes = triton_mla_kv_dtypes(load(__version__))

    @staticmethod
    def get_name() -> str:
        return "TRITON_MLA"

    @classmethod
    def supports_compute_capability(cls, capability: object) -> bool:
        return True
