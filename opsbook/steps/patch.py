"""Fix a checkpoint's JSON configs on the host: plan, diff, backup, apply, verify, restore.

The pure part, :func:`plan_patch`, turns edits into new file texts that keep the file's
indentation, key order, trailing newline and escaping, with a unified diff per file. The
remote part reads and writes through the ``configs`` probe, one round trip per step:
:func:`read_configs`, :func:`apply_patch` (a dry run unless ``apply=True``; backup that is never
overwritten; atomic replace keeping owner and mode; verification; idempotent) and
:func:`restore_patch` (the originals back, byte for byte).

:func:`fp8_kv_cache_edits` is the incident's patch: drop the checkpoint's FP8 KV-cache request.
:func:`plan_for_prediction` plans it only when the prediction of
:func:`opsbook.knowledge.compat.check_compat` has a failure that the patch avoids: an FP8 KV cache
that
vLLM can serve is kept, since a 16-bit one holds half the tokens.
"""

from __future__ import annotations

import copy
import difflib
import hashlib
import itertools
import json
import posixpath
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from opsbook.core.exceptions import OpsbookError
from opsbook.core.results import Finding, Result, Table
from opsbook.knowledge.compat import (
    CONFIG_FILES,
    ModelFacts,
    Prediction,
    check_compat,
    facts_from_texts,
    parse_json,
    tokens_that_fit,
)
from opsbook.remote.probes import Prober

BACKUP_SUFFIX = ".opsbook-orig"
PATCHABLE_FILES = ("config.json", "hf_quant_config.json")
ACTIONS = ("delete", "set")
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


@dataclass(frozen=True)
class Edit:
    """One change to one JSON file.

    Args:
        file: the file name in the model directory (``config.json``).
        json_path: the keys from the top, e.g. ``("quantization_config", "kv_cache_scheme")``.
        action: ``delete`` (no change if absent) or ``set``.
        value: the value to set (``None`` writes JSON ``null``).
    """

    file: str
    json_path: tuple[str, ...]
    action: str
    value: Any = None

    def __post_init__(self) -> None:
        if self.action not in ACTIONS:
            raise ValueError(f"action must be one of {ACTIONS}, not {self.action!r}")
        if not self.json_path:
            raise ValueError("json_path must name at least one key")

    def describe(self) -> str:
        path = ".".join(self.json_path)
        if self.action == "delete":
            return f"delete {path}"
        return f"set {path} = {json.dumps(self.value)}"


@dataclass(frozen=True)
class JsonStyle:
    """How a JSON file is written, so that a rewrite changes only the edited lines."""

    indent: int | str | None
    separators: tuple[str, str]
    ensure_ascii: bool
    newline: str
    trailing: str

    def dumps(self, obj: Any) -> str:
        text = json.dumps(
            obj, indent=self.indent, separators=self.separators, ensure_ascii=self.ensure_ascii
        )
        if self.newline != "\n":
            text = text.replace("\n", self.newline)
        return text + self.trailing


@dataclass(frozen=True)
class FilePlan:
    """The planned change of one file.

    Attributes:
        file: the file name.
        original: its text now.
        new: its text after the edits.
        diff: a unified diff from ``original`` to ``new`` (empty when unchanged).
        edits: the edits that change something.
        reformatted: True when the file's formatting could not be reproduced exactly, so lines
            other than the edited ones change too.
    """

    file: str
    original: str
    new: str
    diff: str
    edits: tuple[Edit, ...] = ()
    reformatted: bool = False

    @property
    def changed(self) -> bool:
        return self.new != self.original


@dataclass(frozen=True)
class Plan:
    """New texts for a set of files, with their diffs.

    Attributes:
        files: file name to its planned change.
        edits: the edits asked for.
        reason: why these edits, or why none (set by :func:`plan_for_prediction`).
        avoids: the codes of the predicted problems (the rules' ids) the edits avoid.
    """

    files: dict[str, FilePlan] = field(default_factory=dict)
    edits: tuple[Edit, ...] = ()
    reason: str = ""
    avoids: tuple[str, ...] = ()

    @property
    def nothing_planned(self) -> bool:
        """True when no edit was planned at all (as opposed to edits already applied)."""
        return not self.edits

    @property
    def already_applied(self) -> bool:
        """True when the edits change nothing: the files are already as wanted."""
        return not self.changed_files

    @property
    def changed_files(self) -> list[str]:
        return [name for name, fp in self.files.items() if fp.changed]

    @property
    def diff(self) -> str:
        return "".join(fp.diff for fp in self.files.values())

    def table(self) -> Table:
        """One row per file: the changes and whether there is anything left to do."""
        rows = []
        for name, fp in self.files.items():
            status = "to change" if fp.changed else "already as wanted"
            rows.append([name, "; ".join(e.describe() for e in fp.edits) or "—", status])
        return Table(["file", "changes", "status"], rows)


