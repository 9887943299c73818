"""The /metrics names per vLLM release, from the facts extracted from each release's source."""

from __future__ import annotations

import pytest

from opsbook.core.exceptions import OpsbookError
from opsbook.knowledge import metric_names, vllm_facts


@pytest.mark.parametrize("release", vllm_facts.releases())
def test_every_figure_opsbook_reads_is_exported_by_every_release(release: str) -> None:
    names = metric_names.for_release(release)
    facts = vllm_facts.load(release)
    shown = {
        name for fact in facts.exported_metrics().values() for name in (fact.name, *fact.samples)
    }
    assert names.release == release
    for role in metric_names.roles():
        assert getattr(names, role) in shown, (release, role)


def test_0_32_0_names_are_the_defaults() -> None:
    assert metric_names.for_release("0.32.0+cpu") == metric_names.MetricNames(release="0.32.0")
    assert metric_names.for_release(None) == metric_names.MetricNames()


def test_0_10_2_times_output_tokens_with_the_name_it_had() -> None:
    names = metric_names.for_release("0.10.2")
    assert names.time_per_output_token == "vllm:time_per_output_token_seconds"
    assert metric_names.for_release("0.12.0").time_per_output_token == (
        "vllm:request_time_per_output_token_seconds"
    )


def test_a_counter_is_read_by_its_total_sample_a_histogram_by_its_family() -> None:
    facts = vllm_facts.load("0.32.0").metrics
    assert facts["vllm:generation_tokens"].samples == ("vllm:generation_tokens_total",)
    assert metric_names.read_name(facts["vllm:generation_tokens"]) == (
        "vllm:generation_tokens_total"
    )
    ttft = facts["vllm:time_to_first_token_seconds"]
    assert ttft.kind == "histogram"
    assert metric_names.read_name(ttft) == "vllm:time_to_first_token_seconds"


def test_an_upgrade_from_0_10_2_loses_gpu_cache_usage_perc_for_kv_cache_usage_perc() -> None:
    lost = {m.name: m for m in metric_names.lost_in_upgrade("0.10.2", "0.32.0")}
    gpu_cache = lost["vllm:gpu_cache_usage_perc"]
    assert gpu_cache.replacement == "vllm:kv_cache_usage_perc"
    assert str(gpu_cache) == "vllm:gpu_cache_usage_perc: removed; use vllm:kv_cache_usage_perc"
    assert lost["vllm:gpu_prefix_cache_hits"].replacement == "vllm:prefix_cache_hits"
    assert "vllm:kv_cache_usage_perc" not in lost


def test_a_name_still_created_behind_show_hidden_metrics_is_lost_as_hidden() -> None:
    hidden = [
        name
        for name, fact in vllm_facts.load("0.11.2").metrics.items()
        if fact.hidden and not vllm_facts.load("0.10.2").metrics[name].hidden
    ]
    assert hidden, "0.11.2 hides names 0.10.2 showed (the facts say which)"
    lost = {m.name: m for m in metric_names.lost_in_upgrade("0.10.2", "0.11.2")}
    for name in hidden:
        assert lost[name].hidden_in_new
        assert "--show-hidden-metrics-for-version" in str(lost[name])


def test_no_upgrade_between_patch_releases_loses_a_name() -> None:
    assert metric_names.lost_in_upgrade("0.18.0", "0.18.1") == []


def test_a_release_older_than_every_fact_is_refused() -> None:
    with pytest.raises(OpsbookError, match="no vLLM facts for 0.1.0"):
        metric_names.for_release("0.1.0")
