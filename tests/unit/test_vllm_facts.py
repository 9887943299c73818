"""The vLLM facts data (read from release wheels by tools/vllm_facts.py) and its loader."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from opsbook import vllm_facts
from opsbook.exceptions import OpsbookError

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "opsbook" / "data" / "vllm_facts"
WHEELS = Path("/work/cache/vllm-wheels")


def _tool():
    spec = importlib.util.spec_from_file_location(
        "vllm_facts_tool", ROOT / "tools" / "vllm_facts.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["vllm_facts_tool"] = module
    spec.loader.exec_module(module)
    return module


# --------------------------------------------------------------------------------------------
# The checked-in data


def test_index_lists_every_release_file_and_nothing_else():
    index = json.loads((DATA / "index.json").read_text())
    listed = {r["file"] for r in index["releases"]}
    present = {p.name for p in DATA.glob("*.json")} - {"index.json"}
    assert listed == present
    assert {"0.10.2.json", "0.15.1.json", "0.18.0.json", "0.33.0.json"} <= present


def test_releases_are_sorted_by_version_not_text():
    releases = vllm_facts.releases()
    assert releases.index("0.9.0" if "0.9.0" in releases else "0.10.2") == 0
    keys = [vllm_facts.version_key(r) for r in releases]
    assert keys == sorted(keys)


@pytest.mark.parametrize(
    ("asked", "used"),
    [("0.15.1", "0.15.1"), ("0.15.0", "0.14.1"), ("0.18.0", "0.18.0"), ("0.33.2", "0.33.0")],
)
def test_for_version_takes_the_nearest_release_at_or_below(asked, used):
    assert vllm_facts.for_version(asked).version == used


def test_for_version_below_the_oldest_release_says_what_to_do():
    with pytest.raises(OpsbookError) as e:
        vllm_facts.for_version("0.4.0")
    assert "oldest release read" in str(e.value)
    assert "tools/vllm_facts.py" in e.value.remedy


def test_a_non_version_is_refused_clearly():
    with pytest.raises(OpsbookError, match="not a vLLM version"):
        vllm_facts.for_version("latest")


def test_every_fact_names_its_file_in_vllm():
    for release in vllm_facts.releases():
        facts = vllm_facts.load(release)
        assert facts.mla_model_types_file, release
        assert facts.cache_dtypes_file, release
        for method in facts.quant_methods.values():
            assert method.file.startswith("vllm/model_executor/layers/quantization/"), release
        for backend in facts.backends.values():
            assert backend.file.startswith("vllm/"), (release, backend.name)
        if facts.priorities:
            assert facts.priorities_source == "vllm/platforms/cuda.py::_get_backend_priorities"


def test_facts_read_from_the_0_33_0_wheel():
    facts = vllm_facts.load("0.33.0")
    assert len(facts.mla_model_types) == 24
    assert {"kimi_k2", "deepseek_v3", "glm_moe_dsa"} <= set(facts.mla_model_types)
    assert "nvfp4" in facts.cache_dtypes
    assert facts.modelopt_kv_map == {"fp8": "fp8_e4m3", "nvfp4": "nvfp4"}
    assert facts.quant_methods["modelopt_fp4"].min_capability == 75
    assert facts.quant_methods["fp8"].min_capability == 75
    assert facts.quant_methods["modelopt"].min_capability == 80
    triton = facts.backends["TRITON_MLA"]
    assert triton.kv_cache_dtypes == ("auto", "float16", "bfloat16", "fp8", "fp8_e4m3")
    assert triton.fp8_min_capability == 89
    assert triton.supports_capability("12.0") is True
    assert facts.backends["CUTLASS_MLA"].supports_capability("12.0") is False
    assert facts.priority("12.0", True, "fp8_e4m3") == (
        "TRITON_MLA",
        "FLASHINFER_MLA_SPARSE_SM120",
    )
    assert "--kv-cache-dtype" in facts.serve_flags


def test_facts_read_from_the_0_15_1_wheel_the_incident_release():
    facts = vllm_facts.load("0.15.1")
    triton = facts.backends["TRITON_MLA"]
    assert triton.kv_cache_dtypes == ("auto", "bfloat16")
    assert triton.fp8_refusal and "FP8 KV cache not yet supported" in triton.fp8_refusal
    assert not triton.supports_kv_dtype("fp8_e4m3")
    assert "FLASHINFER_MLA_SPARSE_SM120" not in facts.backends
    # Before 0.24.0 a 12.x GPU falls into the Ampere/Hopper branch of the priorities.
    assert facts.priority("12.0", True, "auto")[0] == "FLASH_ATTN_MLA"


def test_capabilities_between_the_evaluated_ones_take_the_nearest_of_the_same_major():
    assert vllm_facts.nearest_capability("12.0", vllm_facts.EVALUATED) == "12.0"
    assert vllm_facts.nearest_capability("8.7", vllm_facts.EVALUATED) == "8.6"
    assert vllm_facts.nearest_capability("10.1", vllm_facts.EVALUATED) == "10.0"
    assert vllm_facts.nearest_capability("13.0", vllm_facts.EVALUATED) == "12.1"


def test_release_without_a_priority_function_has_no_priority_list():
    facts = vllm_facts.load("0.10.2")
    assert facts.priorities == ()
    assert facts.priority("9.0", True, "auto") is None
    assert "if-chain" in (facts.priorities_note or "")


def test_parse_refuses_nothing_but_reads_an_extraction_error_as_no_backend():
    data = json.loads((DATA / "0.33.0.json").read_text())
    data["attention_backends"]["backends"]["TRITON_MLA"] = {"class": "x.Y", "error": "gone"}
    facts = vllm_facts.parse(data)
    assert "TRITON_MLA" not in facts.backends
    assert "FLASHMLA" in facts.backends


# --------------------------------------------------------------------------------------------
# The tool


def _wheel(version: str) -> Path | None:
    found = sorted(WHEELS.glob(f"vllm-{version}-*.whl")) if WHEELS.is_dir() else []
    return found[0] if found else None


def test_the_tool_reproduces_a_checked_in_file_byte_for_byte(tmp_path):
    wheel = _wheel("0.15.1")
    if wheel is None:
        pytest.skip(f"no vLLM 0.15.1 wheel in {WHEELS} (CI has none; the checked-in data is used)")
    tool = _tool()
    entry = tool.write_release(wheel, tmp_path)
    assert (tmp_path / entry["file"]).read_bytes() == (DATA / "0.15.1.json").read_bytes()


def test_the_tool_interprets_a_priority_function(tmp_path):
    tool = _tool()
    source = """
