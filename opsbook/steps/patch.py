"""Fix a checkpoint's JSON configs on the host: read, apply a plan, verify, restore.

The plan is made by :mod:`opsbook.steps.patch_plan` (whose names are re-exported here). The
remote part reads and writes through the ``configs`` probe, one round trip per step:
:func:`read_configs`, :func:`apply_patch` (a dry run unless ``apply=True``; backup that is
never overwritten; atomic replace keeping owner and mode; verification; idempotent) and
:func:`restore_patch` (the originals back, byte for byte).
"""

from __future__ import annotations

import hashlib
import posixpath
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from opsbook.core.exceptions import OpsbookError
from opsbook.core.results import Finding, Result
from opsbook.knowledge.compat import CONFIG_FILES, Prediction, check_compat, facts_from_texts
from opsbook.remote.protocol import RemoteHost
from opsbook.steps.config_answers import ApplyAnswer, ConfigState, RestoreAnswer, WeightsOnDisk
from opsbook.steps.patch_plan import (
    ACTIONS,
    Edit,
    FilePlan,
    JsonStyle,
    Plan,
    apply_edits,
    detect_style,
    fp8_kv_cache_edits,
    plan_for_prediction,
    plan_patch,
    unified_diff,
)

__all__ = [
    "ACTIONS",
    "BACKUP_SUFFIX",
    "PATCHABLE_FILES",
    "Applied",
    "ApplyEvidence",
    "Backup",
    "Checkpoint",
    "Edit",
    "FilePlan",
    "JsonStyle",
    "Plan",
    "RestoreEvidence",
    "Restored",
    "apply_edits",
    "apply_patch",
    "detect_style",
    "fp8_kv_cache_edits",
    "patch_verdict",
    "plan_for_prediction",
    "plan_patch",
    "read_checkpoint",
    "read_config_state",
    "read_configs",
    "restore_patch",
    "unified_diff",
]

BACKUP_SUFFIX = ".opsbook-orig"
PATCHABLE_FILES = ("config.json", "hf_quant_config.json")
# Codes of the findings of applying and restoring (opsbook.core.results.Finding.code).
SYMLINKED = "config-symlinked"
CHANGED_SINCE_PLAN = "config-changed-since-plan"
NOT_WRITTEN = "config-not-written"
EARLIER_BACKUP_KEPT = "earlier-backup-kept"
NOT_AS_PLANNED = "config-not-as-planned"
OWNER_CHANGED = "config-owner-changed"
NOT_RESTORED = "config-not-restored"
NO_BACKUP = "config-no-backup"
DIFFERS_FROM_BACKUP = "config-differs-from-backup"


def read_config_state(host: RemoteHost, model_dir: str, *, weights: bool = False) -> ConfigState:
    """Texts and status (mode, uid, gid, sha256) of the config files and their backups.

    Args:
        host: the host (anything with :meth:`opsbook.remote.hosts.Host.probe`).
        model_dir: the checkpoint directory on the host.
        weights: also the ``*.safetensors`` files' count and bytes (``"weights"``).

    Returns:
        The ``configs`` probe's answer: the files' and their backups' status by name.

    Raises:
        OpsbookError: the directory does not exist on the host.
    """
    args: dict[str, Any] = {"action": "read", "dir": model_dir, "files": list(CONFIG_FILES)}
    if weights:
        args["weights"] = True
    state = ConfigState.parse(host.probe("configs", args))
    if not state.exists:
        raise OpsbookError(
            f"the model directory {model_dir} does not exist on the host",
            remedy="check model.path in the deployment file",
        )
    return state


@dataclass(frozen=True)
class Checkpoint:
    """What config patching reads of a checkpoint in one round trip.

    Attributes:
        texts: file name to text of the config files that exist.
        shards: the ``*.safetensors`` files in the directory.
        weight_bytes: their sizes added up (a first estimate of the weights' memory; the
            download check is what says whether they are complete).
    """

    texts: dict[str, str]
    shards: int
    weight_bytes: int


def read_checkpoint(host: RemoteHost, model_dir: str) -> Checkpoint:
    """The config texts and the weights' size on disk, in one round trip.

    Raises:
        OpsbookError: the directory does not exist on the host.
    """
    state = read_config_state(host, model_dir, weights=True)
    weights = state.weights or WeightsOnDisk()
    return Checkpoint(state.texts(), weights.shards, weights.bytes)


