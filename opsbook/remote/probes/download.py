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

import errno
import gc
import json
import math
import os
import re
import stat
import struct
import time
from collections import Counter

# typing costs this program, started once per check, a tenth of its start: its names are
# used in annotations only, which are never evaluated here.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

INDEX_NAME = "model.safetensors.index.json"
MAX_HEADER = 100_000_000
# A shard's first read: its header length and, for most shards (headers of a few kB), the
# whole header; a longer header takes a second read.
FIRST_READ = 8192
HEX64 = re.compile(r"^[0-9a-f]{64}$")
LOCAL_PARTIAL = re.compile(r"^(?P<file>.+)\.[^.]+\.incomplete$")
DTYPE_BITS = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8, "I16": 16,
    "U16": 16, "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32, "F64": 64,
    "I64": 64, "U64": 64, "F4": 4,
}  # fmt: skip
JSON_FILES = ("config.json", "hf_quant_config.json", "generation_config.json", "tokenizer.json")
TOKENIZER_FILES = ("tokenizer.json", "tiktoken.model", "tokenizer.model")
SAMPLE = 5


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


def finding(severity: str, subject: str, message: str, remedy: str = "") -> dict[str, str]:
    """A finding as plain JSON: severity, subject, message, remedy."""
    return {"severity": severity, "subject": subject, "message": message, "remedy": remedy}


def os_reason(error: OSError) -> str:
    """A short reason for an OS error, naming symlink loops and permissions plainly."""
    if error.errno == errno.ELOOP:
        return "symlink loop"
    if error.errno == errno.EACCES:
        return "permission denied"
    if error.errno == errno.ENOENT:
        return "does not exist"
    return error.strerror or str(error)


# --- where the model is -------------------------------------------------------------------


def locate(path: str) -> dict[str, Any]:
    """Find the model directory and its layout from a user-given path.

    Accepts a local dir, a cache snapshot dir, or a cache repo dir (``models--org--name``,
    resolved through ``refs/main``). ``error`` is set when there is nothing to check.
    """
    where: dict[str, Any] = {
        "input": path, "model_dir": path, "layout": None, "repo_dir": None, "error": None,
    }  # fmt: skip
    try:
        info = os.stat(path)
    except OSError as error:
        where["error"] = f"{path}: {os_reason(error)}"
        return where
    if not stat.S_ISDIR(info.st_mode):
        where["error"] = f"{path} is not a directory"
        return where
    path = os.path.abspath(path)
    name = os.path.basename(path)
    if name.startswith("models--") and os.path.isdir(os.path.join(path, "snapshots")):
        snapshot = pick_snapshot(path)
        if snapshot is None:
            where["error"] = f"{path} has no snapshot to check"
            return where
        where.update(model_dir=snapshot, layout="hf-cache", repo_dir=path)
    elif os.path.basename(os.path.dirname(path)) == "snapshots":
        where.update(
            model_dir=path, layout="hf-cache", repo_dir=os.path.dirname(os.path.dirname(path))
        )
    elif os.path.isdir(os.path.join(path, ".cache", "huggingface")):
        where.update(model_dir=path, layout="local-dir")
    else:
        where.update(model_dir=path, layout="plain")
    return where


def pick_snapshot(repo_dir: str) -> str | None:
    """The snapshot ``refs/main`` points at, or the only snapshot there is."""
    snapshots = os.path.join(repo_dir, "snapshots")
    try:
        with open(os.path.join(repo_dir, "refs", "main")) as handle:
            revision = handle.read().strip()
        if os.path.isdir(os.path.join(snapshots, revision)):
            return os.path.join(snapshots, revision)
    except OSError:
        pass
    try:
        names = sorted(os.listdir(snapshots))
    except OSError:
        return None
    return os.path.join(snapshots, names[0]) if len(names) == 1 else None


def read_index(model_dir: str) -> tuple[dict[str, Any] | None, list[dict[str, str]]]:
    """The parsed index (``None`` if absent or unusable) and findings about it."""
    path = os.path.join(model_dir, INDEX_NAME)
    if not os.path.lexists(path):
        return None, []
    try:
        with open(path, "rb") as handle:
            # Bytes straight to the parser, which reads UTF-8 itself: decoding tens of MB to a
            # str first costs a sixth more (21 MB, 203,039 tensors: 147 ms against 174 ms).
            index = json.loads(handle.read())
    except OSError as error:
        return None, [
            finding(
                "error",
                INDEX_NAME,
                f"cannot read: {os_reason(error)}",
                "re-download the index file",
            )
        ]
    except ValueError as error:
        return None, [
            finding("error", INDEX_NAME, f"not valid JSON: {error}", "re-download the index file")
        ]
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or set(map(type, weight_map.values())) - {str}:
        return None, [
            finding(
                "error",
                INDEX_NAME,
                "has no weight_map of tensor -> file",
                "re-download the index file",
            )
        ]
    return index, []


