"""What 07_upgrade says before the stop, from the facts read from each release's source."""

from __future__ import annotations

import json
from pathlib import Path

from opsbook.core import facts_schema
from opsbook.knowledge import vllm_facts
from opsbook.steps import upgrade_predict as predicting

ARGS = {"tensor-parallel-size": 8, "trust-remote-code": True, "max-model-len": 32768}


def codes(prediction: predicting.UpgradePrediction) -> list[tuple[str, str, str]]:
    return [(f.severity, f.subject, f.code) for f in prediction.findings if f.code]


def test_a_flag_the_new_release_lacks_refuses_the_upgrade_with_its_source() -> None:
    # vllm/engine/arg_utils.py: --disable-log-requests is in 0.16.0, gone from 0.17.1.
    said = predicting.predict({**ARGS, "disable-log-requests": True}, {}, "0.15.1", "0.17.1")
    [refused] = said.refused
    assert refused.subject == "--disable-log-requests" and refused.code == predicting.FLAG_GONE
    assert "vLLM 0.17.1 has no --disable-log-requests" in refused.message
    assert refused.source.startswith("vLLM 0.17.1 ")
    assert "remove disable-log-requests from server.args" in refused.remedy


def test_a_flag_is_checked_by_its_head_and_said_gone_since_the_old_release() -> None:
    old, new = vllm_facts.load("0.15.1"), vllm_facts.load("0.17.1")
    assert predicting.flag_findings({"attention-config.backend": "TRITON_MLA"}, new, old) == []
    [finding] = predicting.flag_findings({"--disable-log-requests": True}, new, old)
    assert "(vLLM 0.15.1 had)" in finding.message


def test_a_variable_the_old_release_read_and_the_new_one_does_not_is_refused() -> None:
    # vLLM 0.15.1 vllm/config/parallel.py: VLLM_ALL2ALL_BACKEND is deprecated for
    # --all2all-backend; 0.17.1's vllm/envs.py no longer lists it.
    said = predicting.predict(ARGS, {"VLLM_ALL2ALL_BACKEND": "naive"}, "0.15.1", "0.17.1")
    [refused] = said.refused
    assert (refused.subject, refused.code) == ("VLLM_ALL2ALL_BACKEND", predicting.ENV_UNREAD)
    assert "no longer reads VLLM_ALL2ALL_BACKEND (vLLM 0.15.1 did)" in refused.message
    assert "all2all-backend" in refused.remedy
    assert refused.source == "vLLM 0.17.1 vllm/envs.py environment_variables"


def test_vllm_attention_backend_from_0_14_1_to_0_15_1_is_refused_and_its_flag_named() -> None:
    said = predicting.predict(ARGS, {"VLLM_ATTENTION_BACKEND": "TRITON_MLA"}, "0.14.1", "0.15.1")
    [refused] = said.refused
    assert "attention-backend" in refused.remedy


def test_a_variable_neither_release_reads_is_only_a_warning() -> None:
    said = predicting.predict(ARGS, {"VLLM_NO_SUCH_THING": "1", "NCCL_P2P_LEVEL": "SYS"},
                              "0.15.1", "0.18.0")  # fmt: skip
    assert said.refused == []
    assert ("warning", "VLLM_NO_SUCH_THING", predicting.ENV_UNREAD) in codes(said)


def test_metric_names_that_vanish_are_warnings_with_what_to_query_instead() -> None:
    said = predicting.predict(ARGS, {}, "0.10.2", "0.32.0")
    lost = [f for f in said.findings if f.code == predicting.METRIC_LOST]
    [gpu_cache] = [f for f in lost if f.subject == "vllm:gpu_cache_usage_perc"]
    assert gpu_cache.severity == "warning" and "vllm:kv_cache_usage_perc" in gpu_cache.remedy


def test_the_same_flags_on_the_next_release_pass() -> None:
    said = predicting.predict(ARGS, {"NCCL_P2P_LEVEL": "SYS"}, "0.15.1", "0.18.0")
    assert said.refused == [] and not [f for f in said.findings if f.code != "upgrade-metric-lost"]


def test_a_release_without_its_own_facts_is_said_and_not_judged_by_another() -> None:
    said = predicting.predict({"no-such-flag": 1}, {}, "0.15.1", "0.18.5")
    assert said.refused == []
    assert [f.code for f in said.findings][:1] == [predicting.NO_FACTS]


def test_the_patch_02_made_is_said_unneeded_only_when_the_stock_checkpoint_serves() -> None:
    [note] = predicting.patch_findings(["config.json"], True, "0.18.0")
    assert note.severity == "info" and "02_config_patch's restore" in note.remedy
    assert predicting.patch_findings(["config.json"], False, "0.18.0") == []
    assert predicting.patch_findings([], True, "0.18.0") == []


def write_run(runs: Path, name: str, deployment: str, host: str, ready_s: float | None) -> None:
    facts = facts_schema.RunFacts(
        run=name,
        deployment=deployment,
        hosts={host: {"startup": {"ready_s": ready_s}}},
    )
    (runs / name).mkdir(parents=True)
    (runs / name / facts_schema.FACTS_FILE).write_text(json.dumps(facts.model_dump()))


def test_the_planned_downtime_comes_from_the_hosts_newest_start_on_record(tmp_path) -> None:
    dep = tmp_path / "d.yml"
    dep.write_text("")
    runs = tmp_path / "runs"
    key = str(dep.resolve())
    write_run(runs, "2026-12-01T10-00-00-deploy-a", key, "h", 412.0)
    write_run(runs, "2026-12-02T10-00-00-deploy-b", key, "h", 398.5)
    write_run(runs, "2026-12-03T10-00-00-check-c", key, "h", None)
    write_run(runs, "2026-12-04T10-00-00-deploy-d", key, "other", 5.0)
    downtime = predicting.planned_downtime(runs, str(dep), "h", 10.0, 60.0)
    assert (downtime.start_s, downtime.from_run) == (398.5, "2026-12-02T10-00-00-deploy-b")
    assert downtime.total_s == 468.5
    assert "about 468 s" in downtime.line() and "no zero-downtime" in downtime.line()
    unknown = predicting.planned_downtime(None, str(dep), "h", 10.0, 60.0)
    assert unknown.total_s is None and "no record of an earlier start" in unknown.line()
