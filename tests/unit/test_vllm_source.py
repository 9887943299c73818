"""vLLM's source read without importing it (``opsbook/remote/probes/vllm_source.py``).

A stand-in ``vllm`` package laid out as the real one (registry, cuda.py's priority function,
``AttentionBackend`` base class with vLLM's default declarations) whose ``__init__`` records
every import: the source reader must answer without it, and the backends probe must use it.
"""

from __future__ import annotations

import os
from pathlib import Path

from opsbook.knowledge.compat.backend_answers import BackendsAnswer, SourceReading
from opsbook.remote import probes
from opsbook.remote.probes import vllm_source
from opsbook.remote.probes.vllm_source import FolderSource, select

REGISTRY = """
import enum
class AttentionBackendEnum(enum.Enum):
    TRITON_MLA = "vllm.backends.triton_mla.TritonMLABackend"
    FLASHMLA = "vllm.backends.flashmla.FlashMLABackend"
    EXTRA_MLA = "vllm.backends.extra.ExtraMLABackend"
"""

CUDA = """
def _get_backend_priorities(use_mla, device_capability, kv_cache_dtype=None):
    if use_mla and device_capability.major == 12:
        return [AttentionBackendEnum.EXTRA_MLA, AttentionBackendEnum.TRITON_MLA]
    return [AttentionBackendEnum.FLASHMLA, AttentionBackendEnum.TRITON_MLA]
"""

# vLLM's base class defaults (vllm/v1/attention/backend.py, 0.32.0), trimmed.
BASE = """
import torch
class AttentionBackend:
    supported_dtypes = [torch.float16, torch.bfloat16]
    supported_kv_cache_dtypes = ["auto", "float16", "bfloat16"]
    @classmethod
    def get_supported_head_sizes(cls):
        return []
    @classmethod
    def is_mla(cls):
        return False
    @classmethod
    def is_sparse(cls):
        return False
    @classmethod
    def supports_compute_capability(cls, capability):
        return True
"""

TRITON = """
from vllm.backend import AttentionBackend
class TritonMLABackend(AttentionBackend):
    supported_kv_cache_dtypes = ["auto", "bfloat16"]
    @classmethod
    def is_mla(cls):
        return True
"""

FLASHMLA = """
from vllm.backend import AttentionBackend
class FlashMLABackend(AttentionBackend):
    supported_kv_cache_dtypes = ["auto", "bfloat16", "fp8_e4m3"]
    @classmethod
    def is_mla(cls):
        return True
    @classmethod
    def get_supported_head_sizes(cls):
        return [576]
    @classmethod
    def supports_compute_capability(cls, capability):
        return capability.major in [9, 10]
"""

EXTRA = """
import opsbook_no_such_package_here
from vllm.backend import AttentionBackend
class ExtraMLABackend(AttentionBackend):
    @classmethod
    def is_mla(cls):
        return True
"""


def stand_in(root: Path, log: Path, flashmla: str = FLASHMLA) -> dict[str, str]:
    pkg = root / "vllm"
    for folder in ("platforms", "v1/attention/backends", "backends"):
        (pkg / folder).mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text(
        f"__version__ = '9.9.9'\nopen({str(log)!r}, 'a').write('imported\\n')\n"
    )
    (pkg / "platforms" / "cuda.py").write_text(CUDA)
    (pkg / "v1" / "attention" / "backends" / "registry.py").write_text(REGISTRY)
    (pkg / "backend.py").write_text(BASE)
    (pkg / "backends" / "triton_mla.py").write_text(TRITON)
    (pkg / "backends" / "flashmla.py").write_text(flashmla)
    (pkg / "backends" / "extra.py").write_text(EXTRA)
    dist = root / "vllm-9.9.9.dist-info"
    dist.mkdir(exist_ok=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 9.9.9\n")
    return {**os.environ, "PYTHONPATH": str(root), "XDG_CACHE_HOME": str(root / "cache")}


def cases(*caps: str) -> dict[str, object]:
    return {
        "cases": [
            {"use_mla": True, "head_size": 576, "compute_capability": c, "kv_cache_dtype": kv}
            for c in caps
            for kv in ("auto", "fp8_e4m3")
        ]
    }


def test_the_selection_follows_the_priority_function_and_the_declarations(tmp_path):
    stand_in(tmp_path, tmp_path / "imports.log")
    answer = SourceReading.parse(select(FolderSource(tmp_path), cases("12.0", "9.0", "8.0")))
    assert answer.note is None and answer.unresolved == {}
    sm120 = answer.selections["12.0|True|fp8_e4m3"]
    assert sm120.order == ["EXTRA_MLA", "TRITON_MLA"]
    assert sm120.chosen is None
    # A package the backend's module imports is missing: reported as vLLM would.
    assert sm120.reasons["EXTRA_MLA"] == [
        "not importable: ModuleNotFoundError: No module named 'opsbook_no_such_package_here'"
    ]
    assert sm120.reasons["TRITON_MLA"] == ["kv_cache_dtype not supported"]
    assert answer.selections["12.0|True|auto"].chosen == "TRITON_MLA"
    assert answer.selections["9.0|True|fp8_e4m3"].chosen == "FLASHMLA"
    assert answer.selections["8.0|True|auto"].reasons["FLASHMLA"] == [
        "compute capability not supported"
    ]
    assert answer.kv_dtypes["FLASHMLA"] == ["auto", "bfloat16", "fp8_e4m3"]
    assert not (tmp_path / "imports.log").exists()


def test_the_probe_reads_the_source_and_never_imports_vllm(tmp_path):
    log = tmp_path / "imports.log"
    env = stand_in(tmp_path, log)
    answer = BackendsAnswer.parse(
        probes.run_local(
            "backends", {"python": "/usr/bin/python3", "capabilities": ["9.0"]}, env=env
        )
    )
    assert answer.read_from == "source" and answer.why_not_source is None
    assert answer.selections["9.0|True|fp8_e4m3"].chosen == "FLASHMLA"
    assert not log.exists()


def test_a_check_the_source_cannot_settle_asks_vllm_itself_and_says_why(tmp_path):
    log = tmp_path / "imports.log"
    runtime = FLASHMLA.replace(
        "return capability.major in [9, 10]", "return kernels_built() and capability.major == 9"
    )
    env = stand_in(tmp_path, log, flashmla=runtime)
    unresolved = SourceReading.parse(select(FolderSource(tmp_path), cases("9.0"))).unresolved
    assert "kernels_built" in unresolved["FLASHMLA"][0]
    answer = BackendsAnswer.parse(
        probes.run_local(
            "backends", {"python": "/usr/bin/python3", "capabilities": ["9.0"]}, env=env
        )
    )
    assert answer.read_from == "import"
    assert "FLASHMLA" in answer.why_not_source
    assert log.exists()


def test_the_probe_carries_the_shared_reader_to_the_host():
    program = probes.assemble("backends", {})
    assert probes.includes(probes.source("backends")) == ["vllm_source"]
    assert "INCLUDED_SOURCES.update(" in program
    assert "def select(" in program
    assert vllm_source.__doc__ is not None and "without importing" in vllm_source.__doc__
