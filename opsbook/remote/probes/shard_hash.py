"""Part of the ``download`` probe: its ``hash`` operation, sha256 of shards on several
cores compared with the hub cache blob names, the local-dir metadata etags or a manifest; a
cache file (opt-in) skips unchanged shards.

Standard library only, joined into the probe's program by
:func:`opsbook.remote.probes.assemble` (see ``probe_body``).
"""

from __future__ import annotations

import json
import os
import re
import time

from .shard_read import (
    expected_shards,
    finding,
    list_folder,
    locate,
    os_reason,
    read_index,
    shards_on_disk,
)

# typing costs this program, started once per check, a tenth of its start: its names are
# used in annotations only, which are never evaluated here.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

HEX64 = re.compile(r"^[0-9a-f]{64}$")


def hash_op(args: dict[str, Any]) -> dict[str, Any]:
    """sha256 of shards in parallel threads, compared with the best known reference."""
    where = locate(str(args.get("path", "")))
    if where["error"]:
        return {
            "where": where,
            "files": [],
            "findings": [finding("error", where["input"], where["error"], "check the model path")],
        }
    model_dir = where["model_dir"]
    files = args.get("files")
    if files is None:
        index, _ = read_index(model_dir)
        files = expected_shards(index, shards_on_disk(list_folder(model_dir)))
    cache_path = args.get("cache_path")
    cache = load_cache(cache_path) if cache_path else {}
    manifest = args.get("manifest") or {}
    workers = int(args.get("workers") or os.cpu_count() or 1)
    started = time.time()
    # Imported here: concurrent.futures brings logging, 50 ms the check does not need.
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(max_workers=max(workers, 1)) as pool:
        # hashlib and file reads release the GIL, so threads use several cores; a process
        # pool would need an importable __main__, which a program read from stdin lacks.
        rows = list(pool.map(lambda name: hash_one(model_dir, name, cache), files))
    for row in rows:
        row.update(reference(where, model_dir, row["file"], manifest))
        row["status"] = hash_status(row)
    if cache_path:
        save_cache(cache_path, cache)
    return {
        "where": where,
        "files": rows,
        "seconds": time.time() - started,
        "findings": hash_findings(rows),
    }


def hash_one(model_dir: str, name: str, cache: dict[str, Any]) -> dict[str, Any]:
    """Hash one file, or reuse the cached hash when size and mtime are unchanged."""
    path = os.path.join(model_dir, name)
    row: dict[str, Any] = {"file": name, "sha256": None, "bytes": 0, "cached": False, "error": ""}
    try:
        info = os.stat(path)
        key = os.path.realpath(path)
        known = cache.get(key)
        if (
            known
            and known.get("size") == info.st_size
            and known.get("mtime_ns") == info.st_mtime_ns
        ):
            row.update(sha256=known["sha256"], bytes=info.st_size, cached=True)
            return row
        import hashlib  # here: the check, which is most of this probe's runs, needs none

        digest = hashlib.sha256()
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(8 * 1024 * 1024), b""):
                digest.update(block)
        row.update(sha256=digest.hexdigest(), bytes=info.st_size)
        cache[key] = {"size": info.st_size, "mtime_ns": info.st_mtime_ns, "sha256": row["sha256"]}
    except OSError as error:
        row["error"] = os_reason(error)
    return row


def reference(
    where: dict[str, Any], model_dir: str, name: str, manifest: dict[str, str]
) -> dict[str, Any]:
    """The expected sha256 of a file and where it comes from."""
    if name in manifest:
        return {"expected": str(manifest[name]).lower(), "source": "manifest"}
    path = os.path.join(model_dir, name)
    if os.path.islink(path):
        blob = os.path.basename(os.readlink(path))
        if HEX64.match(blob):
            return {"expected": blob, "source": "hf-cache blob name"}
    metadata = os.path.join(model_dir, ".cache", "huggingface", "download", name + ".metadata")
    try:
        with open(metadata) as handle:
            lines = handle.read().splitlines()
        if len(lines) >= 2 and HEX64.match(lines[1].strip()):
            return {"expected": lines[1].strip(), "source": "local-dir metadata etag"}
    except OSError:
        pass
    return {"expected": None, "source": None}


def hash_status(row: dict[str, Any]) -> str:
    """match, mismatch, no-reference or unreadable."""
    if row["error"]:
        return "unreadable"
    if row["expected"] is None:
        return "no-reference"
    return "match" if row["expected"] == row["sha256"] else "mismatch"


def hash_findings(rows: list[dict[str, Any]]) -> list[dict[str, str]]:
    """An error per mismatch or unreadable file."""
    found = []
    for row in rows:
        if row["status"] == "mismatch":
            found.append(
                finding(
                    "error",
                    row["file"],
                    "sha256 {} differs from {} ({})".format(
                        row["sha256"], row["expected"], row["source"]
                    ),
                    "delete this file and download it again",
                )
            )
        elif row["status"] == "unreadable":
            found.append(
                finding(
                    "error",
                    row["file"],
                    "cannot hash: " + row["error"],
                    "check the file exists and is readable",
                )
            )
    return found


def load_cache(path: str) -> dict[str, Any]:
    """The hash cache, or an empty one if it is absent or unreadable."""
    try:
        with open(path) as handle:
            data = json.load(handle)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def save_cache(path: str, cache: dict[str, Any]) -> None:
    """Write the cache through a temporary file and a rename, so a reader never sees half."""
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        os.makedirs(folder)
    temporary = f"{path}.{os.getpid()}.tmp"
    with open(temporary, "w") as handle:
        json.dump(cache, handle, sort_keys=True)
    os.replace(temporary, path)
