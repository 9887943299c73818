"""Unit tests of opsbook.steps.patch: the plan on real configs, and the configs probe run
locally."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from opsbook.core.exceptions import OpsbookError
from opsbook.knowledge.compat import facts_from_texts
from opsbook.remote.probes import run_local
from opsbook.remote.testing import FakeHost, LocalHost
from opsbook.steps.config_answers import ApplyAnswer
from opsbook.steps.patch import (
    BACKUP_SUFFIX,
    Backup,
    Edit,
    apply_edits,
    apply_patch,
    detect_style,
    fp8_kv_cache_edits,
    plan_patch,
    read_checkpoint,
    read_config_state,
    read_configs,
    restore_patch,
)

DATA = Path(__file__).resolve().parents[1] / "data" / "checkpoints"
SM120 = [{"compute_cap": "12.0"}] * 8
KIMI_ARGS = {
    "tool-call-parser": "kimi_k2",
    "enable-auto-tool-choice": True,
    "trust-remote-code": True,
}


def kimi_files() -> dict[str, str]:
    return {
        "config.json": (DATA / "kimi-k25-nvfp4-config.json").read_text(),
        "hf_quant_config.json": (DATA / "hf_quant_config-Kimi-K2.6-NVFP4.json").read_text(),
        "tokenizer_config.json": (DATA / "kimi-tokenizer_config.json").read_text(),
    }


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "Kimi-K2.5-NVFP4"
    folder.mkdir()
    for name, text in kimi_files().items():
        (folder / name).write_text(text)
    (folder / "config.json").chmod(0o640)
    return folder


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# --- the plan ------------------------------------------------------------------------------


def test_incident_edits_on_the_real_kimi_files() -> None:
    edits = fp8_kv_cache_edits(kimi_files())
    assert edits == [
        Edit("config.json", ("quantization_config", "kv_cache_scheme"), "delete"),
        Edit("hf_quant_config.json", ("quantization", "kv_cache_quant_algo"), "set", None),
    ]


def test_plan_keeps_indent_key_order_and_missing_final_newline() -> None:
    files = kimi_files()
    plan = plan_patch(files, fp8_kv_cache_edits(files))
    assert plan.changed_files == ["config.json", "hf_quant_config.json"]
    new_config = plan.files["config.json"].new
    assert not new_config.endswith("\n")
    assert new_config.startswith('{\n    "architectures": [\n')
    old_keys = list(json.loads(files["config.json"])["quantization_config"])
    new_keys = list(json.loads(new_config)["quantization_config"])
    assert new_keys == [k for k in old_keys if k != "kv_cache_scheme"]
    removed = [
        line
        for line in plan.files["config.json"].diff.splitlines()
        if line.startswith("-") and not line.startswith("---")
    ]
    added = [
        line
        for line in plan.files["config.json"].diff.splitlines()
        if line.startswith("+") and not line.startswith("+++")
    ]
    assert removed == [
        '-        "kv_cache_scheme": {',
        '-            "dynamic": false,',
        '-            "num_bits": 8,',
        '-            "type": "float"',
        "-        },",
    ]
    assert added == []
    hf_diff = plan.files["hf_quant_config.json"].diff
    assert '-        "kv_cache_quant_algo": "FP8",' in hf_diff
    assert '+        "kv_cache_quant_algo": null,' in hf_diff
    assert not any(fp.reformatted for fp in plan.files.values())


def test_plan_on_the_patched_files_is_already_applied() -> None:
    files = kimi_files()
    plan = plan_patch(files, fp8_kv_cache_edits(files))
    patched = {name: fp.new for name, fp in plan.files.items()}
    again = plan_patch(patched, fp8_kv_cache_edits(patched))
    assert again.already_applied
    assert again.diff == ""
    assert facts_from_texts(patched).kv_cache_dtype == "auto"


def test_same_edits_twice_change_nothing_more() -> None:
    files = kimi_files()
    edits = fp8_kv_cache_edits(files)
    plan = plan_patch(files, edits)
    second = plan_patch({n: fp.new for n, fp in plan.files.items()}, edits)
    assert second.already_applied


def test_two_space_file_keeps_two_spaces() -> None:
    text = (DATA / "kimi-k25-config.json").read_text()
    edit = Edit("config.json", ("text_config", "quantization_config", "kv_cache_scheme"), "delete")
    plan = plan_patch({"config.json": text}, [edit])
    new = plan.files["config.json"].new
    assert "kv_cache_scheme" not in new
    assert new.startswith('{\n  "architectures": [\n')
    assert len(plan.files["config.json"].diff.splitlines()) < 12


def test_text_config_kv_scheme_is_patched_too() -> None:
    config = json.loads((DATA / "kimi-k26-nvfp4-config.json").read_text())
    config["text_config"]["quantization_config"] = {
        "quant_method": "modelopt",
        "kv_cache_quant_algo": "FP8",
    }
    edits = fp8_kv_cache_edits({"config.json": json.dumps(config, indent=4)})
    assert (
        Edit("config.json", ("text_config", "quantization_config", "kv_cache_quant_algo"), "delete")
        in edits
    )


def test_no_kv_quantization_means_no_edits() -> None:
    files = {"config.json": (DATA / "deepseek-r1-config.json").read_text()}
    assert fp8_kv_cache_edits(files) == []
    assert plan_patch(files, []).already_applied


@pytest.mark.parametrize(
    "text",
    [
        '{"a": 1, "b": {"c": "FP8", "d": [1, 2]}}',
        '{"a":1,"b":{"c":"FP8","d":[1,2]}}\n',
        '{\n\t"a": 1,\n\t"b": {\n\t\t"c": "FP8"\n\t}\n}\n',
        '{\r\n  "a": 1,\r\n  "b": {\r\n    "c": "FP8"\r\n  }\r\n}\r\n',
        '{\n    "name": "Kimi \u00e9t\u00e9",\n    "b": {\n        "c": "FP8"\n    }\n}',
        '{\n    "name": "Kimi \\u00e9t\\u00e9",\n    "b": {\n        "c": "FP8"\n    }\n}',
    ],
)
def test_style_is_detected_and_reproduced(text: str) -> None:
    style, exact = detect_style(text)
    assert exact
    plan = plan_patch({"f.json": text}, [Edit("f.json", ("b", "c"), "set", None)])
    new = plan.files["f.json"].new
    assert new == text.replace('"FP8"', "null")


def test_diff_marks_a_missing_final_newline() -> None:
    plan = plan_patch({"f.json": '{"a": "FP8"}'}, [Edit("f.json", ("a",), "set", None)])
    assert plan.files["f.json"].diff.endswith("\\ No newline at end of file\n")


def test_set_under_a_missing_parent_is_refused() -> None:
    with pytest.raises(OpsbookError, match="is not a JSON object"):
        apply_edits({"a": 1}, [Edit("f.json", ("b", "c"), "set", None)])


def test_edits_for_unread_files_are_refused() -> None:
    with pytest.raises(OpsbookError, match="were not read"):
        plan_patch({}, [Edit("config.json", ("a",), "delete")])


def test_edit_action_is_checked() -> None:
    with pytest.raises(ValueError, match="action"):
        Edit("config.json", ("a",), "rename")


# --- the remote part, through the probe run locally ----------------------------------------


def test_read_configs_in_one_probe(model_dir: Path) -> None:
    assert read_configs(LocalHost(), str(model_dir)) == kimi_files()
    state = read_config_state(LocalHost(), str(model_dir))
    assert state.files["config.json"].mode == 0o640
    assert state.files["config.json"].sha256 == sha(model_dir / "config.json")
    assert not state.backups["config.json"].exists


def test_read_checkpoint_adds_up_the_weights_on_disk_in_the_same_probe(model_dir: Path) -> None:
    (model_dir / "model-00001-of-00003.safetensors").write_bytes(b"x" * 1000)
    blob = model_dir.parent / "blob"
    blob.write_bytes(b"y" * 234)
    (model_dir / "model-00002-of-00003.safetensors").symlink_to(blob)  # as in an HF cache
    (model_dir / "model-00003-of-00003.safetensors").symlink_to(model_dir / "gone")
    (model_dir / "notes.txt").write_bytes(b"z" * 5000)
    checkpoint = read_checkpoint(LocalHost(), str(model_dir))
    assert (checkpoint.shards, checkpoint.weight_bytes) == (2, 1234)
    assert checkpoint.texts == kimi_files()


def test_read_configs_of_a_missing_folder(tmp_path: Path) -> None:
    with pytest.raises(OpsbookError, match="does not exist"):
        read_configs(LocalHost(), str(tmp_path / "nope"))


def test_dry_run_changes_nothing(model_dir: Path) -> None:
    host = LocalHost()
    before = {p.name: p.read_bytes() for p in model_dir.iterdir()}
    files = read_configs(host, str(model_dir))
    result = apply_patch(
        host, str(model_dir), plan_patch(files, fp8_kv_cache_edits(files)), apply=False
    )
    assert result.ok and result.evidence.dry_run
    assert result.message.startswith("dry run: would change config.json, hf_quant_config.json")
    assert {p.name: p.read_bytes() for p in model_dir.iterdir()} == before


def test_apply_backs_up_writes_verifies_and_is_idempotent(model_dir: Path) -> None:
    host = LocalHost()
    originals = {name: (model_dir / name).read_bytes() for name in kimi_files()}
    files = read_configs(host, str(model_dir))
    plan = plan_patch(files, fp8_kv_cache_edits(files))

    result = apply_patch(
        host,
        str(model_dir),
        plan,
        apply=True,
        gpus=SM120,
        vllm_version="0.15.1",
        serve_args=KIMI_ARGS,
    )
    assert result.ok, str(result)
    assert result.evidence.changed == ["config.json", "hf_quant_config.json"]
    assert result.evidence.recheck is not None and result.evidence.recheck.ok
    for name in ("config.json", "hf_quant_config.json"):
        assert (model_dir / name).read_text() == plan.files[name].new
        backup = model_dir / (name + BACKUP_SUFFIX)
        assert backup.read_bytes() == originals[name]
        assert result.evidence.backups[name] == Backup(
            path=str(backup),
            sha256=hashlib.sha256(originals[name]).hexdigest(),
            created=True,
        )
    assert (model_dir / "config.json").stat().st_mode & 0o7777 == 0o640
    assert (model_dir / "config.json.opsbook-orig").stat().st_mode & 0o7777 == 0o640
    assert not [p for p in model_dir.iterdir() if "opsbook-tmp" in p.name]

    again = apply_patch(host, str(model_dir), plan, apply=True)
    assert again.ok and again.evidence.already_applied and again.evidence.changed == []
    replanned = plan_patch(read_configs(host, str(model_dir)), fp8_kv_cache_edits(files))
    assert replanned.already_applied


def test_restore_puts_the_originals_back_byte_for_byte(model_dir: Path) -> None:
    host = LocalHost()
    originals = {name: (model_dir / name).read_bytes() for name in kimi_files()}
    files = read_configs(host, str(model_dir))
    apply_patch(host, str(model_dir), plan_patch(files, fp8_kv_cache_edits(files)), apply=True)

    result = restore_patch(host, str(model_dir))
    assert result.ok, str(result)
    assert result.evidence.restored == ["config.json", "hf_quant_config.json"]
    assert {n: (model_dir / n).read_bytes() for n in originals} == originals
    assert (model_dir / "config.json").stat().st_mode & 0o7777 == 0o640
    assert (model_dir / ("config.json" + BACKUP_SUFFIX)).exists()

    again = restore_patch(host, str(model_dir))
    assert again.ok and again.evidence.restored == []
    assert again.evidence.already == ["config.json", "hf_quant_config.json"]


def test_restore_without_backup_leaves_files_alone(model_dir: Path) -> None:
    result = restore_patch(LocalHost(), str(model_dir))
    assert result.ok
    assert result.evidence.no_backup == ["config.json", "hf_quant_config.json"]


def test_the_first_backup_is_never_overwritten(model_dir: Path) -> None:
    host = LocalHost()
    first = (model_dir / "config.json").read_bytes()
    files = read_configs(host, str(model_dir))
    apply_patch(host, str(model_dir), plan_patch(files, fp8_kv_cache_edits(files)), apply=True)
    restore_patch(host, str(model_dir))
    # Someone edits the file by hand; a new patch must keep the first original as the backup.
    edited = json.loads((model_dir / "config.json").read_text())
    edited["max_position_embeddings"] = 131072
    (model_dir / "config.json").write_text(json.dumps(edited, indent=4))
    files = read_configs(host, str(model_dir))
    result = apply_patch(
        host, str(model_dir), plan_patch(files, fp8_kv_cache_edits(files)), apply=True
    )
    assert result.ok, str(result)
    assert result.evidence.backups["config.json"].created is False
    assert (model_dir / ("config.json" + BACKUP_SUFFIX)).read_bytes() == first
    assert any("earlier backup" in f.message for f in result.findings)


def test_a_file_changed_since_the_plan_is_not_written(model_dir: Path) -> None:
    host = LocalHost()
    files = read_configs(host, str(model_dir))
    plan = plan_patch(files, fp8_kv_cache_edits(files))
    (model_dir / "config.json").write_text(files["config.json"] + "\n")
    before = {p.name: p.read_bytes() for p in model_dir.iterdir()}
    result = apply_patch(host, str(model_dir), plan, apply=True)
    assert not result.ok
    assert [f.subject for f in result.findings] == ["config.json"]
    assert {p.name: p.read_bytes() for p in model_dir.iterdir()} == before


def test_probe_refuses_to_write_over_a_concurrent_change(model_dir: Path) -> None:
    writes = {"config.json": {"expect_sha256": "0" * 64, "text": "{}"}}
    answer = ApplyAnswer.parse(
        run_local("configs", {"action": "apply", "dir": str(model_dir), "writes": writes})
    )
    assert answer.ok is False and answer.conflicts == ["config.json"]
    assert (model_dir / "config.json").read_text() == kimi_files()["config.json"]


@pytest.mark.skipif(os.geteuid() != 0, reason="changing a file's owner needs root")
def test_owner_is_kept_when_root(model_dir: Path) -> None:
    shutil.chown(model_dir / "config.json", user=65534, group=65534)
    host = LocalHost()
    files = read_configs(host, str(model_dir))
    result = apply_patch(
        host, str(model_dir), plan_patch(files, fp8_kv_cache_edits(files)), apply=True
    )
    assert result.ok, str(result)
    st = (model_dir / "config.json").stat()
    assert (st.st_uid, st.st_gid) == (65534, 65534)
    restore_patch(host, str(model_dir))
    st = (model_dir / "config.json").stat()
    assert (st.st_uid, st.st_gid) == (65534, 65534)


def test_patch_verdict_names_the_prediction_and_the_recheck() -> None:
    from opsbook.core.results import Result
    from opsbook.knowledge.compat import Prediction, PredictionEvidence
    from opsbook.steps.patch import Applied, ApplyEvidence, patch_verdict

    def applied_with(message: str, recheck: Prediction) -> Applied:
        done = ApplyEvidence(dry_run=False, already_applied=False, recheck=recheck)
        return Applied(True, message, evidence=done)

    evidence = PredictionEvidence(kv_cache_dtype="auto", kv_origin="")
    before = Result(False, "1 problem(s) will stop vLLM: FP8 KV cache with MLA")
    recheck = Prediction(True, "no known incompatibility", evidence=evidence)
    applied = applied_with("patched config.json; backups kept", recheck)
    verdict = patch_verdict(before, applied)
    assert verdict.ok
    assert verdict.message == (
        "predicted: 1 problem(s) will stop vLLM: FP8 KV cache with MLA; "
        "patched config.json; backups kept; re-check: no known incompatibility"
    )
    assert patch_verdict(before, None) is before
    assert patch_verdict(before, applied, restored=True) is before
    failed = applied_with("patched", Prediction(False, "still broken", evidence=evidence))
    assert not patch_verdict(before, failed).ok


# --- the plan follows the prediction ---------------------------------------------------------

SM100 = [{"compute_cap": "10.0", "memory_total_mib": 183359}] * 8
SM120_MEM = [{"compute_cap": "12.0", "memory_total_mib": 97887}] * 8
WEIGHTS = 540 * 10**9
FP8_SUBJECT = "FP8 KV cache with MLA on compute capability 12.x"
FP8_CODE = "fp8-kv-mla-triton"


def predicted_plan(
    gpus: list[dict[str, Any]], version: str | None, args: dict[str, Any] | None = None
) -> tuple[Any, Any, int]:
    from opsbook.knowledge.compat import check_compat, kv_budget_bytes
    from opsbook.steps.patch import plan_for_prediction

    files = kimi_files()
    serve_args = args if args is not None else KIMI_ARGS
    before = check_compat(facts_from_texts(files), gpus, version, serve_args)
    budget = kv_budget_bytes(gpus, WEIGHTS, 0.9)
    plan = plan_for_prediction(files, before, gpus, version, serve_args, kv_budget_bytes=budget)
    return before, plan, budget


def tokens(budget: int, dtype: str) -> str:
    from opsbook.knowledge.compat import tokens_that_fit

    return f"{tokens_that_fit(budget, facts_from_texts(kimi_files()), dtype):,}"


def test_incident_release_on_sm120_plans_the_patch_for_the_predicted_failure() -> None:
    before, plan, budget = predicted_plan(SM120_MEM, "0.15.1")
    assert not before.ok
    assert plan.avoids == (FP8_CODE,)
    assert f"predicted: {FP8_SUBJECT}." in plan.reason
    assert plan.changed_files == ["config.json", "hf_quant_config.json"]
    assert plan.edits == tuple(fp8_kv_cache_edits(kimi_files()))
    assert f"{tokens(budget, 'bfloat16')} tokens per GPU instead of" in plan.reason
    assert tokens(budget, "fp8_e4m3") in plan.reason


def test_release_with_fp8_triton_mla_on_sm120_keeps_the_fp8_kv_cache() -> None:
    before, plan, budget = predicted_plan(SM120_MEM, "0.33.0")
    assert before.ok
    assert plan.nothing_planned and not plan.files and not plan.avoids
    assert "TRITON_MLA on compute capability 12.0" in plan.reason
    assert f"{tokens(budget, 'fp8_e4m3')} tokens per GPU" in plan.reason
    assert f"({tokens(budget, 'bfloat16')} with bfloat16)" in plan.reason
    assert plan.reason.startswith("nothing to change: no failure is predicted")


def test_b200_keeps_the_fp8_kv_cache_on_the_incident_release() -> None:
    before, plan, _ = predicted_plan(SM100, "0.15.1")
    assert before.ok
    assert plan.nothing_planned
    assert "FLASHINFER_MLA on compute capability 10.0" in plan.reason


def test_unknown_version_plans_nothing_and_asks_for_the_version() -> None:
    before, plan, _ = predicted_plan(SM120_MEM, None)
    assert before.ok and any(f.severity == "warning" for f in before.findings)
    assert plan.nothing_planned
    assert "vLLM of unknown version" in plan.reason
    assert FP8_SUBJECT in plan.reason and "vllm_version" in plan.reason


def test_a_failure_the_patch_cannot_avoid_plans_nothing() -> None:
    args = {**KIMI_ARGS, "tool-call-parser": None}
    before, plan, _ = predicted_plan(SM120_MEM, "0.33.0", args)
    assert not before.ok
    assert plan.nothing_planned
    assert "would not avoid" in plan.reason
    assert "--enable-auto-tool-choice without --tool-call-parser" in plan.reason


def test_only_the_failures_the_patch_avoids_are_named() -> None:
    args = {**KIMI_ARGS, "tool-call-parser": None}
    before, plan, _ = predicted_plan(SM120_MEM, "0.15.1", args)
    assert len([f for f in before.findings if f.severity == "error"]) == 2
    assert plan.avoids == (FP8_CODE,)
    assert plan.reason.startswith(f"predicted: {FP8_SUBJECT}. Removing")


def test_a_checkpoint_without_kv_quantization_plans_nothing() -> None:
    from opsbook.knowledge.compat import check_compat
    from opsbook.steps.patch import plan_for_prediction

    files = {"config.json": (DATA / "kimi-k2-instruct-config.json").read_text()}
    before = check_compat(facts_from_texts(files), SM120_MEM, "0.15.1", KIMI_ARGS)
    plan = plan_for_prediction(files, before, SM120_MEM, "0.15.1", KIMI_ARGS)
    assert plan.nothing_planned
    assert "asks for no quantized KV cache" in plan.reason


def test_kv_keys_vllm_does_not_apply_are_left_alone() -> None:
    from opsbook.knowledge.compat import check_compat
    from opsbook.steps.patch import plan_for_prediction

    # Kimi-K2.5's INT4 config declares a KV scheme that vLLM resolves only for ModelOpt.
    files = {"config.json": (DATA / "kimi-k25-config.json").read_text()}
    assert fp8_kv_cache_edits(files)
    before = check_compat(facts_from_texts(files), SM120_MEM, "0.15.1", KIMI_ARGS)
    plan = plan_for_prediction(files, before, SM120_MEM, "0.15.1", KIMI_ARGS)
    assert plan.nothing_planned
    assert "which vLLM does not apply here (KV cache auto)" in plan.reason


def test_applying_an_empty_plan_touches_nothing_and_says_why() -> None:
    _, plan, _ = predicted_plan(SM120_MEM, "0.33.0")
    untouchable = FakeHost()  # nothing scripted: any question to it fails the test
    result = apply_patch(untouchable, "/nowhere", plan, apply=True)
    assert untouchable.calls == []
    assert result.ok
    assert result.message == plan.reason
    assert result.evidence.already_applied and result.evidence.changed == []


def test_verdict_carries_the_reason_nothing_was_planned() -> None:
    from opsbook.steps.patch import patch_verdict

    before, plan, _ = predicted_plan(SM120_MEM, "0.33.0")
    verdict = patch_verdict(before, None, plan=plan)
    assert verdict.ok
    assert verdict.message == f"{before.message}; {plan.reason}"
    assert patch_verdict(before, None, restored=True, plan=plan) is before


def test_apply_then_restore_keeps_the_operators_current_config(model_dir: Path) -> None:
    host = LocalHost()
    files = read_configs(host, str(model_dir))
    apply_patch(host, str(model_dir), plan_patch(files, fp8_kv_cache_edits(files)), apply=True)
    restore_patch(host, str(model_dir))
    # The operator tunes the config after the first round; an older backup is on the host.
    edited = json.loads((model_dir / "config.json").read_text())
    edited["max_position_embeddings"] = 65536
    (model_dir / "config.json").write_text(json.dumps(edited, indent=4))
    current = (model_dir / "config.json").read_bytes()
    files = read_configs(host, str(model_dir))
    result = apply_patch(
        host, str(model_dir), plan_patch(files, fp8_kv_cache_edits(files)), apply=True
    )
    assert result.ok, str(result)
    second = result.evidence.backups["config.json"].second
    assert second is not None
    digest = hashlib.sha256(current).hexdigest()[:12]
    assert second == f"{model_dir}/config.json{BACKUP_SUFFIX}.{digest}"
    restore_patch(host, str(model_dir))
    # Restore puts the first original back, and the operator's version is still on disk.
    assert Path(second).read_bytes() == current
    assert any(second in f.message for f in result.findings)


def test_a_symlinked_config_is_refused_and_stays_a_link(model_dir: Path) -> None:
    host = LocalHost()
    blob = model_dir.parent / "blob-config.json"
    (model_dir / "config.json").rename(blob)
    (model_dir / "config.json").symlink_to(blob)
    before = blob.read_bytes()
    files = read_configs(host, str(model_dir))
    result = apply_patch(
        host, str(model_dir), plan_patch(files, fp8_kv_cache_edits(files)), apply=True
    )
    assert not result.ok
    assert "symbolic link" in result.message
    assert [f.subject for f in result.findings] == ["config.json"]
    assert "readlink -f" in (result.findings[0].remedy or "")
    assert (model_dir / "config.json").is_symlink()
    assert blob.read_bytes() == before
    assert not list(model_dir.glob("*.opsbook-*"))


def test_a_failed_write_removes_its_temporary_file(tmp_path: Path) -> None:
    from opsbook.remote.probes import configs

    target = tmp_path / "config.json"
    # A str where bytes are expected fails inside the write, after the file was created.
    with pytest.raises(TypeError):
        configs.write_synced(str(target), "not bytes", {})  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []
