"""02_config_patch over real SSH: plan, dry run, apply, verify, idempotence, restore.

Runs against the rehearsal host's synthetic Kimi-K2.5-NVFP4 checkpoint (writable), whose
config.json is the real one and asks for an FP8 KV cache. The test leaves the checkpoint as it
found it: the originals are restored and the backups it created are removed.
"""

from __future__ import annotations

import shlex
from typing import Any

import pytest

from opsbook.core.deployment import load_deployment
from opsbook.knowledge.compat import check_compat, facts_from_texts
from opsbook.remote.hosts import Host
from opsbook.steps.patch import (
    BACKUP_SUFFIX,
    PATCHABLE_FILES,
    apply_patch,
    fp8_kv_cache_edits,
    plan_patch,
    read_config_state,
    read_configs,
    restore_patch,
)

pytestmark = pytest.mark.integration

SM120 = [{"compute_cap": "12.0"}] * 8
VLLM = "0.15.1"
ARGS = {"tool-call-parser": "kimi_k2", "enable-auto-tool-choice": True, "trust-remote-code": True}


def shell_path(path: str) -> str:
    """``path`` quoted for bash, keeping a leading ``~/`` meaning the home folder."""
    return '"$HOME"/' + shlex.quote(path[2:]) if path.startswith("~/") else shlex.quote(path)


def test_fp8_kv_patch_round_trip_on_the_rehearsal_host(sandbox: Any) -> None:
    deployment = load_deployment(sandbox.deployment_path)
    model_dir = deployment.model_path
    with Host.from_deployment(deployment) as host:
        before = read_config_state(host, model_dir)
        present = [n for n in PATCHABLE_FILES if before.files[n].exists]
        had_backup = {n: before.backups[n].exists for n in present}
        originals = {n: host.read_bytes(f"{model_dir}/{n}") for n in present}
        try:
            files = read_configs(host, model_dir)
            assert not check_compat(facts_from_texts(files), SM120, VLLM, ARGS).ok

            plan = plan_patch(files, fp8_kv_cache_edits(files))
            assert "config.json" in plan.changed_files

            dry = apply_patch(host, model_dir, plan, apply=False)
            assert dry.ok and dry.evidence.dry_run
            assert {n: host.read_bytes(f"{model_dir}/{n}") for n in present} == originals

            done = apply_patch(
                host, model_dir, plan, apply=True, gpus=SM120, vllm_version=VLLM, serve_args=ARGS
            )
            assert done.ok, str(done)
            assert done.evidence.recheck is not None and done.evidence.recheck.ok
            after = read_config_state(host, model_dir)
            for name in plan.changed_files:
                assert after.files[name].text == plan.files[name].new
                old, new = before.files[name], after.files[name]
                assert (new.mode, new.uid, new.gid) == (old.mode, old.uid, old.gid)
                if not had_backup[name]:
                    backup = host.read_bytes(f"{model_dir}/{name}{BACKUP_SUFFIX}")
                    assert backup == originals[name]

            again = apply_patch(host, model_dir, plan, apply=True)
            assert again.ok and again.evidence.already_applied
            assert read_config_state(host, model_dir).files == after.files
            replanned = read_configs(host, model_dir)
            assert plan_patch(replanned, fp8_kv_cache_edits(replanned)).already_applied
        finally:
            restored = restore_patch(host, model_dir, present)
            for name in present:
                if not had_backup[name]:
                    backup_path = shell_path(f"{model_dir}/{name}{BACKUP_SUFFIX}")
                    host.run(f"rm -f -- {backup_path}", check=True)
        assert restored.ok, str(restored)
        assert {n: host.read_bytes(f"{model_dir}/{n}") for n in present} == originals
