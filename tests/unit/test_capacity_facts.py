"""The plan in the run's record: 02's prediction and 04's figures from the GLM-5.1 start's log
side by side in facts.json, with the error in %, and the next plan learning the overhead from
that record."""

from __future__ import annotations

from pathlib import Path

import pytest

from opsbook.core.channel import OUTCOME_ENV
from opsbook.core.facts_schema import FACTS_FILE, load_facts, read_notes
from opsbook.knowledge import capacity
from opsbook.runner.run_facts import write_facts
from opsbook.steps import capacity_facts, plan
from tests.unit.plan_checkpoints import GIB, GLM_ARGS, RTX_PRO_6000, glm_checkpoint, glm_log

HOST = "ubuntu@gpu-01:22"
# The flags the GLM-5.1 start logged among its non-default args that move the overhead.
GLM_SERVE_ARGS = {
    **GLM_ARGS, "load-format": "fastsafetensors", "quantization": "modelopt_fp4",
    "max-num-batched-tokens": 8192, "max-cudagraph-capture-size": 256,
}  # fmt: skip
# Weights per GPU as vLLM loaded them ("Model loading took 55.67 GiB"), as one row of the
# headers the plan reads (an expert row is split over 8 GPUs).
GLM_WEIGHTS = (("model.layers.0.mlp.experts.*.w", int(55.67 * GIB) * 8),)
VERSION = "0.20.2rc1.dev249+glmkimirebase20260514"


def deploy(folder: Path, monkeypatch: pytest.MonkeyPatch, history: list | None = None) -> Path:
    """02 then 04 of a run in ``folder``, as their stages note them, folded into facts.json."""
    folder.mkdir(parents=True)
    made = plan.plan_capacity(
        glm_checkpoint(GLM_WEIGHTS), GLM_SERVE_ARGS, RTX_PRO_6000, vllm_version=VERSION,
        history=history or [],
    )  # fmt: skip
    monkeypatch.setenv(OUTCOME_ENV, str(folder / "02_config_patch.results.jsonl"))
    capacity_facts.note_prediction(HOST, made)
    monkeypatch.setenv(OUTCOME_ENV, str(folder / "04_launch.results.jsonl"))
    capacity_facts.note_start_figures(HOST, capacity.observed_in_log(glm_log()))
    monkeypatch.delenv(OUTCOME_ENV)
    return write_facts(
        folder, deployment="/srv/glm.yml", started="2026-12-06T10:00:00+00:00", status="ok",
        hosts=[HOST], results=[],
    )  # fmt: skip


def test_04_notes_vllm_s_figures_beside_02_s_prediction_with_the_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    deploy(tmp_path / "run-1", monkeypatch)
    noted = read_notes(sorted((tmp_path / "run-1").glob("*.facts.jsonl")))[HOST]["capacity"]
    low, high = noted["predicted_tokens"]
    assert noted["verdict"] == plan.PREEMPTION and noted["overhead_source"].startswith("default")
    assert (noted["vllm"], noted["gpu_memory"], noted["utilization"]) == (
        VERSION, RTX_PRO_6000.memory, 0.865
    )  # fmt: skip
    assert noted["observed_tokens"] == 2_720_768 and noted["observed_concurrency"] == 13.42
    assert noted["observed_kv_memory"] == int(19.47 * GIB)
    middle = (low + high) / 2
    assert noted["tokens_error_pct"] == round((middle - 2_720_768) / 2_720_768 * 100, 2)
    assert noted["kv_memory_error_pct"] is not None
    # 82.69 GiB budget (0.865 x 97,887 MiB) - 55.67 GiB weights - 19.47 GiB KV.
    assert noted["overhead"] / GIB == pytest.approx(7.55, abs=0.01)


def test_the_next_plan_learns_the_overhead_from_the_deploy_s_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = tmp_path / "runs"
    facts = deploy(runs / "run-1", monkeypatch)
    assert facts.name == FACTS_FILE
    [entry] = capacity_facts.run_history(runs, "/srv/glm.yml", HOST)
    assert entry["run"] == "run-1" and entry["observed"]["tokens"] == 2_720_768
    assert capacity_facts.run_history(runs, "/srv/other.yml", HOST) == []
    assert capacity_facts.run_history(runs, "/srv/glm.yml", "other@host:22") == []
    learned = plan.plan_capacity(
        glm_checkpoint(GLM_WEIGHTS), GLM_SERVE_ARGS, RTX_PRO_6000, vllm_version=VERSION,
        history=[entry],
    )  # fmt: skip
    assert learned.overhead_source.startswith("learned: median of 1")
    assert learned.tokens[0] <= 2_720_768 <= learned.tokens[1]
    # The second deploy, planned with the first's overhead: its band's middle within 0.1%.
    second = deploy(runs / "run-2", monkeypatch, history=[entry])
    noted = load_facts(second).hosts[HOST].capacity
    assert noted.overhead_source is not None and noted.overhead_source.startswith("learned")
    assert noted.tokens_error_pct is not None and abs(noted.tokens_error_pct) < 0.1
    newest, older = capacity_facts.run_history(runs, "/srv/glm.yml", HOST)
    assert (newest["run"], older["run"]) == ("run-2", "run-1")
    # One start read both by a deploy's record and by `opsbook plan` counts once.
    assert len(plan.one_per_start([entry, {**entry, "run": None}])) == 1


def test_nothing_is_noted_outside_a_run_or_without_a_sized_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(OUTCOME_ENV, raising=False)
    capacity_facts.note_start_figures(HOST, capacity.observed_in_log(glm_log()))
    monkeypatch.setenv(OUTCOME_ENV, str(tmp_path / "04_launch.results.jsonl"))
    capacity_facts.note_start_figures(HOST, None)
    assert not list(tmp_path.iterdir())
    # Without 02's note in the run the figures are kept, with no error and no overhead.
    capacity_facts.note_start_figures(HOST, capacity.observed_in_log(glm_log()))
    noted = read_notes([tmp_path / "04_launch.facts.jsonl"])[HOST]["capacity"]
    assert noted["observed_tokens"] == 2_720_768
    assert "tokens_error_pct" not in noted and "overhead" not in noted


def test_the_error_is_the_band_s_middle_against_vllm_s_figure() -> None:
    assert capacity_facts.error_pct([90, 110], 100) == 0.0
    assert capacity_facts.error_pct([101, 101], 100) == 1.0
    assert capacity_facts.error_pct([], 100) is None
    assert capacity_facts.error_pct([1, 2], None) is None
