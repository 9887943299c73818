"""Part of the ``download`` probe: the files around the shards (partial downloads and
locks, snapshot links, config and tokenizer files) and their findings.

Standard library only, joined into the probe's program by
:func:`opsbook.remote.probes.assemble` (see ``probe_body``).
"""

from __future__ import annotations

import json
import os
import re

from .shard_read import file_size, finding, os_reason, read_header

# typing costs this program, started once per check, a tenth of its start: its names are
# used in annotations only, which are never evaluated here.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

LOCAL_PARTIAL = re.compile(r"^(?P<file>.+)\.[^.]+\.incomplete$")
JSON_FILES = ("config.json", "hf_quant_config.json", "generation_config.json", "tokenizer.json")
TOKENIZER_FILES = ("tokenizer.json", "tiktoken.model", "tokenizer.model")
PARTIAL_SUFFIXES = (".incomplete", ".lock")


def find_partials(
    where: dict[str, Any], index: dict[str, Any] | None, listing: list[str]
) -> list[dict[str, Any]]:
    """``.incomplete`` and ``.lock`` files a download leaves while running or when killed
    (``listing``: the model directory's names)."""
    model_dir = where["model_dir"]
    folders = [os.path.join(model_dir, ".cache", "huggingface", "download")]
    if where["repo_dir"]:
        repo = where["repo_dir"]
        folders += [
            os.path.join(repo, "blobs"),
            os.path.join(os.path.dirname(repo), ".locks", os.path.basename(repo)),
        ]
    partials: list[dict[str, Any]] = []
    listed = [(model_dir, partial_names(listing))]
    listed += [(folder, partial_names(list_unsorted(folder))) for folder in folders]
    for folder, names in listed:
        for name in names:
            path = os.path.join(folder, name)
            partials.append(
                {
                    "path": path,
                    "kind": name.rsplit(".", 1)[1],
                    "bytes": file_size(path) or 0,
                    "shard": partial_shard(path, index),
                }
            )
    # A cache lock is named by the blob hash only; its blob's partial file knows the shard.
    by_blob = {
        os.path.basename(p["path"]).split(".")[0]: p["shard"] for p in partials if p["shard"]
    }
    for item in partials:
        if item["shard"] is None:
            item["shard"] = by_blob.get(os.path.basename(item["path"]).split(".")[0])
    return partials


def partial_names(names: list[str]) -> list[str]:
    """The names of partial files and locks among ``names``, sorted (a local-dir download
    folder holds a ``.metadata`` file per shard: thousands, none of them partial)."""
    return sorted(name for name in names if name.endswith(PARTIAL_SUFFIXES))


def list_unsorted(folder: str) -> list[str]:
    """The names in a folder as listed, none when it cannot be read."""
    try:
        return os.listdir(folder)
    except OSError:
        return []


def partial_shard(path: str, index: dict[str, Any] | None) -> str | None:
    """Which shard a partial file belongs to: by its local-dir name or its header's tensors."""
    name = os.path.basename(path)
    match = LOCAL_PARTIAL.match(name)
    if match and match.group("file").endswith(".safetensors"):
        return match.group("file")
    if name.endswith(".lock") and name[: -len(".lock")].endswith(".safetensors"):
        return name[: -len(".lock")]
    if not name.endswith(".incomplete") or index is None:
        return None
    size = file_size(path) or 0
    _, header, _, _ = read_header(path, size)
    for tensor in header or {}:
        if tensor != "__metadata__" and tensor in index["weight_map"]:
            shard: str = index["weight_map"][tensor]
            return shard
    return None


def partial_findings(partials: list[dict[str, Any]], rows: list[dict[str, Any]]) -> list[Any]:
    """Partial files: an error while their shard is missing, otherwise leftovers."""
    done = {row["file"] for row in rows if row["status"] == "ok"}
    found = []
    for item in partials:
        shard = item["shard"] or "a file"
        if item["kind"] == "incomplete" and item["shard"] not in done:
            found.append(
                finding(
                    "error",
                    item["path"],
                    f"partial download of {shard} ({item['bytes']} bytes): "
                    "a download is running or was interrupted",
                    "wait for the download to finish, or run it again to resume",
                )
            )
        elif item["kind"] == "incomplete":
            found.append(
                finding(
                    "warning",
                    item["path"],
                    f"leftover partial file; {shard} is complete",
                    "delete the leftover once no download is running",
                )
            )
        else:
            found.append(
                finding(
                    "warning",
                    item["path"],
                    "lock file left by a download",
                    "if no download is running, it is safe to delete",
                )
            )
    return found