# --------------------------------------------------------------------------------------------
# The pure part


def detect_style(text: str) -> tuple[JsonStyle, bool]:
    """The JSON style of ``text``, and whether re-serialising reproduces it exactly.

    Args:
        text: the file's text.

    Returns:
        ``(style, exact)``.

    Raises:
        OpsbookError: the text is not JSON.
    """
    obj = parse_json("(file)", text)
    newline = "\r\n" if "\r\n" in text else "\n"
    body = text.rstrip()
    trailing = text[len(body) :]
    candidates = _style_candidates(body.replace("\r\n", "\n"))
    for indent, separators, ensure_ascii in candidates:
        style = JsonStyle(indent, separators, ensure_ascii, newline, trailing)
        if style.dumps(obj) == text:
            return style, True
    indent, separators, ensure_ascii = candidates[0]
    return JsonStyle(indent, separators, ensure_ascii, newline, trailing), False


def _style_candidates(body: str) -> list[tuple[int | str | None, tuple[str, str], bool]]:
    """Likely (indent, separators, ensure_ascii) for a JSON text, the most likely first."""
    ascii_first = body.isascii()
    if "\n" in body.strip():
        second = body.split("\n")[1]
        lead = second[: len(second) - len(second.lstrip())]
        indent: int | str | None = lead if lead.startswith("\t") else len(lead)
        seps = [(",", ": "), (",", ":")]
        indents = [indent]
    else:
        seps = [(", ", ": "), (",", ":"), (",", ": "), (", ", ":")]
        indents = [None]
    return list(itertools.product(indents, seps, (ascii_first, not ascii_first)))


def apply_edits(obj: Any, edits: Sequence[Edit]) -> tuple[Any, list[Edit]]:
    """Apply edits to a parsed JSON document (a copy), keeping the order of existing keys.

    Args:
        obj: the parsed document.
        edits: the edits for this document.

    Returns:
        ``(new document, the edits that changed something)``.

    Raises:
        OpsbookError: a ``set`` whose parent is missing or not an object.
    """
    doc = copy.deepcopy(obj)
    effective = []
    for edit in edits:
        parent = _walk(doc, edit.json_path[:-1])
        key = edit.json_path[-1]
        if edit.action == "delete":
            if isinstance(parent, dict) and key in parent:
                del parent[key]
                effective.append(edit)
            continue
        if not isinstance(parent, dict):
            raise OpsbookError(
                f"{edit.file}: cannot {edit.describe()}: "
                f"{'.'.join(edit.json_path[:-1]) or 'the top level'} is not a JSON object",
                remedy="check the file's structure; only edit keys whose parent exists",
            )
        if key not in parent or parent[key] != edit.value:
            parent[key] = edit.value
            effective.append(edit)
    return doc, effective


def plan_patch(files: Mapping[str, str], edits: Sequence[Edit]) -> Plan:
    """Plan the new texts of JSON files, keeping each file's formatting.

    Args:
        files: file name to its current text.
        edits: the edits to make.

    Returns:
        The :class:`Plan`, with ``already_applied`` True when nothing would change.

    Raises:
        OpsbookError: an edit names a file that is not given, or a file is not JSON.
    """
    missing = sorted({e.file for e in edits} - set(files))
    if missing:
        raise OpsbookError(
            f"edits name files that were not read: {missing}",
            remedy="read the configs first (read_configs) and plan on what exists",
        )
    plans = {}
    for name in dict.fromkeys(e.file for e in edits):
        original = files[name]
        style, exact = detect_style(original)
        doc, effective = apply_edits(
            parse_json(name, original), [e for e in edits if e.file == name]
        )
        new = style.dumps(doc) if effective else original
        plans[name] = FilePlan(
            name,
            original,
            new,
            unified_diff(name, original, new),
            tuple(effective),
            reformatted=bool(effective) and not exact,
        )
    return Plan(plans, tuple(edits))


def unified_diff(name: str, old: str, new: str) -> str:
    """A ``git diff``-style unified diff, marking a missing newline at the end of file."""
    lines = difflib.unified_diff(
        old.splitlines(keepends=True),
        new.splitlines(keepends=True),
        fromfile=f"a/{name}",
        tofile=f"b/{name}",
    )
    out = []
    for line in lines:
        out.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(out)


