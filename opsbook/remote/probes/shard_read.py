"""Part of the ``download`` probe: where a checkpoint is, which shards it should have, and
what one shard's safetensors header says of it.

Standard library only: :func:`opsbook.remote.probes.assemble` joins this text into the
probe's program (the probe imports it relatively; see ``probe_body``), so that it runs on
the host's own ``python3`` (3.8+) as one program.
"""

from __future__ import annotations

import errno
import json
import math
import os
import re
import stat
import struct

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
DTYPE_BITS = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8, "I16": 16,
    "U16": 16, "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32, "F64": 64,
    "I64": 64, "U64": 64, "F4": 4,
}  # fmt: skip


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

# The start of the error of a model folder that exists but cannot be opened.
UNREADABLE = "cannot read the checkpoint"


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
    try:
        # Opening the folder is what a listing needs: a folder the user cannot read would
        # otherwise list as empty, "no checkpoint shards found".
        os.scandir(where["model_dir"]).close()
    except OSError as error:
        where["error"] = f"{UNREADABLE}: {where['model_dir']}: {os_reason(error)}"
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
        header = parse_object(text)
        if not isinstance(header, dict):
            raise ValueError("is not an object")
    except ValueError as error:
        return length, None, "corrupt", f"header is not valid JSON ({error})"
    return length, header, "ok", ""


# The scanner of the decoder json.loads uses (its defaults), called without json.loads' own
# steps: they cost a twentieth of parsing a header, thousands of times over.
SCAN = json.JSONDecoder().scan_once  # type: ignore[attr-defined]  # set in __init__, untyped
# What JSON counts as white space (json.decoder.WHITESPACE): a header is padded with spaces.
JSON_SPACE = " \t\n\r"


def parse_object(text: str) -> Any:
    """``json.loads(text)`` for a text that starts with ``{``: the decoder's scanner called
    directly; anything it does not take whole goes to ``json.loads``, for its error."""
    try:
        value, end = SCAN(text, 0)
    except (StopIteration, ValueError):
        return json.loads(text)
    if end != len(text) and text[end:].strip(JSON_SPACE):
        return json.loads(text)
    return value


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


def file_size(path: str) -> int | None:
    """Size of a file, or None if it cannot be read."""
    try:
        return os.stat(path).st_size
    except OSError:
        return None