def list_folder(folder: str) -> list[str]:
    """The sorted names in a folder, none when it cannot be read: listed once for all the
    parts of the check (tens of thousands of names take milliseconds to list)."""
    try:
        return sorted(os.listdir(folder))
    except OSError:
        return []


def shards_on_disk(names: list[str]) -> list[str]:
    """The ``*.safetensors`` entries among a folder's names."""
    return [n for n in names if n.endswith(".safetensors")]


# --- one shard ----------------------------------------------------------------------------


def read_header(path: str, size: int) -> tuple[int, dict[str, Any] | None, str, str]:
    """Read a safetensors header.

    Returns:
        ``(header length, header or None, status, detail)``; status is ``ok``, ``truncated``,
        ``corrupt`` or ``unreadable``.
    """
    if size < 8:
        return 0, None, "truncated", f"{size} bytes, shorter than the 8-byte header length"
    try:
        # Plain descriptor reads: a buffered file object costs more than the read itself,
        # thousands of times over (11,900 shards: 87 against 104 ms with the stat before).
        fd = os.open(path, os.O_RDONLY)
        try:
            head = os.pread(fd, FIRST_READ, 0)
            if len(head) < 8:
                return 0, None, "truncated", f"{len(head)} bytes, shorter than the 8-byte header"
            (length,) = struct.unpack_from("<Q", head)
            if length > MAX_HEADER:
                return length, None, "corrupt", f"header length {length} is over the 100 MB limit"
            if 8 + length > size:
                return (
                    length,
                    None,
                    "truncated",
                    (f"header length {length} goes beyond the file's {size} bytes"),
                )
            raw = head[8 : 8 + length]
            if len(raw) < length:
                raw += os.pread(fd, length - len(raw), len(head))
        finally:
            os.close(fd)
    except OSError as error:
        return 0, None, "unreadable", os_reason(error)
    try:
        text = raw.decode("utf-8")
        if not text.startswith("{"):
            raise ValueError("does not start with '{'")
        header = json.loads(text)
        if not isinstance(header, dict):
            raise ValueError("is not an object")
    except ValueError as error:
        return length, None, "corrupt", f"header is not valid JSON ({error})"
    return length, header, "ok", ""


def layout_of(header: dict[str, Any]) -> tuple[int, str]:
    """Check tensor entries and return ``(end of data, problem)``; problem is '' when fine."""
    return sound_layout(header) or layout_problem(header)