def fp8_kv_cache_edits(files: Mapping[str, str | None]) -> list[Edit]:
    """The incident's patch: stop the checkpoint from asking for an FP8 KV cache.

    In ``config.json``, delete ``kv_cache_scheme`` and ``kv_cache_quant_algo`` from
    ``quantization_config`` and from ``text_config.quantization_config``. In
    ``hf_quant_config.json``, set ``quantization.kv_cache_quant_algo`` (and a top-level
    ``kv_cache_quant_algo``) to null, as NVIDIA's checkpoints without KV quantization have it.

    Args:
        files: file name to text (None or absent when the file does not exist).

    Returns:
        The edits; empty when the files ask for no KV-cache quantization.
    """
    edits: list[Edit] = []
    config_text = files.get("config.json")
    config = parse_json("config.json", config_text) if config_text else {}
    for prefix in (("quantization_config",), ("text_config", "quantization_config")):
        qc = _walk(config, prefix)
        if isinstance(qc, dict):
            edits += [
                Edit("config.json", (*prefix, key), "delete")
                for key in ("kv_cache_scheme", "kv_cache_quant_algo")
                if key in qc
            ]
    text = files.get("hf_quant_config.json")
    hf_quant = parse_json("hf_quant_config.json", text) if text else {}
    for path in (("quantization", "kv_cache_quant_algo"), ("kv_cache_quant_algo",)):
        parent = _walk(hf_quant, path[:-1])
        if isinstance(parent, dict) and path[-1] in parent:
            edits.append(Edit("hf_quant_config.json", path, "set", None))
    return edits


def plan_for_prediction(
    files: Mapping[str, str],
    prediction: Prediction,
    gpus: Sequence[Any],
    vllm_version: str | None,
    serve_args: Mapping[str, Any],
    probed_backends: Mapping[str, Sequence[str]] | None = None,
    *,
    kv_budget_bytes: int | None = None,
) -> Plan:
    """The incident's patch, planned only when it avoids a failure the prediction names.

    The prediction is run again on the files as the patch would leave them: the patch is
    planned when an error of ``prediction`` is gone there. Otherwise nothing is planned and
    the reason says why, with the tokens the checkpoint's KV cache keeps.

    Args:
        files: file name to text, as :func:`read_configs` gives them.
        prediction: :func:`opsbook.knowledge.compat.check_compat` on these files, GPUs, version,
        args.
        gpus: the GPU facts the prediction was made for.
        vllm_version: the vLLM version it was made for (None when unknown).
        serve_args: the server's arguments.
        probed_backends: backend KV dtypes read from the installed vLLM, if any.
        kv_budget_bytes: one GPU's KV-cache memory
        (:func:`opsbook.knowledge.compat.kv_budget_bytes`),
            to say how many tokens fit; None leaves the token count out.

    Returns:
        The :class:`Plan`: the patch with ``avoids`` naming the failures it avoids, or no
        edits with ``reason`` saying why.
    """
    edits = fp8_kv_cache_edits(files)
    if not edits:
        return Plan(reason="the checkpoint asks for no quantized KV cache: nothing to change")
    candidate = plan_patch(files, edits)
    patched = {**files, **{name: fp.new for name, fp in candidate.files.items()}}
    after = check_compat(facts_from_texts(patched), gpus, vllm_version, serve_args, probed_backends)
    remaining = {f.code for f in after.findings if f.severity == "error"}
    avoided = [f for f in prediction.findings if f.severity == "error" and f.code not in remaining]
    facts = facts_from_texts(files)
    kv_dtype = prediction.evidence.kv_cache_dtype
    sizes = _token_counts(facts, kv_dtype, kv_budget_bytes)
    if avoided:
        cost = f": {sizes[1]:,} tokens per GPU instead of {sizes[0]:,}" if sizes else ""
        reason = (
            f"predicted: {'; '.join(f.subject for f in avoided)}. Removing the checkpoint's "
            f"{kv_dtype} KV-cache request avoids it; the KV cache becomes bfloat16{cost}"
        )
        return Plan(candidate.files, candidate.edits, reason, tuple(f.code for f in avoided))
    keeps = f": {sizes[0]:,} tokens per GPU ({sizes[1]:,} with bfloat16)" if sizes else ""
    return Plan(reason=_keep_reason(prediction, after, kv_dtype, vllm_version, keeps))


