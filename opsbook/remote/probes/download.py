"""Probe: is a downloaded checkpoint complete and readable? One round trip for all shards.

Runs on the host's own ``python3`` (3.8+), standard library only, and writes nothing unless
the caller names a hash cache file. ``args["op"]`` selects:

* ``check``: shards named by ``model.safetensors.index.json`` exist, sizes agree with their
  safetensors headers (``size == 8 + header length + last data offset``), headers parse and
  their offsets are contiguous, every indexed tensor is in its shard's header, no partial
  downloads or locks are left, snapshot links resolve, config and tokenizer files are JSON.
  The shards come as ``{"columns": SHARD_COLUMNS, "rows": [[...], ...]}``: a row per shard
  as a list is half the bytes of an object naming every field, for thousands of shards.
* ``hash``: sha256 of shards on several cores, compared with the hub cache blob names, the
  local-dir metadata etags or a manifest; a cache file (opt-in) skips unchanged shards.
* ``progress``: bytes present per shard, counting ``.incomplete`` files, for watching.

Every problem is a finding naming the file; the probe itself does not fail on bad input.
"""

from __future__ import annotations

import gc
import marshal
import os
import time
from collections import Counter

# The check's parts, joined into this program on the host by opsbook.remote.probes.assemble:
# relative imports of this folder's modules are what it joins.
from .model_files import (
    check_small_files,
    file_findings,
    find_partials,
    link_findings,
    partial_findings,
)
from .shard_hash import hash_op
from .shard_read import (
    INDEX_NAME,
    expected_shards,
    file_size,
    finding,
    inspect_shard,
    layout_of,
    list_folder,
    locate,
    read_header,
    read_index,
    shards_on_disk,
)

# typing costs this program, started once per check, a tenth of its start: its names are
# used in annotations only, which are never evaluated here.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def main(args: dict[str, Any]) -> dict[str, Any]:
    """Run the operation named by ``args["op"]`` (``check``, ``hash`` or ``progress``)."""
    op = args.get("op", "check")
    if op == "check":
        # The check keeps a row per shard while it parses thousands of headers: each of the
        # cyclic collector's passes walks what is kept (14% of the check at 11,900 shards).
        # Its containers hold no cycles, and the process ends with the answer.
        collecting = gc.isenabled()
        gc.disable()
        try:
            return check(args)
        finally:
            if collecting:
                gc.enable()
    if op == "hash":
        return hash_op(args)
    if op == "progress":
        return progress(args)
    return {"findings": [finding("error", "probe", f"unknown op {op!r}")]}


# --- check --------------------------------------------------------------------------------

SHARD_COLUMNS = ("file", "status", "size", "expected_size", "header_len", "tensors", "detail")