def sound_layout(header: dict[str, Any]) -> tuple[int, str] | None:
    """``(end of data, '')`` for a header whose every entry is plainly right, else None.

    The common case in fewer steps than :func:`layout_problem`, which runs when anything is
    off and says what: half a million tensors for a large MoE make the steps count.
    """
    spans: list[tuple[int, int]] = []
    append = spans.append
    bits_of = DTYPE_BITS.get
    prod = math.prod
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            begin, end = entry["data_offsets"]
            count = prod(entry["shape"])
            bits = bits_of(entry.get("dtype"))
        except (KeyError, TypeError, ValueError, AttributeError):
            return None
        if type(begin) is not int or type(end) is not int or type(count) is not int:
            return None
        if begin > end or (bits is not None and (count * bits + 7) // 8 != end - begin):
            return None
        append((begin, end))
    if not spans:
        return 0, ""
    spans.sort()
    begins = [span[0] for span in spans]
    ends = [span[1] for span in spans]
    if begins[0] != 0 or begins[1:] != ends[:-1]:
        return None
    return ends[-1], ""


def layout_problem(header: dict[str, Any]) -> tuple[int, str]:
    """:func:`layout_of` step by step, naming the first tensor that is not right."""
    spans = []
    bits_of = DTYPE_BITS.get
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            begin, end = entry["data_offsets"]
            if not (isinstance(begin, int) and isinstance(end, int) and 0 <= begin <= end):
                raise ValueError
            count = math.prod(map(int, entry["shape"]))
        except (KeyError, TypeError, ValueError):
            return 0, f"tensor {name} has no valid dtype/shape/data_offsets"
        bits = bits_of(entry.get("dtype"))
        if bits is not None and (count * bits + 7) // 8 != end - begin:
            return (
                0,
                f"tensor {name}: {entry.get('dtype')} x {entry['shape']} does not fill "
                f"its {end - begin} bytes",
            )
        spans.append((begin, end, name))
    spans.sort()
    position = 0
    for begin, end, name in spans:
        if begin < position:
            return 0, f"tensor {name} overlaps the previous tensor (offset {begin} < {position})"
        if begin > position:
            return 0, f"gap of {begin - position} bytes before tensor {name}"
        position = end
    return position, ""


def inspect_shard(model_dir: str, name: str) -> dict[str, Any]:
    """Everything about one shard: status, sizes; its tensor names (``header``) are dropped
    before output."""
    path = os.path.join(model_dir, name)
    row: dict[str, Any] = {
        "file": name, "status": "ok", "size": None, "expected_size": None,
        "header_len": None, "tensors": None, "detail": "", "header": None,
    }  # fmt: skip
    try:
        info = os.stat(path)
    except OSError as error:
        missing = error.errno == errno.ENOENT
        row["status"] = "missing" if missing else "unreadable"
        row["detail"] = os_reason(error)
        if missing and os.path.islink(path):
            row["detail"] = f"broken link to {os.readlink(path)}"
        elif missing:
            row["detail"] = ""
        return row
    if not stat.S_ISREG(info.st_mode):
        row.update(status="corrupt", detail="not a regular file")
        return row
    row["size"] = info.st_size
    length, header, status, detail = read_header(path, info.st_size)
    row.update(header_len=length or None, status=status, detail=detail)
    if header is None:
        return row
    end, problem = layout_of(header)
    row["tensors"] = len(header) - ("__metadata__" in header)
    # The header goes with the row for the caller to match its tensor names (its keys)
    # against the index; callers drop it at once, so thousands are never kept.
    row["header"] = header
    if problem:
        row.update(status="corrupt", detail=problem)
        return row
    expected = 8 + length + end
    row["expected_size"] = expected
    if info.st_size < expected:
        row.update(
            status="truncated",
            detail=f"{info.st_size} of {expected} bytes ({100.0 * info.st_size / expected:.1f}%)",
        )
    elif info.st_size > expected:
        row.update(
            status="corrupt",
            detail=f"{info.st_size - expected} bytes more than the header accounts for",
        )
    return row


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
    expected = expected_shards(index, on_disk)
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


# Hugging Face's shard names count the series: model-00050-of-00119.safetensors.
SERIES = re.compile(r"^(?P<stem>.*)-(?P<number>\d+)-of-(?P<total>\d+)\.safetensors$")


def expected_shards(index: dict[str, Any] | None, on_disk: list[str]) -> list[str]:
    """Shards the index names; without an index, the ones on disk and every other member of
    the numbered series they belong to (``-00050-of-00119`` says there are 119), so that a
    missing shard is missing, not forgotten."""
    if index is None:
        return sorted(set(on_disk) | set(series_members(on_disk)))
    return sorted(set(index["weight_map"].values()))


def series_members(names: list[str]) -> list[str]:
    """Every name of each ``<stem>-NNNNN-of-MMMMM.safetensors`` series among ``names``."""
    members = []
    for stem, width, total in sorted({series_of(n) for n in names} - {None}):
        members += [
            f"{stem}-{i:0{width}d}-of-{total:0{width}d}.safetensors" for i in range(1, total + 1)
        ]
    return members


def series_of(name: str) -> Any:
    """(stem, digits, total) of a numbered shard name, or None."""
    match = SERIES.match(name)
    if match is None:
        return None
    width = len(match.group("total"))
    total = int(match.group("total"))
    # A name claiming a huge series is not believed: real checkpoints have at most thousands.
    if total < 1 or total > 100000 or len(match.group("number")) != width:
        return None
    return match.group("stem"), width, total


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
    """A forked process inspecting chunks of the shards: it answers its rows as one JSON
    line on a pipe, then ends."""

    def __init__(self, pid: int, answers: Any) -> None:
        self.pid = pid
        self.answers = answers

    def rows(self) -> list[dict[str, Any]] | None:
        """The worker's rows, once it has ended; None when it failed."""
        try:
            rows = json.loads(self.answers.readline() or b"null")
        except ValueError:
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
        out.write(json.dumps(rows).encode() + b"\n")


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


def file_size(path: str) -> int | None:
    """Size of a file, or None if it cannot be read."""
    try:
        return os.stat(path).st_size
    except OSError:
        return None


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
    listed = [(model_dir, listing)] + [(folder, list_folder(folder)) for folder in folders]
    for folder, names in listed:
        for name in names:
            if name.endswith(".incomplete") or name.endswith(".lock"):
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


# --- hash ---------------------------------------------------------------------------------


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


# --- progress -----------------------------------------------------------------------------


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