def _keep_reason(
    prediction: Prediction, after: Prediction, kv_dtype: str, vllm_version: str | None, keeps: str
) -> str:
    """Why the checkpoint's KV cache is kept: what vLLM will use, or what the patch won't fix."""
    errors = [f.subject for f in prediction.findings if f.severity == "error"]
    if errors:
        return (
            f"nothing to change: removing the FP8 KV cache would not avoid what is predicted "
            f"({'; '.join(errors)}); the checkpoint is left as it is"
        )
    uses = _backends_text(prediction)
    still_unsure = {g.code for g in after.findings if g.severity == "warning"}
    unsure = [
        f.subject
        for f in prediction.findings
        if f.severity == "warning" and f.code not in still_unsure
    ]
    doubt = (
        f". The vLLM version is unknown, and some releases stop here ({'; '.join(unsure)}): "
        "give the version (vllm_version) to decide"
        if unsure
        else ""
    )
    asked = (
        "with the checkpoint's KV-cache keys, which vLLM does not apply here (KV cache auto)"
        if kv_dtype == "auto"
        else f"with the {kv_dtype} KV cache the checkpoint asks for"
    )
    return (
        f"nothing to change: no failure is predicted {asked} "
        f"({_vllm_name(vllm_version)}{uses}); it is kept{keeps}{doubt}"
    )


def _backends_text(prediction: Prediction) -> str:
    named = [
        f"{choice.name} on compute capability {cc}"
        for cc, choice in prediction.evidence.backends.items()
        if choice.name
    ]
    return f" uses {', '.join(named)}" if named else ""


def _vllm_name(version: str | None) -> str:
    return f"vLLM {version}" if version else "vLLM of unknown version"


def _token_counts(facts: ModelFacts, kv_dtype: str, budget: int | None) -> tuple[int, int] | None:
    """Tokens of KV cache one GPU holds with ``kv_dtype`` and with bfloat16 (None: unknown)."""
    if not budget or not facts.num_layers:
        return None
    try:
        return tokens_that_fit(budget, facts, kv_dtype), tokens_that_fit(budget, facts, "bfloat16")
    except OpsbookError:
        return None


# --------------------------------------------------------------------------------------------
# The remote part


def read_config_state(host: Prober, model_dir: str, *, weights: bool = False) -> dict[str, Any]:
    """Texts and status (mode, uid, gid, sha256) of the config files and their backups.

    Args:
        host: the host (anything with :meth:`opsbook.remote.hosts.Host.probe`).
        model_dir: the checkpoint directory on the host.
        weights: also the ``*.safetensors`` files' count and bytes (``"weights"``).

    Returns:
        The ``configs`` probe's answer: ``{"dir", "exists", "files": {name: status},
        "backups": {name: status}}``.

    Raises:
        OpsbookError: the directory does not exist on the host.
    """
    args: dict[str, Any] = {"action": "read", "dir": model_dir, "files": list(CONFIG_FILES)}
    if weights:
        args["weights"] = True
    state: dict[str, Any] = host.probe("configs", args)
    if not state.get("exists"):
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


def read_checkpoint(host: Prober, model_dir: str) -> Checkpoint:
    """The config texts and the weights' size on disk, in one round trip.

    Raises:
        OpsbookError: the directory does not exist on the host.
    """
    state = read_config_state(host, model_dir, weights=True)
    weights = state.get("weights") or {}
    return Checkpoint(_texts(state), int(weights.get("shards", 0)), int(weights.get("bytes", 0)))


def read_configs(host: Prober, model_dir: str) -> dict[str, str]:
    """The texts of ``config.json``, ``hf_quant_config.json`` and ``tokenizer_config.json``.

    One round trip. Files that do not exist are left out.

    Args:
        host: the host.
        model_dir: the checkpoint directory on the host.

    Returns:
        File name to text.
    """
    return _texts(read_config_state(host, model_dir))


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


@dataclass
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


@dataclass
class Restored(Result):
    """:func:`restore_patch`'s verdict, with what it did as evidence."""

    evidence: RestoreEvidence = field(kw_only=True)