def link_findings(where: dict[str, Any], listing: list[str]) -> list[dict[str, str]]:
    """Snapshot entries whose symlink does not resolve (cache layout; ``listing``: the
    snapshot's names)."""
    if where["layout"] != "hf-cache":
        return []
    found = []
    for name in listing:
        path = os.path.join(where["model_dir"], name)
        if name.endswith(".safetensors") or not os.path.islink(path):
            continue
        try:
            os.stat(path)
        except OSError as error:
            found.append(
                finding(
                    "error",
                    name,
                    f"snapshot link to {os.readlink(path)} does not resolve: {os_reason(error)}",
                    "download the file again",
                )
            )
    return found


def check_small_files(model_dir: str) -> list[dict[str, Any]]:
    """config, quantization, generation and tokenizer files: present, readable, JSON."""
    rows = []
    for name in JSON_FILES + ("tokenizer_config.json",) + TOKENIZER_FILES[1:]:
        path = os.path.join(model_dir, name)
        row = {"file": name, "status": "ok", "detail": ""}
        if not os.path.lexists(path):
            row["status"] = "absent"
        elif name.endswith(".json"):
            row.update(parse_json_file(path))
        else:
            try:
                os.stat(path)
            except OSError as error:
                row.update(status="unreadable", detail=os_reason(error))
        rows.append(row)
    rows += remote_code_files(model_dir, rows)
    return rows


def parse_json_file(path: str) -> dict[str, str]:
    """``{"status": ..., "detail": ...}`` for one JSON file."""
    try:
        with open(path, "rb") as handle:
            json.loads(handle.read().decode("utf-8"))
    except OSError as error:
        return {"status": "unreadable", "detail": os_reason(error)}
    except ValueError as error:
        return {"status": "invalid", "detail": f"not valid JSON: {error}"}
    return {"status": "ok", "detail": ""}


def remote_code_files(model_dir: str, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Python modules that ``auto_map`` entries (loaded with --trust-remote-code) name."""
    modules = set()
    for name in ("config.json", "tokenizer_config.json"):
        if not any(r["file"] == name and r["status"] == "ok" for r in rows):
            continue
        try:
            with open(os.path.join(model_dir, name), "rb") as handle:
                data = json.loads(handle.read().decode("utf-8"))
        except (OSError, ValueError):
            continue
        auto_map = data.get("auto_map") if isinstance(data, dict) else None
        for value in (auto_map or {}).values() if isinstance(auto_map, dict) else ():
            for ref in value if isinstance(value, list) else [value]:
                if isinstance(ref, str) and "." in ref and "--" not in ref:
                    modules.add(ref.rsplit(".", 1)[0] + ".py")
    found = []
    for module in sorted(modules):
        present = os.path.exists(os.path.join(model_dir, module))
        found.append(
            {
                "file": module,
                "status": "ok" if present else "absent",
                "detail": "named by auto_map",
                "required": True,
            }
        )
    return found


def file_findings(rows: list[dict[str, Any]]) -> list[dict[str, str]]:
    """Findings for missing or broken config and tokenizer files."""
    status = {row["file"]: row["status"] for row in rows}
    found = []
    for row in rows:
        if row["status"] in ("invalid", "unreadable"):
            found.append(
                finding(
                    "error",
                    row["file"],
                    row["status"] + ": " + row["detail"],
                    "download this file again",
                )
            )
        elif row["status"] == "absent" and row["file"] == "config.json":
            found.append(finding("error", row["file"], "missing", "download this file"))
        elif row["status"] == "absent" and row.get("required"):
            found.append(
                finding(
                    "warning",
                    row["file"],
                    "missing; auto_map names it, so --trust-remote-code needs it",
                    "download this file",
                )
            )
    if status.get("tokenizer_config.json") == "absent":
        found.append(
            finding("warning", "tokenizer_config.json", "missing", "download the tokenizer files")
        )
    if all(status.get(name) == "absent" for name in TOKENIZER_FILES):
        found.append(
            finding(
                "warning",
                "tokenizer",
                "no tokenizer.json, tiktoken.model or tokenizer.model",
                "download the tokenizer files",
            )
        )
    return found