def _get_backend_priorities(use_mla, device_capability, kv_cache_dtype=None, num_heads=None):
    from x import is_quantized_kv_cache
    if use_mla:
        if device_capability.major == 12:
            tail = [AttentionBackendEnum.B]
            if kv_cache_dtype is not None and is_quantized_kv_cache(kv_cache_dtype):
                tail.insert(0, AttentionBackendEnum.C)
            return [AttentionBackendEnum.A, *tail]
        return [AttentionBackendEnum.A]
    new = device_capability >= DeviceCapability(8, 0)
    return [AttentionBackendEnum.F if new else AttentionBackendEnum.T]
"""
    import ast

    fn = ast.parse(source).body[0]
    cap = tool.Cap((12, 0))
    assert tool.call_with(
        fn, {"use_mla": True, "device_capability": cap, "kv_cache_dtype": "fp8_e4m3"}, cap
    ) == ["A", "C", "B"]
    assert tool.call_with(
        fn, {"use_mla": True, "device_capability": cap, "kv_cache_dtype": "auto"}, cap
    ) == ["A", "B"]
    old = tool.Cap((7, 5))
    assert tool.call_with(fn, {"use_mla": False, "device_capability": old}, old) == ["T"]


def test_the_tool_reports_what_it_cannot_interpret():
    tool = _tool()
    import ast

    fn = ast.parse("def f(capability):\n    return mystery(capability)\n").body[0]
    with pytest.raises(tool.Unresolved, match="mystery"):
        tool.call_with(fn, {"capability": tool.Cap((9, 0))}, tool.Cap((9, 0)))