def read_configs(host: RemoteHost, model_dir: str) -> dict[str, str]:
    """The texts of ``config.json``, ``hf_quant_config.json`` and ``tokenizer_config.json``.

    One round trip. Files that do not exist are left out.

    Args:
        host: the host.
        model_dir: the checkpoint directory on the host.

    Returns:
        File name to text.
    """
    return read_config_state(host, model_dir).texts()


@dataclass(frozen=True)
class Backup:
    """The backup of one patched file.

    Attributes:
        path: ``<file>.opsbook-orig`` on the host.
        sha256: its content's hash.
        created: whether this patch made it (False: an earlier one was kept).
        second: where the file as it was before this patch was kept, when it differs from
            the earlier backup (the operator edited it since); None otherwise.
    """

    path: str
    sha256: str | None
    created: bool
    second: str | None = None


@dataclass(frozen=True)
class ApplyEvidence:
    """What :func:`apply_patch` did.

    Attributes:
        dry_run: nothing was to be written.
        already_applied: the host's files were already as planned.
        changed: the files written.
        unchanged: the planned files that were already as planned.
        backups: file name to its backup, for the files written.
        diff: the diff of the files to write.
        recheck: the prediction on the files as written (when GPUs were given).
    """

    dry_run: bool
    already_applied: bool
    changed: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    backups: dict[str, Backup] = field(default_factory=dict)
    diff: str = ""
    recheck: Prediction | None = None


@dataclass(repr=False)
class Applied(Result):
    """:func:`apply_patch`'s verdict, with what it did as evidence."""

    evidence: ApplyEvidence = field(kw_only=True)


@dataclass(frozen=True)
class RestoreEvidence:
    """What :func:`restore_patch` did: the files put back, those already the originals, and
    those without a backup (left alone)."""

    restored: list[str] = field(default_factory=list)
    already: list[str] = field(default_factory=list)
    no_backup: list[str] = field(default_factory=list)


@dataclass(repr=False)
class Restored(Result):
    """:func:`restore_patch`'s verdict, with what it did as evidence."""

    evidence: RestoreEvidence = field(kw_only=True)


def apply_patch(
    host: RemoteHost,
    model_dir: str,
    plan: Plan,
    *,
    apply: bool,
    gpus: Sequence[Any] | None = None,
    vllm_version: str | None = None,
    serve_args: Mapping[str, Any] | None = None,
    probed_backends: Mapping[str, Sequence[str]] | None = None,
) -> Applied:
    """Apply a plan on the host: a dry run unless ``apply`` is True.

    Each changed file is first backed up to ``<file>.opsbook-orig`` (an existing backup is kept:
    it holds the first original), then replaced atomically keeping its owner and mode. Then the
    files are read again and checked, and, when ``gpus`` is given, the compatibility rules are
    run again on the new files. Applying an applied plan changes nothing.

    Args:
        host: the host.
        model_dir: the checkpoint directory on the host.
        plan: from :func:`plan_patch`, made from the files as they are on the host.
        apply: False for a dry run (nothing changes on the host).
        gpus: GPU facts (``compute_cap``) to re-run :func:`opsbook.knowledge.compat.check_compat`
        with.
        vllm_version: the installed vLLM version, for that re-check.
        serve_args: the server's arguments, for that re-check.
        probed_backends: probed backend KV dtypes, for that re-check.

    Returns:
        An :class:`Applied` whose evidence (:class:`ApplyEvidence`) says what was written,
        the backups, the diff and the re-check.
    """
    if plan.nothing_planned:
        # Nothing to write: the host is not touched, and the plan says why.
        nothing = ApplyEvidence(dry_run=not apply, already_applied=True)
        return Applied(True, plan.reason or "nothing planned: nothing to change", evidence=nothing)
    state = read_config_state(host, model_dir)
    current = state.texts()
    pending, done, conflicts = _compare_with_host(plan, current)
    evidence = ApplyEvidence(
        dry_run=not apply,
        already_applied=not pending,
        unchanged=list(done),
        diff="".join(plan.files[n].diff for n in pending),
    )
    if conflicts:
        return Applied(
            False,
            "the files changed since the plan was made: nothing was written",
            findings=[_conflict_finding(name) for name in conflicts],
            evidence=evidence,
        )
    if not pending:
        return Applied(True, "already applied: nothing to change", evidence=evidence)
    if not apply:
        names = ", ".join(n + BACKUP_SUFFIX for n in pending)
        return Applied(
            True,
            f"dry run: would change {', '.join(pending)} (backups: {names}); "
            "run with apply=True to write",
            evidence=evidence,
        )
    writes = {
        n: {"expect_sha256": state.files[n].sha256, "text": plan.files[n].new} for n in pending
    }
    answer = ApplyAnswer.parse(
        host.probe("configs", {"action": "apply", "dir": model_dir, "writes": writes})
    )
    evidence = replace(evidence, changed=[n for n, a in answer.actions.items() if a.written])
    if answer.symlinks:
        return Applied(
            False,
            "a config file is a symbolic link: nothing was written",
            findings=[_symlink_finding(n, t, model_dir) for n, t in answer.symlinks.items()],
            evidence=evidence,
        )
    if answer.conflicts:
        return Applied(
            False,
            "the files changed while patching: nothing was written",
            findings=[_conflict_finding(name) for name in answer.conflicts],
            evidence=evidence,
        )
    findings, backups = _apply_findings(answer, state, plan, pending)
    recheck = _recheck(
        read_config_state(host, model_dir).texts(), gpus, vllm_version, serve_args, probed_backends
    )
    evidence = replace(evidence, backups=backups, recheck=recheck)
    if recheck is not None:
        findings += [f for f in recheck.findings if f.severity in ("error", "warning")]
    ok = answer.ok and not any(f.severity == "error" for f in findings)
    message = (
        f"patched {', '.join(evidence.changed)}; backups kept"
        if ok
        else "the patch did not fully apply: see the findings"
    )
    return Applied(ok, message, findings=findings, evidence=evidence)