def apply_patch(
    host: Prober,
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
    current = _texts(state)
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
        n: {"expect_sha256": state["files"][n]["sha256"], "text": plan.files[n].new}
        for n in pending
    }
    answer = host.probe("configs", {"action": "apply", "dir": model_dir, "writes": writes})
    evidence = replace(
        evidence, changed=[n for n, a in answer["actions"].items() if a.get("written")]
    )
    if answer.get("symlinks"):
        return Applied(
            False,
            "a config file is a symbolic link: nothing was written",
            findings=[_symlink_finding(n, t, model_dir) for n, t in answer["symlinks"].items()],
            evidence=evidence,
        )
    if answer.get("conflicts"):
        return Applied(
            False,
            "the files changed while patching: nothing was written",
            findings=[_conflict_finding(name) for name in answer["conflicts"]],
            evidence=evidence,
        )
    findings, backups = _apply_findings(answer, state, plan, pending)
    recheck = _recheck(
        _texts(read_config_state(host, model_dir)), gpus, vllm_version, serve_args, probed_backends
    )
    evidence = replace(evidence, backups=backups, recheck=recheck)
    if recheck is not None:
        findings += [f for f in recheck.findings if f.severity in ("error", "warning")]
    ok = answer.get("ok", False) and not any(f.severity == "error" for f in findings)
    message = (
        f"patched {', '.join(evidence.changed)}; backups kept"
        if ok
        else "the patch did not fully apply: see the findings"
    )
    return Applied(ok, message, findings=findings, evidence=evidence)


def restore_patch(host: Prober, model_dir: str, files: Sequence[str] = PATCHABLE_FILES) -> Restored:
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
    answer = host.probe("configs", {"action": "restore", "dir": model_dir, "files": list(files)})
    if not answer["state"].get("exists"):
        raise OpsbookError(
            f"the model directory {model_dir} does not exist on the host",
            remedy="check model.path in the deployment file",
        )
    by_status: dict[str, list[str]] = {}
    for name, action in answer["actions"].items():
        by_status.setdefault(action["status"], []).append(name)
    findings = []
    for name, action in answer["actions"].items():
        if action["status"] == "failed":
            findings.append(
                Finding(
                    "error",
                    name,
                    f"could not restore: {action['error']}",
                    remedy="check the folder's permissions and free space",
                    code=NOT_RESTORED,
                )
            )
        elif action["status"] == "no-backup":
            findings.append(Finding("info", name, "no backup: left as it is", code=NO_BACKUP))
    state = answer["state"]
    for name in by_status.get("restored", []) + by_status.get("already", []):
        if state["files"][name].get("sha256") != state["backups"][name].get("sha256"):
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


def _texts(state: Mapping[str, Any]) -> dict[str, str]:
    return {name: s["text"] for name, s in state["files"].items() if s.get("text") is not None}


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
    answer: Mapping[str, Any],
    before: Mapping[str, Any],
    plan: Plan,
    pending: Sequence[str],
) -> tuple[list[Finding], dict[str, Backup]]:
    """Check what the apply step reports against what was planned; the findings, and the
    backups of the files written."""
    findings = []
    backups: dict[str, Backup] = {}
    after = answer["state"]
    for name in pending:
        action = answer["actions"].get(name, {})
        if not action.get("written"):
            findings.append(
                Finding(
                    "error",
                    name,
                    f"not written: {action.get('error', 'skipped')}",
                    remedy="check the folder's permissions and free space",
                    code=NOT_WRITTEN,
                )
            )
            continue
        backup = after["backups"][name]
        kept = Backup(backup["path"], backup.get("sha256"), action.get("backup") == "created")
        backups[name] = kept
        earlier = backup.get("sha256") != before["files"][name]["sha256"]
        if action.get("backup") == "kept" and earlier:
            second = action.get("second_backup") or "(not kept)"
            backups[name] = replace(kept, second=action.get("second_backup"))
            findings.append(
                Finding(
                    "info",
                    name,
                    f"an earlier backup {backup['path']} was kept (it is the first "
                    "original; it differs from the file as it was before this patch, which is "
                    f"kept as {second})",
                    code=EARLIER_BACKUP_KEPT,
                )
            )
        if after["files"][name].get("sha256") != _sha256(plan.files[name].new):
            findings.append(
                Finding(
                    "error",
                    name,
                    "after writing, the file is not the planned text",
                    remedy="restore_patch, then plan again",
                    code=NOT_AS_PLANNED,
                )
            )
        old, new = before["files"][name], after["files"][name]
        if (old["mode"], old["uid"], old["gid"]) != (new["mode"], new["uid"], new["gid"]):
            findings.append(
                Finding(
                    "warning",
                    name,
                    f"mode/owner changed from {old['mode']:o} {old['uid']}:"
                    f"{old['gid']} to {new['mode']:o} {new['uid']}:{new['gid']}",
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


def _walk(doc: Any, path: Sequence[str]) -> Any:
    node = doc
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return node


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
