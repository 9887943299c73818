"""Unit tests of opsbook.knowledge.compat on real checkpoint configs (tests/data/checkpoints)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from opsbook.core.exceptions import OpsbookError
from opsbook.core.results import SEVERITIES
from opsbook.knowledge.compat import (
    CONDITIONS,
    FINDING_COLUMNS,
    NO_GPU_FACTS,
    ModelFacts,
    capability_int,
    check_compat,
    facts_from_texts,
    kv_cache_bytes_per_token,
    kv_cache_bytes_per_token_per_layer,
    kv_tradeoff_table,
    load_rules,
    model_facts,
    parse_version,
    resolve_kv_cache_dtype,
    select_backend,
    tokens_that_fit,
    version_in,
)
from opsbook.knowledge.compat.rules_table import When, parse_rules

DATA = Path(__file__).resolve().parents[1] / "data" / "checkpoints"
SM120 = [{"index": i, "compute_cap": "12.0"} for i in range(8)]
H200 = [{"index": 0, "compute_cap": "9.0"}]
B200 = [{"index": 0, "compute_cap": "10.0"}]
KIMI_ARGS = {
    "tool-call-parser": "kimi_k2",
    "enable-auto-tool-choice": True,
    "trust-remote-code": True,
}
TRITON_FP8 = {"TRITON_MLA": ["auto", "float16", "bfloat16", "fp8", "fp8_e4m3"]}


def load(name: str) -> Any:
    return json.loads((DATA / name).read_text())


@pytest.fixture(scope="module")
def kimi25() -> ModelFacts:
    return model_facts(
        load("kimi-k25-nvfp4-config.json"),
        load("hf_quant_config-Kimi-K2.6-NVFP4.json"),
        load("kimi-tokenizer_config.json"),
    )


def rule_ids(result: Any) -> list[str]:
    ids = {r.id for r in load_rules().rules}
    return [f.code for f in result.findings if f.code in ids]


# --- model facts ---------------------------------------------------------------------------


def test_kimi_k25_nvfp4_facts(kimi25: ModelFacts) -> None:
    assert kimi25.architectures == ("KimiK25ForConditionalGeneration", "DeepseekV3ForCausalLM")
    assert kimi25.model_type == "kimi_k25"
    assert kimi25.text_model_type == "deepseek_v3"
    assert kimi25.mla and not kimi25.sparse_mla
    assert kimi25.head_size == 576
    assert kimi25.num_layers == 61
    assert kimi25.quant_method == "modelopt_fp4"
    assert kimi25.quant_algo == "NVFP4"
    assert kimi25.quant_source == "config.json:quantization_config"
    assert kimi25.quant_sources == ("config.json:quantization_config", "hf_quant_config.json")
    assert kimi25.kv_cache_algo == "FP8"
    assert kimi25.kv_cache_dtype == "fp8_e4m3"
    assert kimi25.kv_cache_keys == (
        "config.json:quantization_config.kv_cache_scheme",
        "hf_quant_config.json:quantization.kv_cache_quant_algo",
    )
    assert kimi25.needs_remote_code
    assert any("configuration_kimi_k25" in r for r in kimi25.remote_code)
    assert any("tokenization_kimi.TikTokenTokenizer" in r for r in kimi25.remote_code)
    assert kimi25.notes == ()


def test_kimi_k26_nvfp4_facts_from_config_alone() -> None:
    facts = model_facts(load("kimi-k26-nvfp4-config.json"), None)
    assert facts.mla and facts.head_size == 576
    assert facts.quant_method == "modelopt_fp4"
    assert facts.kv_cache_dtype == "fp8_e4m3"
    assert facts.quant_sources == ("config.json:quantization_config",)


def test_kimi_k25_int4_quantization_lives_in_text_config() -> None:
    facts = model_facts(load("kimi-k25-config.json"), None)
    assert facts.text_model_type == "kimi_k2"
    assert facts.mla and facts.head_size == 576
    assert facts.quant_method == "compressed-tensors"
    assert facts.quant_source == "config.json:text_config.quantization_config"
    assert facts.kv_cache_algo is None and facts.kv_cache_dtype == "auto"


def test_deepseek_r1_fp8_facts() -> None:
    facts = model_facts(load("deepseek-r1-config.json"), None)
    assert facts.architectures == ("DeepseekV3ForCausalLM",)
    assert facts.mla and facts.head_size == 576 and facts.num_layers == 61
    assert facts.quant_method == "fp8"
    assert facts.kv_cache_dtype == "auto"


def test_deepseek_v31_nvfp4_reads_the_older_hf_quant_config() -> None:
    facts = model_facts(
        load("deepseek-v31-nvfp4-config.json"), load("hf_quant_config-DeepSeek-V3.1-NVFP4.json")
    )
    assert facts.quant_source == "hf_quant_config.json"
    assert facts.quant_method == "modelopt_fp4"
    assert facts.kv_cache_dtype == "fp8_e4m3"


def test_non_mla_model_head_size_is_its_head_dim() -> None:
    config = {
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "num_hidden_layers": 94,
        "num_attention_heads": 64,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "hidden_size": 4096,
    }
    facts = model_facts(config, load("hf_quant_config-Qwen3-235B-A22B-NVFP4.json"))
    assert not facts.mla
    assert facts.head_size == 128
    assert facts.kv_cache_dtype == "fp8_e4m3"
    assert not facts.needs_remote_code


def test_config_json_wins_and_a_disagreement_is_noted() -> None:
    config = load("kimi-k25-nvfp4-config.json")
    del config["quantization_config"]["kv_cache_scheme"]
    facts = model_facts(config, load("hf_quant_config-Kimi-K2.6-NVFP4.json"))
    assert facts.kv_cache_dtype == "auto"
    assert facts.kv_cache_keys == ("hf_quant_config.json:quantization.kv_cache_quant_algo",)
    assert any("vLLM reads config.json:quantization_config" in n for n in facts.notes)


@pytest.mark.parametrize(
    ("kv", "algo", "dtype"),
    [
        ("FP8", "FP8", "fp8_e4m3"),
        ("fp8", "FP8", "fp8_e4m3"),
        ({"dynamic": False, "num_bits": 8, "type": "float"}, "FP8", "fp8_e4m3"),
        # MODELOPT_TO_VLLM_KV_CACHE_DTYPE_MAP has nvfp4 from vLLM 0.20.2 (vllm/utils/torch_utils.py)
        ("NVFP4", "NVFP4", "nvfp4"),
        (None, None, "auto"),
    ],
)
def test_kv_cache_dtype_resolves_as_vllm(kv: Any, algo: str | None, dtype: str) -> None:
    hf_quant = {
        "producer": {"name": "modelopt"},
        "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": kv},
    }
    facts = model_facts({"model_type": "llama"}, hf_quant)
    assert facts.quant_method == "modelopt"
    assert (facts.kv_cache_algo, facts.kv_cache_dtype) == (algo, dtype)


def test_facts_from_texts_needs_config_json() -> None:
    with pytest.raises(OpsbookError, match="config.json is missing"):
        facts_from_texts({"hf_quant_config.json": "{}"})
    with pytest.raises(OpsbookError, match="not valid JSON"):
        facts_from_texts({"config.json": "{"})


# --- the table -----------------------------------------------------------------------------


def test_rules_table_is_complete_and_consistent() -> None:
    table = load_rules()
    names = set(table.backends)
    for priority in table.priorities:
        for kind in ("mla", "sparse_mla", "non_mla"):
            assert set(getattr(priority, kind)) <= names
    # Every condition the schema admits is evaluated by a function, and no other.
    assert set(CONDITIONS) == set(When.model_fields)
    for rule in table.rules:
        assert all((rule.id, rule.title, rule.what, rule.why, rule.remedy, rule.source)), rule.id
        assert rule.severity in SEVERITIES
        assert dict(rule.when.given()), rule.id
    assert len({r.id for r in table.rules}) == len(table.rules)
    assert {r.id for r in table.rules} >= {
        "fp8-kv-mla-triton",
        "fp8-kv-flash-attn-mla",
        "quant-below-min-capability",
        "explicit-bf16-kv-vs-checkpoint",
        "tool-parser-without-auto-choice",
        "disable-log-requests-removed",
        "remote-code-without-trust",
    }


def test_a_malformed_rule_is_named_with_its_field() -> None:
    table = load_rules().model_dump(by_alias=True)
    table["rules"][1]["when"]["mla_typo"] = True
    with pytest.raises(OpsbookError, match=r"rule 'fp8-kv-mla-triton', field when\.mla_typo"):
        parse_rules(table)
    table = load_rules().model_dump(by_alias=True)
    table["rules"][0]["severity"] = "fatal"
    with pytest.raises(OpsbookError, match=r"rule 'kv-cache-dtype-unknown', field severity"):
        parse_rules(table)
    table = load_rules().model_dump(by_alias=True)
    del table["backends"]["TRITON_MLA"]["mla"]
    with pytest.raises(OpsbookError, match=r"backends 'TRITON_MLA', field mla"):
        parse_rules(table)


def test_every_finding_text_is_filled(kimi25: ModelFacts) -> None:
    args = {"tool-call-parser": "kimi_k2", "disable-log-requests": True}
    result = check_compat(kimi25, SM120, "0.15.1", args)
    for row in result.evidence.findings_table.rows:
        assert not re.search(r"\{[a-z_:\-]+\}", " ".join(row)), row


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("0.15.1", (0, 15, 1)),
        ("v0.17.0", (0, 17, 0)),
        ("0.20.2rc1.dev249+gabc", (0, 20, 2)),
        ("0.18", (0, 18, 0)),
        (None, None),
        ("unknown", None),
    ],
)
def test_parse_version(text: str | None, parsed: tuple[int, int, int] | None) -> None:
    assert parse_version(text) == parsed


def test_version_ranges() -> None:
    assert version_in((0, 15, 1), "<0.18") is True
    assert version_in((0, 18, 0), "<0.18") is False
    assert version_in((0, 19, 0), ">=0.13,<0.20") is True
    assert version_in(None, "<0.18") is None
    assert version_in(None, "any") is True
    assert capability_int("12.0") == 120 and capability_int("8.9") == 89


# --- backend selection ---------------------------------------------------------------------


def test_sm120_fp8_mla_has_no_backend_before_the_triton_fp8_release() -> None:
    # vLLM 0.15.1 has no 12.x branch in _get_backend_priorities (it appears in 0.24.0): 12.x
    # falls into the Ampere/Hopper list, where only TRITON_MLA accepts the capability and
    # it lacks FP8 (vllm/v1/attention/backends/mla/triton_mla.py).
    choice = select_backend(True, "12.0", "fp8_e4m3", "0.15.1", head_size=576)
    assert choice.name is None
    assert choice.candidates[:4] == ("FLASH_ATTN_MLA", "FLASHMLA", "FLASHINFER_MLA", "TRITON_MLA")
    assert choice.reasons["TRITON_MLA"] == ["kv_cache_dtype not supported"]
    assert "compute capability not supported" in choice.reasons["FLASHMLA"]
    assert choice.source == "vLLM's 0.15.1 source, opsbook table"


def test_sm120_fp8_mla_uses_triton_mla_from_0_18_0() -> None:
    assert select_backend(True, "12.0", "fp8_e4m3", "0.17.1").name is None
    assert select_backend(True, "12.0", "fp8_e4m3", "0.18.0").name == "TRITON_MLA"
    newest = select_backend(True, "12.0", "fp8_e4m3", "0.33.0")
    assert newest.candidates == ("TRITON_MLA", "FLASHINFER_MLA_SPARSE_SM120")


def test_triton_mla_fp8_needs_sm89_from_0_26_0() -> None:
    assert select_backend(True, "8.0", "fp8_e4m3", "0.25.1").name == "TRITON_MLA"
    choice = select_backend(True, "8.0", "fp8_e4m3", "0.26.0")
    assert choice.name is None
    assert choice.reasons["TRITON_MLA"] == ["FP8 KV cache needs compute capability 8.9"]


def test_sm120_bf16_mla_uses_triton_mla() -> None:
    assert select_backend(True, "12.0", "auto", "0.15.1").name == "TRITON_MLA"


def test_h200_fp8_mla_skips_flash_attn_mla_for_flashmla() -> None:
    choice = select_backend(True, "9.0", "fp8_e4m3", "0.15.1")
    assert choice.name == "FLASHMLA"
    assert choice.reasons == {"FLASH_ATTN_MLA": ["kv_cache_dtype not supported"]}


def test_b200_mla_prefers_flashinfer_mla() -> None:
    assert select_backend(True, "10.0", "fp8_e4m3", "0.15.1").name == "FLASHINFER_MLA"


def test_probe_takes_precedence_over_version_table() -> None:
    choice = select_backend(True, "12.0", "fp8_e4m3", "0.15.1", probed_backends=TRITON_FP8)
    assert choice.name == "TRITON_MLA" and not choice.uncertain


def test_unknown_version_is_uncertain() -> None:
    choice = select_backend(True, "12.0", "fp8_e4m3", None)
    assert choice.uncertain
    assert "disagree" in choice.source
    assert not select_backend(True, "9.0", "auto", None).uncertain


def test_non_mla_model_always_finds_a_backend() -> None:
    # FLASH_ATTN lacks FP8 on 0.15.1; FLASHINFER, next in the list, has it.
    assert select_backend(False, "12.0", "fp8_e4m3", "0.15.1").name == "FLASHINFER"
    assert select_backend(False, "12.0", "auto", "0.15.1").name == "FLASH_ATTN"


# --- rules ---------------------------------------------------------------------------------


def test_incident_fp8_kv_mla_on_sm120_with_015_is_an_error(kimi25: ModelFacts) -> None:
    result = check_compat(kimi25, SM120, "0.15.1", KIMI_ARGS)
    assert not result.ok
    assert rule_ids(result) == ["fp8-kv-mla-triton"]
    error = result.findings[0]
    assert error.severity == "error"
    assert "TritonMLA V1 with FP8 KV cache not yet supported" in error.message
    assert "config.json:quantization_config.kv_cache_scheme" in error.message
    assert "kv_cache_scheme" in error.remedy
    assert result.evidence.kv_cache_dtype == "fp8_e4m3"
    assert result.evidence.findings_table.columns == FINDING_COLUMNS
    assert result.evidence.findings_table.rows[0][0] == "error"


def test_fp8_kv_mla_on_sm120_with_018_is_fine(kimi25: ModelFacts) -> None:
    result = check_compat(kimi25, SM120, "0.18.0", KIMI_ARGS)
    assert result.ok, str(result)
    assert result.evidence.backends["12.0"].name == "TRITON_MLA"


def test_fp8_kv_mla_on_sm120_with_probed_fp8_support_is_fine(kimi25: ModelFacts) -> None:
    result = check_compat(kimi25, SM120, "0.15.1", KIMI_ARGS, probed_backends=TRITON_FP8)
    assert result.ok, str(result)


def test_unknown_vllm_version_gives_a_warning_not_an_error(kimi25: ModelFacts) -> None:
    result = check_compat(kimi25, SM120, None, KIMI_ARGS)
    assert result.ok
    assert [f.severity for f in result.findings if f.code == "fp8-kv-mla-triton"] == ["warning"]
    assert "version is unknown" in result.findings[0].message


def test_patched_checkpoint_on_sm120_is_fine(kimi25: ModelFacts) -> None:
    config = load("kimi-k25-nvfp4-config.json")
    del config["quantization_config"]["kv_cache_scheme"]
    hf_quant = load("hf_quant_config-Kimi-K2.6-NVFP4.json")
    hf_quant["quantization"]["kv_cache_quant_algo"] = None
    facts = model_facts(config, hf_quant, load("kimi-tokenizer_config.json"))
    result = check_compat(facts, SM120, "0.15.1", KIMI_ARGS)
    assert result.ok, str(result)


def test_fp8_dense_mla_on_h200_uses_flashmla() -> None:
    facts = model_facts(load("deepseek-r1-config.json"), None)
    args = {"kv-cache-dtype": "fp8", "trust-remote-code": True}
    result = check_compat(facts, H200, "0.15.1", args)
    assert result.ok, str(result)
    assert result.evidence.backends["9.0"].name == "FLASHMLA"
    assert any(f.severity == "ok" and "FLASHMLA" in f.message for f in result.findings)


def test_nvfp4_on_h200_is_fine_its_minimum_is_75(kimi25: ModelFacts) -> None:
    # ModelOptNvFp4Config.get_min_capability returns 75 from 0.14.1 (80 before), never 100.
    result = check_compat(kimi25, H200, "0.15.1", KIMI_ARGS)
    assert "quant-below-min-capability" not in rule_ids(result)


def test_nvfp4_on_a_turing_gpu_before_0_14_is_a_capability_error(kimi25: ModelFacts) -> None:
    result = check_compat(kimi25, [{"compute_cap": "7.5"}], "0.13.0", KIMI_ARGS)
    assert "quant-below-min-capability" in rule_ids(result)
    finding = next(f for f in result.findings if f.code == "quant-below-min-capability")
    assert "Minimum capability: 80. Current capability: 75" in finding.message
    assert "quant-below-min-capability" not in rule_ids(
        check_compat(kimi25, [{"compute_cap": "7.5"}], "0.14.1", KIMI_ARGS)
    )


def test_nvfp4_on_b200_is_fine(kimi25: ModelFacts) -> None:
    result = check_compat(kimi25, B200, "0.15.1", KIMI_ARGS)
    assert result.ok, str(result)
    assert result.evidence.backends["10.0"].name == "FLASHINFER_MLA"


def test_forced_flash_attn_mla_with_fp8_kv_on_h200() -> None:
    facts = model_facts(load("deepseek-r1-config.json"), None)
    args = {
        "--kv-cache-dtype": "fp8",
        "--attention-backend": "FLASH_ATTN_MLA",
        "--trust-remote-code": True,
    }
    result = check_compat(facts, H200, "0.15.1", args)
    assert rule_ids(result) == ["fp8-kv-flash-attn-mla"]
    assert (
        "Selected backend AttentionBackendEnum.FLASH_ATTN_MLA is not valid"
        in result.findings[0].message
    )


def test_forced_backend_on_the_wrong_gpu() -> None:
    facts = model_facts(load("deepseek-r1-config.json"), None)
    args = {"attention_backend": "FLASHMLA", "trust_remote_code": True}
    result = check_compat(facts, SM120, "0.15.1", args)
    assert rule_ids(result) == ["forced-backend-invalid"]
    assert "compute capability not supported" in result.findings[0].message


def test_sparse_mla_on_sm120_before_its_backend_has_no_backend() -> None:
    config = dict(load("deepseek-r1-config.json"), model_type="deepseek_v32", index_topk=2048)
    facts = model_facts(config, load("hf_quant_config-DeepSeek-V3.1-NVFP4.json"))
    result = check_compat(facts, SM120, "0.13.0", {"trust-remote-code": True})
    assert rule_ids(result) == ["no-valid-backend"]


def test_explicit_bf16_kv_against_checkpoint_algo(kimi25: ModelFacts) -> None:
    args = dict(KIMI_ARGS, **{"kv-cache-dtype": "bfloat16"})
    result = check_compat(kimi25, SM120, "0.15.1", args)
    assert rule_ids(result) == ["explicit-bf16-kv-vs-checkpoint"]
    assert "Unsupported data type of kv cache: bfloat16" in result.findings[0].message
    assert check_compat(kimi25, SM120, "0.20.0", args).ok


def test_tool_call_parser_without_auto_tool_choice_is_a_warning(kimi25: ModelFacts) -> None:
    args = {"tool-call-parser": "kimi_k2", "trust-remote-code": True}
    result = check_compat(kimi25, SM120, "0.18.0", args)
    assert result.ok
    assert rule_ids(result) == ["tool-parser-without-auto-choice"]
    assert result.findings[0].severity == "warning"
    assert "--tool-call-parser kimi_k2" in result.findings[0].remedy


def test_auto_tool_choice_without_parser_is_an_error(kimi25: ModelFacts) -> None:
    args = {"enable-auto-tool-choice": True, "trust-remote-code": True}
    result = check_compat(kimi25, SM120, "0.18.0", args)
    assert rule_ids(result) == ["enable-auto-tool-choice-without-parser"]


# vLLM 0.16.0's arg_utils.py still adds --disable-log-requests; 0.17.1's to 0.32.0's do not;
# 0.33.0's argparse_utils.py accepts it again as the inverse of --enable-log-requests.
@pytest.mark.parametrize(
    ("version", "fires"),
    [
        ("0.11.0", False),
        ("0.16.0", False),
        ("0.17.1", True),
        ("0.32.0", True),
        ("0.33.0", False),
        ("0.34.0", False),
        (None, True),
    ],
)
def test_disable_log_requests(kimi25: ModelFacts, version: str | None, fires: bool) -> None:
    args = dict(KIMI_ARGS, **{"disable-log-requests": True})
    result = check_compat(kimi25, B200, version, args)
    assert ("disable-log-requests-removed" in rule_ids(result)) is fires
    if version is None:
        assert result.ok


def test_remote_code_without_trust_remote_code(kimi25: ModelFacts) -> None:
    result = check_compat(kimi25, B200, "0.18.0", {})
    assert rule_ids(result) == ["remote-code-without-trust"]
    assert result.findings[0].severity == "error"
    r1 = model_facts(load("deepseek-r1-config.json"), None)
    result = check_compat(r1, H200, "0.18.0", {})
    assert rule_ids(result) == ["remote-code-native-type"]
    assert result.findings[0].severity == "warning"


def test_gpu_objects_from_preflight_are_accepted(kimi25: ModelFacts) -> None:
    from opsbook.steps.host_facts import Gpu

    gpus = [Gpu(index=i, name="RTX PRO 6000", compute_cap="12.0") for i in range(2)]
    assert not check_compat(kimi25, gpus, "0.15.1", KIMI_ARGS).ok


def test_no_gpus_means_capability_rules_are_not_checked(kimi25: ModelFacts) -> None:
    result = check_compat(kimi25, [], "0.15.1", KIMI_ARGS)
    assert result.ok
    assert result.findings[-1].subject == "GPUs"
    assert result.findings[-1].code == NO_GPU_FACTS


def test_serve_arg_spellings_resolve_the_same(kimi25: ModelFacts) -> None:
    for key in ("kv-cache-dtype", "--kv-cache-dtype", "kv_cache_dtype"):
        assert resolve_kv_cache_dtype(kimi25, {key: "bfloat16"}) == (
            "bfloat16",
            "--kv-cache-dtype bfloat16",
        )
    dtype, origin = resolve_kv_cache_dtype(kimi25, {"kv-cache-dtype": "auto"})
    assert dtype == "fp8_e4m3" and origin.startswith("the checkpoint asks for it")


# --- KV sizing -----------------------------------------------------------------------------


def test_mla_kv_bytes_per_token(kimi25: ModelFacts) -> None:
    assert kv_cache_bytes_per_token_per_layer(kimi25, "fp8_e4m3") == 576
    assert kv_cache_bytes_per_token_per_layer(kimi25, "bfloat16") == 1152
    assert kv_cache_bytes_per_token_per_layer(kimi25, "auto") == 1152
    assert kv_cache_bytes_per_token(kimi25, "fp8") == 576 * 61
    assert kv_cache_bytes_per_token(kimi25, "bfloat16") == 1152 * 61


def test_tokens_that_fit_halve_with_bf16(kimi25: ModelFacts) -> None:
    free = 20 * 1024**3
    fp8 = tokens_that_fit(free, kimi25, "fp8_e4m3")
    bf16 = tokens_that_fit(free, kimi25, "bfloat16")
    assert fp8 == free // (576 * 61)
    assert bf16 == free // (1152 * 61)
    assert tokens_that_fit(-1, kimi25, "bfloat16") == 0


def test_non_mla_kv_bytes_per_token() -> None:
    facts = ModelFacts(num_layers=94, num_kv_heads=4, head_dim=128)
    assert kv_cache_bytes_per_token(facts, "bfloat16") == 2 * 4 * 128 * 2 * 94


def test_unknown_kv_dtype_is_refused(kimi25: ModelFacts) -> None:
    with pytest.raises(OpsbookError, match="unknown KV cache dtype"):
        kv_cache_bytes_per_token(kimi25, "int3")


def test_kv_budget_is_the_memory_left_after_the_weights_slice() -> None:
    from opsbook.knowledge.compat import kv_budget_bytes

    gpus = [{"memory_total_mib": 97887}] * 8
    weights = 540 * 10**9
    budget = kv_budget_bytes(gpus, weights, utilization=0.9)
    assert budget == int(97887 * 2**20 * 0.9 - weights / 8)
    assert kv_budget_bytes([], weights) == 0
    assert kv_budget_bytes(gpus[:1], weights) == 0


def test_the_verdict_names_the_source_of_its_prediction(kimi25: ModelFacts) -> None:
    from_source = check_compat(kimi25, SM120, "0.15.1", KIMI_ARGS)
    assert from_source.message.endswith("(vLLM's 0.15.1 source, opsbook table)")
    assert from_source.evidence.source == "vLLM's 0.15.1 source, opsbook table"
    older = check_compat(kimi25, SM120, "0.9.2", KIMI_ARGS)
    assert older.evidence.source == "opsbook table compat_rules.yaml"


def test_a_kv_cache_dtype_the_release_does_not_know_is_an_error(kimi25: ModelFacts) -> None:
    args = dict(KIMI_ARGS, **{"kv-cache-dtype": "nvfp4"})
    # CacheDType has nvfp4 from vLLM 0.20.2 (vllm/config/cache.py).
    old = check_compat(kimi25, B200, "0.15.1", args)
    assert rule_ids(old) == ["kv-cache-dtype-unknown"]
    assert "vLLM 0.15.1 vllm/config/cache.py" in old.findings[0].message
    assert "kv-cache-dtype-unknown" not in rule_ids(check_compat(kimi25, B200, "0.33.0", args))
    unknown_version = check_compat(kimi25, B200, None, args)
    assert any(
        f.severity == "warning" and f.code == "kv-cache-dtype-unknown"
        for f in unknown_version.findings
    )
    bogus = check_compat(kimi25, B200, None, dict(KIMI_ARGS, **{"kv-cache-dtype": "fp3"}))
    assert "kv-cache-dtype-unknown" in rule_ids(bogus) and not bogus.ok


def test_the_tradeoff_table_shows_an_nvfp4_kv_cache_first() -> None:
    hf_quant = {
        "producer": {"name": "modelopt"},
        "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": "NVFP4"},
    }
    config = {
        "model_type": "llama",
        "num_hidden_layers": 2,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "hidden_size": 1024,
    }
    facts = model_facts(config, hf_quant)
    assert facts.kv_cache_dtype == "nvfp4"
    table = kv_tradeoff_table(2**20, facts)
    assert [row[0] for row in table.rows] == ["nvfp4", "fp8_e4m3", "bfloat16"]
    assert [row[1] for row in table.rows] == [2 * 2 * (64 + 8), 2 * 2 * 128, 2 * 2 * 128 * 2]


def test_fp8_kv_mla_on_an_a100_fails_at_the_triton_sm89_gate_from_0_26_0() -> None:
    facts = model_facts(load("deepseek-r1-config.json"), None)
    args = {"kv-cache-dtype": "fp8", "trust-remote-code": True}
    a100 = [{"compute_cap": "8.0"}]
    gated = check_compat(facts, a100, "0.26.0", args)
    assert rule_ids(gated) == ["fp8-kv-below-sm89"]
    assert "requires SM89+" in gated.findings[0].message
    assert "TRITON_MLA: FP8 KV cache needs compute capability 8.9" in gated.findings[0].message
    assert check_compat(facts, a100, "0.25.1", args).ok