def restore_patch(
    host: RemoteHost, model_dir: str, files: Sequence[str] = PATCHABLE_FILES
) -> Restored:
    """Put the originals saved by :func:`apply_patch` back, byte for byte.

    The backups stay where they are. A file without a backup is left alone.

    Args:
        host: the host.
        model_dir: the checkpoint directory on the host.
        files: the file names to restore.

    Returns:
        A :class:`Restored` whose evidence (:class:`RestoreEvidence`) lists the files
        restored, those already the originals and those without a backup.
    """
    answer = RestoreAnswer.parse(
        host.probe("configs", {"action": "restore", "dir": model_dir, "files": list(files)})
    )
    if not answer.state.exists:
        raise OpsbookError(
            f"the model directory {model_dir} does not exist on the host",
            remedy="check model.path in the deployment file",
        )
    by_status: dict[str, list[str]] = {}
    for name, action in answer.actions.items():
        by_status.setdefault(action.status, []).append(name)
    findings = []
    for name, action in answer.actions.items():
        if action.status == "failed":
            findings.append(
                Finding(
                    "error",
                    name,
                    f"could not restore: {action.error}",
                    remedy="check the folder's permissions and free space",
                    code=NOT_RESTORED,
                )
            )
        elif action.status == "no-backup":
            findings.append(Finding("info", name, "no backup: left as it is", code=NO_BACKUP))
    state = answer.state
    for name in by_status.get("restored", []) + by_status.get("already", []):
        if state.files[name].sha256 != state.backups[name].sha256:
            findings.append(
                Finding(
                    "error",
                    name,
                    "after restoring, the file still differs from its backup",
                    remedy="compare the two files by hand",
                    code=DIFFERS_FROM_BACKUP,
                )
            )
    ok = not any(f.severity == "error" for f in findings)
    restored = by_status.get("restored", [])
    message = (
        f"restored {', '.join(restored)} from backups"
        if restored
        else "nothing to restore: the files are the originals"
    )
    evidence = RestoreEvidence(
        restored=restored,
        already=by_status.get("already", []),
        no_backup=by_status.get("no-backup", []),
    )
    verdict = message if ok else "restore failed: see the findings"
    return Restored(ok, verdict, findings=findings, evidence=evidence)


def _compare_with_host(
    plan: Plan, current: Mapping[str, str]
) -> tuple[list[str], list[str], list[str]]:
    """Split the plan's changed files into to-write, already-written and changed-since."""
    pending, done, conflicts = [], [], []
    for name in plan.changed_files:
        fp = plan.files[name]
        text = current.get(name)
        if text == fp.new:
            done.append(name)
        elif text == fp.original:
            pending.append(name)
        else:
            conflicts.append(name)
    return pending, done, conflicts