def shard_table(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The shard rows as columns and a list of values per row."""
    return {"columns": list(SHARD_COLUMNS), "rows": [[r[c] for c in SHARD_COLUMNS] for r in rows]}


def check(args: dict[str, Any]) -> dict[str, Any]:
    """The whole download check: shards, headers, partial files, config and tokenizer files."""
    where = locate(str(args.get("path", "")))
    answer: dict[str, Any] = {
        "where": where,
        "index": None,
        "shards": shard_table([]),
        "files": [],
        "partials": [],
        "findings": [],
        "summary": {},
    }
    if where["error"]:
        answer["findings"].append(
            finding("error", where["input"], where["error"], "check the model path")
        )
        answer["summary"] = summarize([], None)
        return answer
    model_dir = where["model_dir"]
    listing = list_folder(model_dir)
    on_disk = shards_on_disk(listing)
    # The shards on disk are read by forked workers while this process reads the index
    # (tens of MB for a large MoE), then helps them: the two are the check's main costs.
    inspection = start_inspection(model_dir, on_disk, int(args.get("workers") or 0))
    index, answer["findings"] = read_index(model_dir)
    # Digested now, while the workers still inspect, not after them.
    wanted = names_by_shard(index["weight_map"]) if index is not None else None
    # The shards the index names are the digest's keys: sorted here, not gathered again.
    expected = sorted(wanted) if wanted is not None else expected_shards(None, on_disk)
    answer["index"] = index_facts(index, expected)
    if index is None and not on_disk:
        answer["findings"].append(
            finding(
                "error",
                model_dir,
                f"no {INDEX_NAME} and no *.safetensors files",
                "point at the directory holding the checkpoint, or download it",
            )
        )
    elif index is None:
        answer["findings"].append(
            finding(
                "warning" if len(on_disk) > 1 else "info",
                INDEX_NAME,
                f"no usable index; checking the {len(on_disk)} shard(s) found on disk"
                + (
                    f" and the {len(expected) - len(on_disk)} more their names count"
                    if len(expected) > len(on_disk)
                    else ""
                ),
            )
        )
    # Work of this process alone, done while the workers still inspect shards rather than
    # after them, when they would wait for it.
    answer["partials"] = find_partials(where, index, listing)
    answer["files"] = check_small_files(model_dir)
    inspected = finish_inspection(inspection)
    rows = [inspected.get(name) or inspect_row(model_dir, name) for name in expected]
    match_index(rows, wanted, index, model_dir)
    named = set(expected)
    for name in on_disk:
        if name not in named:
            rows.append(
                {
                    "file": name,
                    "status": "unexpected",
                    "size": file_size(os.path.join(model_dir, name)),
                    "expected_size": None,
                    "header_len": None,
                    "tensors": None,
                    "detail": "not named in the index",
                }
            )
    answer["shards"] = shard_table(rows)
    answer["findings"] += shard_findings(rows) + partial_findings(answer["partials"], rows)
    answer["findings"] += link_findings(where, listing) + file_findings(answer["files"])
    answer["summary"] = summarize(rows, answer["index"])
    return answer


def index_facts(index: dict[str, Any] | None, expected: list[str]) -> dict[str, Any]:
    """What the index says: presence, total_size (reported, never trusted), counts."""
    if index is None:
        return {"present": False, "total_size": None, "tensors": 0, "shards": len(expected)}
    metadata = index.get("metadata")
    total = metadata.get("total_size") if isinstance(metadata, dict) else None
    return {
        "present": True,
        "total_size": total if isinstance(total, int) else None,
        "tensors": len(index["weight_map"]),
        "shards": len(expected),
    }


def tensors_by_shard(weight_map: dict[str, str]) -> dict[str, list[str]]:
    """The index's weight map turned around: per shard, the tensors it should hold."""
    wanted: dict[str, list[str]] = {}
    for tensor, shard in weight_map.items():
        wanted.setdefault(shard, []).append(tensor)
    return wanted


def absent_tensors(header: Any, tensors: list[str]) -> list[str]:
    """The tensors of ``tensors`` that a header's names (a set) lack."""
    return [t for t in tensors if t not in header]


def mark_absent(row: dict[str, Any], absent: list[str]) -> None:
    """Mark a shard whose header lacks tensors the index places in it."""
    if absent:
        row["status"] = "corrupt"
        row["detail"] = (
            f"{len(absent)} tensor(s) named in the index are not in the header, "
            f"e.g. {', '.join(absent[:3])}"
        )


def names_digest(header: dict[str, Any]) -> int:
    """A digest of a header's tensor names (its keys but "__metadata__"): the sum of their
    hashes, in C over hashes the parser already computed. The workers are forks of the
    process that compares, so they share its string-hash seed."""
    digest = sum(map(hash, header))
    return digest - hash("__metadata__") if "__metadata__" in header else digest


def names_by_shard(weight_map: dict[str, str]) -> dict[str, tuple[int, int]]:
    """Per shard, how many tensors the index places in it and their :func:`names_digest`:
    one pass over the map, made while the workers read the shards."""
    digests: dict[str, int] = {}
    get = digests.get
    for tensor, shard in weight_map.items():
        digests[shard] = get(shard, 0) + hash(tensor)
    counts = Counter(weight_map.values())
    return {shard: (counts[shard], digest) for shard, digest in digests.items()}


def inspect_row(model_dir: str, name: str) -> dict[str, Any]:
    """A shard's row, its header's names replaced by their digest (``names``)."""
    row = inspect_shard(model_dir, name)
    header = row.pop("header")
    row["names"] = names_digest(header) if header is not None else None
    return row


def shard_row(model_dir: str, name: str, wanted: dict[str, list[str]]) -> dict[str, Any]:
    """A shard's row read afresh, its header's names matched against the index's."""
    row = inspect_shard(model_dir, name)
    header = row.pop("header")
    if header is not None and row["status"] == "ok":
        mark_absent(row, absent_tensors(header, wanted.get(name, [])))
    return row


def match_index(
    rows: list[dict[str, Any]],
    wanted: dict[str, tuple[int, int]] | None,
    index: dict[str, Any] | None,
    model_dir: str,
) -> None:
    """Match each sound shard's tensor names against those the index places in it.

    A shard whose count and digest of names are the index's holds what the index says.
    Any other (a rare, broken download) is read again here, and its names compared one by
    one: the tensors the index places in it that its header lacks make it corrupt; more
    than the index asks is no fault.
    """
    unsettled = []
    for row in rows:
        digest = row.pop("names", None)
        if wanted is not None and row["status"] == "ok":
            if (row["tensors"], digest) != wanted.get(row["file"], (0, 0)):
                unsettled.append(row)
    if not unsettled or index is None:
        return
    tensors = tensors_by_shard(index["weight_map"])
    for row in unsettled:
        fresh = shard_row(model_dir, row["file"], tensors)
        row.clear()
        row.update(fresh)


# Below this many shards a second process costs more than it saves (119 shards over SSH,
# best of 9: 0.100 s alone, 0.114 s with two workers); more than this many workers only
# contend for the disk.
PARALLEL_MIN_SHARDS = 256
MAX_WORKERS = 16
# The shards are handed out in chunks of at least this many, at most 255 chunks (one byte
# each in the queue).
CHUNK_MIN = 8


class Worker:
    """A forked process inspecting chunks of the shards: it answers its rows on a pipe, in
    marshal's format (its parent's interpreter: a fork; 11,900 rows in a few ms, where JSON
    took tens), then ends."""

    def __init__(self, pid: int, answers: Any) -> None:
        self.pid = pid
        self.answers = answers

    def rows(self) -> list[dict[str, Any]] | None:
        """The worker's rows, once it has ended; None when it failed."""
        try:
            rows = marshal.loads(self.answers.read())
        except (EOFError, ValueError, TypeError):  # it ended before it answered in full
            rows = None
        self.answers.close()
        _, status = os.waitpid(self.pid, 0)
        return rows if isinstance(rows, list) and status == 0 else None


class Inspection:
    """The shards on disk in chunks, the queue the chunks are taken from (a pipe holding one
    byte per chunk, read one byte at a time by whoever is free: -1 when this process takes
    them all) and the workers taking them."""

    def __init__(self, model_dir: str, chunks: list[list[str]], queue: int) -> None:
        self.model_dir = model_dir
        self.chunks = chunks
        self.queue = queue
        self.children: list[Worker] = []

    def take(self) -> list[str] | None:
        """The next chunk nobody has taken, or None when there is none left."""
        if self.queue < 0:
            return self.chunks.pop(0) if self.chunks else None
        token = os.read(self.queue, 1)
        return self.chunks[token[0]] if token else None

    def close(self) -> None:
        if self.queue >= 0:
            os.close(self.queue)
            self.queue = -1


def usable_cpus() -> int:
    """The cores this process may run on (a container's or taskset's share, not the host's)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def start_inspection(model_dir: str, names: list[str], workers: int = 0) -> Inspection:
    """Fork workers that take chunks of ``names`` from a queue; none when this process alone
    is as quick (few shards, one core). ``workers`` is the number of processes inspecting,
    this one included (0: one per usable core; 1: this process inspects them all): this
    process takes chunks too once it has read the index (:func:`finish_inspection`), so one
    core each is one fork fewer than the cores, and no one waits on a slow share.

    Parsing headers is CPU work under the GIL, so threads would not help; a process pool
    needs an importable ``__main__``, which a program read from stdin lacks, so the workers
    are plain forks, each answering over a pipe.
    """
    if workers <= 0:
        enough = len(names) >= PARALLEL_MIN_SHARDS
        workers = min(usable_cpus(), MAX_WORKERS) if enough else 1
    # Chunks of CHUNK_MIN shards or more, but a few for each process when there are few.
    size = max(-(-len(names) // 255), min(CHUNK_MIN, len(names) // (4 * workers)), 1)
    chunks = [names[i : i + size] for i in range(0, len(names), size)]
    forks = min(workers, len(chunks)) - 1
    if forks < 1:
        return Inspection(model_dir, chunks, -1)
    queue, filler = os.pipe()
    os.write(filler, bytes(range(len(chunks))))  # at most 255 bytes: within the pipe's buffer
    os.close(filler)
    inspection = Inspection(model_dir, chunks, queue)
    for _ in range(forks):
        inspection.children.append(fork_share(inspection))
    return inspection


def finish_inspection(inspection: Inspection) -> dict[str, dict[str, Any]]:
    """Inspect the chunks no worker has taken, then collect the workers' rows: all rows by
    shard name, each header's names replaced by their digest (:func:`inspect_row`). A failed
    worker's shards are left to the caller.

    The names are dropped as soon as a row is made: a header's names kept for later,
    thousands of them, are tens of MB of memory to fault in.
    """
    rows: dict[str, dict[str, Any]] = {}
    model_dir = inspection.model_dir
    chunk = inspection.take()
    while chunk is not None:
        for name in chunk:
            rows[name] = inspect_row(model_dir, name)
        chunk = inspection.take()
    inspection.close()
    for child in inspection.children:
        for row in child.rows() or []:
            rows[row["file"]] = row
    return rows


def inspect_share(model_dir: str, names: list[str]) -> list[dict[str, Any]]:
    """Rows for some shards, the tensor names replaced by their digest."""
    return [inspect_row(model_dir, name) for name in names]


def serve_share(inspection: Inspection, answers: int) -> None:
    """The worker's life: inspect chunks while there are any, then answer the rows."""
    rows: list[dict[str, Any]] = []
    with os.fdopen(answers, "wb") as out:
        chunk = inspection.take()
        while chunk is not None:
            rows += inspect_share(inspection.model_dir, chunk)
            chunk = inspection.take()
        out.write(marshal.dumps(rows))


def fork_share(inspection: Inspection) -> Worker:
    """A child process taking chunks from the inspection's queue. It closes its copies of
    the earlier workers' pipes."""
    answers_read, answers_write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: answer, then leave without running the parent's exit handlers
        code = 0
        try:
            os.close(answers_read)
            for sibling in inspection.children:
                sibling.answers.close()
            serve_share(inspection, answers_write)
        except BaseException:
            code = 1
        os._exit(code)
    os.close(answers_write)
    return Worker(pid, os.fdopen(answers_read, "rb"))


def shard_findings(rows: list[dict[str, Any]]) -> list[dict[str, str]]:
    """One finding per shard that is not ok."""
    remedies = {
        "missing": "download the missing shard(s) again",
        "truncated": "the download was interrupted; download this shard again",
        "corrupt": "delete this shard and download it again",
        "unreadable": "fix the file's permissions or ownership for the serving user",
        "unexpected": "remove it or check it belongs to this checkpoint",
    }
    found = []
    for row in rows:
        if row["status"] == "ok":
            continue
        severity = "warning" if row["status"] == "unexpected" else "error"
        message = row["status"] + (": " + row["detail"] if row["detail"] else "")
        found.append(finding(severity, row["file"], message, remedies.get(row["status"], "")))
    return found


def summarize(rows: list[dict[str, Any]], index: dict[str, Any] | None) -> dict[str, Any]:
    """Counts and lists per status, bytes present against bytes expected."""
    by_status: dict[str, list[str]] = {}
    for row in rows:
        by_status.setdefault(row["status"], []).append(row["file"])
    known = [row["expected_size"] for row in rows if row["expected_size"]]
    unknown = len(
        [row for row in rows if not row["expected_size"] and row["status"] != "unexpected"]
    )
    estimate = (sum(known) // len(known)) * unknown if known and unknown else 0
    return {
        "shards": len([row for row in rows if row["status"] != "unexpected"]),
        "ok": len(by_status.get("ok", [])),
        "missing": by_status.get("missing", []),
        "truncated": by_status.get("truncated", []),
        "corrupt": by_status.get("corrupt", []),
        "unreadable": by_status.get("unreadable", []),
        "unexpected": by_status.get("unexpected", []),
        "bytes_present": sum(row["size"] or 0 for row in rows if row["status"] != "unexpected"),
        "bytes_expected": sum(known) + estimate,
        "expected_estimated": bool(unknown),
        "index_total_size": index.get("total_size") if index else None,
    }


def progress(args: dict[str, Any]) -> dict[str, Any]:
    """Bytes present per shard, counting partial downloads, with a timestamp."""
    where = locate(str(args.get("path", "")))
    answer: dict[str, Any] = {
        "time": time.time(),
        "where": where,
        "shards": [],
        "findings": [],
        "totals": {},
    }
    if where["error"]:
        answer["findings"].append(
            finding("error", where["input"], where["error"], "check the model path")
        )
        answer["totals"] = progress_totals([])
        return answer
    model_dir = where["model_dir"]
    index, answer["findings"] = read_index(model_dir)
    listing = list_folder(model_dir)
    partials = {
        p["shard"]: p
        for p in find_partials(where, index, listing)
        if p["kind"] == "incomplete" and p["shard"]
    }
    rows = []
    for name in expected_shards(index, shards_on_disk(listing)):
        rows.append(progress_row(model_dir, name, partials.get(name)))
    answer["shards"] = rows
    answer["totals"] = progress_totals(rows)
    return answer


def progress_row(model_dir: str, name: str, partial: dict[str, Any] | None) -> dict[str, Any]:
    """State of one shard: done, partial (or truncated final file) or missing."""
    path = os.path.join(model_dir, name)
    size = file_size(path)
    if size is None and partial is not None:
        path, size = partial["path"], partial["bytes"]
    if size is None:
        return {"file": name, "state": "missing", "bytes": 0, "expected": None}
    length, header, _, _ = read_header(path, size)
    expected = 8 + length + layout_of(header)[0] if header else None
    state = "done" if expected == size and path.endswith(name) else "partial"
    return {"file": name, "state": state, "bytes": size, "expected": expected}


def progress_totals(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Shard counts per state and bytes present against bytes expected (estimated if needed)."""
    known = [row["expected"] for row in rows if row["expected"]]
    unknown = len(rows) - len(known)
    estimate = (sum(known) // len(known)) * unknown if known and unknown else 0
    return {
        "shards": len(rows),
        "done": len([r for r in rows if r["state"] == "done"]),
        "partial": len([r for r in rows if r["state"] == "partial"]),
        "missing": len([r for r in rows if r["state"] == "missing"]),
        "bytes_present": sum(r["bytes"] for r in rows),
        "bytes_expected": sum(known) + estimate,
        "expected_estimated": bool(unknown),
    }
