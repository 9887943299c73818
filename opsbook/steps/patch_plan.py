"""Plan the fix of a checkpoint's JSON configs, without touching a host.

:func:`plan_patch` turns edits into new file texts that keep the file's indentation, key
order, trailing newline and escaping, with a unified diff per file.
:func:`fp8_kv_cache_edits` is the incident's patch: drop the checkpoint's FP8 KV-cache request.
:func:`plan_for_prediction` plans it only when the prediction of
:func:`opsbook.knowledge.compat.check_compat` has a failure that the patch avoids: an FP8 KV
cache that vLLM can serve is kept, since a 16-bit one holds half the tokens.
:mod:`opsbook.steps.patch` applies a plan on the host.
"""

from __future__ import annotations

import copy
import difflib
import itertools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from opsbook.core.exceptions import OpsbookError
from opsbook.core.results import Table
from opsbook.knowledge.compat import (
    ModelFacts,
    Prediction,
    check_compat,
    facts_from_texts,
    parse_json,
    tokens_that_fit,
)

ACTIONS = ("delete", "set")


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


def _walk(doc: Any, path: Sequence[str]) -> Any:
    node = doc
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return node