def _symlink_finding(name: str, target: str, model_dir: str) -> Finding:
    """Symlinks are refused: writing through one edits a file that may be shared (a Hugging
    Face cache blob), and replacing it would silently turn the link into a regular file."""
    path = posixpath.join(model_dir, name)
    return Finding(
        "error",
        name,
        f"{path} is a symbolic link to {target}; opsbook neither writes through a link nor "
        "replaces it",
        remedy=f"replace the link by a copy of its target (cp --remove-destination "
        f'"$(readlink -f {shlex.quote(path)})" {shlex.quote(path)}), then patch again',
        code=SYMLINKED,
    )


def _conflict_finding(name: str) -> Finding:
    return Finding(
        "error",
        name,
        "the file on the host is neither the planned original nor the planned result",
        remedy="read the configs again (read_configs) and make a new plan",
        code=CHANGED_SINCE_PLAN,
    )


def _apply_findings(
    answer: ApplyAnswer,
    before: ConfigState,
    plan: Plan,
    pending: Sequence[str],
) -> tuple[list[Finding], dict[str, Backup]]:
    """Check what the apply step reports against what was planned; the findings, and the
    backups of the files written."""
    findings = []
    backups: dict[str, Backup] = {}
    after = answer.state
    for name in pending:
        action = answer.action(name)
        if not action.written:
            findings.append(
                Finding(
                    "error",
                    name,
                    f"not written: {'skipped' if action.error is None else action.error}",
                    remedy="check the folder's permissions and free space",
                    code=NOT_WRITTEN,
                )
            )
            continue
        backup = after.backups[name]
        kept = Backup(backup.path, backup.sha256, action.backup == "created")
        backups[name] = kept
        earlier = backup.sha256 != before.files[name].sha256
        if action.backup == "kept" and earlier:
            second = action.second_backup or "(not kept)"
            backups[name] = replace(kept, second=action.second_backup)
            findings.append(
                Finding(
                    "info",
                    name,
                    f"an earlier backup {backup.path} was kept (it is the first "
                    "original; it differs from the file as it was before this patch, which is "
                    f"kept as {second})",
                    code=EARLIER_BACKUP_KEPT,
                )
            )
        if after.files[name].sha256 != _sha256(plan.files[name].new):
            findings.append(
                Finding(
                    "error",
                    name,
                    "after writing, the file is not the planned text",
                    remedy="restore_patch, then plan again",
                    code=NOT_AS_PLANNED,
                )
            )
        old, new = before.files[name], after.files[name]
        if (old.mode, old.uid, old.gid) != (new.mode, new.uid, new.gid):
            findings.append(
                Finding(
                    "warning",
                    name,
                    f"mode/owner changed from {old.mode:o} {old.uid}:"
                    f"{old.gid} to {new.mode:o} {new.uid}:{new.gid}",
                    remedy="patch as the file's owner (or root) to keep its owner",
                    code=OWNER_CHANGED,
                )
            )
    return findings, backups


def _recheck(
    texts: Mapping[str, str],
    gpus: Sequence[Any] | None,
    vllm_version: str | None,
    serve_args: Mapping[str, Any] | None,
    probed_backends: Mapping[str, Sequence[str]] | None,
) -> Prediction | None:
    if gpus is None:
        return None
    return check_compat(
        facts_from_texts(texts), gpus, vllm_version, serve_args or {}, probed_backends
    )


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def patch_verdict(
    before: Result,
    applied: Applied | None,
    *,
    restored: bool = False,
    plan: Plan | None = None,
) -> Result:
    """The config-patch stage's verdict: the prediction when nothing was applied (or the
    originals were put back), with the plan's reason when it planned nothing; else the patch
    and its re-check, naming what was predicted. The verdict keeps the evidence of the
    result it is made from (the prediction's, or the patch's)."""
    if plan is not None and plan.nothing_planned and plan.reason and not restored:
        return replace(before, message=f"{before.message}; {plan.reason}")
    if applied is None or restored:
        return before
    recheck = applied.evidence.recheck
    ok = applied.ok and (recheck is None or recheck.ok)
    parts = [] if before.ok else [f"predicted: {before.message}"]
    parts.append(applied.message)
    if recheck is not None:
        parts.append(f"re-check: {recheck.message}")
    return replace(applied, ok=ok, message="; ".join(parts))
