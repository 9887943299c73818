"""Download check (01_download_check): is the checkpoint on the host complete and readable?

Every question goes to the host as one run of the ``download`` probe, whatever the number of
shards: :func:`check_download` (index, sizes, headers, partial files, config and tokenizer
files), :func:`hash_shards` (full sha256, in batches so progress can be shown between them)
and :func:`watch_download` (bytes present over time, rate and ETA while a download runs).
Nothing here changes the host; the hash cache is written only where the caller asks.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from opsbook.core.results import Finding, Result, Table
from opsbook.remote.protocol import RemoteHost

PROBE = "download"
CHECK_TIMEOUT = 300.0
# One batch reads ``batch_size`` shards of ~4.6 GB from disk; allow slow disks.
HASH_BATCH_TIMEOUT = 3600.0
RATE_WINDOW = 60.0
STALL_AFTER = 120.0
SOURCE = "safetensors format (huggingface/safetensors) and huggingface_hub download layouts"

SHARD_COLUMNS = ("file", "status", "size", "expected_size", "header_len", "tensors", "detail")
HASH_COLUMNS = ("file", "status", "sha256", "expected", "source", "cached")
PROGRESS_COLUMNS = ("file", "state", "bytes", "expected")


@dataclass(frozen=True)
class HashProgress:
    """Where a hash run stands after a batch of shards."""

    files_done: int
    files_total: int
    bytes_done: int
    bytes_total: int
    elapsed: float

    def line(self) -> str:
        """One progress line, e.g. for a headless run's log."""
        rate = self.bytes_done / self.elapsed if self.elapsed > 0 else 0.0
        return (
            f"hashed {self.files_done}/{self.files_total} shards, "
            f"{format_bytes(self.bytes_done)} of {format_bytes(self.bytes_total)} "
            f"({format_bytes(rate)}/s)"
        )


@dataclass(frozen=True)
class DownloadProgress:
    """One look at a download in progress."""

    elapsed: float
    bytes_present: int
    bytes_expected: int
    expected_estimated: bool
    shards: int
    done: int
    partial: int
    missing: int
    rate: float | None
    eta: float | None
    stalled_for: float

    @property
    def complete(self) -> bool:
        return self.shards > 0 and self.done == self.shards

    @property
    def fraction(self) -> float:
        return min(self.bytes_present / self.bytes_expected, 1.0) if self.bytes_expected else 0.0

    def line(self) -> str:
        """One progress line: shards, bytes, rate and time left."""
        rate = f"{format_bytes(self.rate)}/s" if self.rate is not None else "rate unknown"
        eta = f", about {format_duration(self.eta)} left" if self.eta else ""
        about = "~" if self.expected_estimated else ""
        return (
            f"{self.done}/{self.shards} shards done, {self.partial} partial, "
            f"{self.missing} missing; {format_bytes(self.bytes_present)} of "
            f"{about}{format_bytes(self.bytes_expected)} ({self.fraction:.1%}), {rate}{eta}"
        )


# --- check --------------------------------------------------------------------------------


def check_download(
    host: RemoteHost, model_path: str, *, timeout: float = CHECK_TIMEOUT
) -> CheckResult:
    """Check a model directory or hub cache snapshot on ``host`` in one round trip.

    Args:
        host: the host holding the checkpoint.
        model_path: a ``--local-dir`` directory, a cache snapshot, or a cache
            ``models--org--name`` directory.
        timeout: seconds for the probe.

    Returns:
        The check's result, with its ``summary``, ``shards``, ``files``, ``partials``,
        ``index`` and ``where``; each problem is a finding naming its file.

    Raises:
        ProbeError: the probe could not run on the host.
    """
    answer = host.probe(PROBE, {"op": "check", "path": model_path}, timeout=timeout)
    return check_result(answer)


# The download probe's ``check`` answer (opsbook/remote/probes/download.py ``check``), parsed
# once here, where it is read: the step and the tests that run the probe read these types.


@dataclass(frozen=True)
class Where:
    """Where the checkpoint is: the path asked, the model folder found, and its layout."""

    input: str
    model_dir: str
    layout: str | None = None
    repo_dir: str | None = None
    error: str | None = None

    @classmethod
    def parse(cls, answer: Mapping[str, Any]) -> Where:
        return cls(
            input=str(answer["input"]),
            model_dir=str(answer["model_dir"]),
            layout=answer.get("layout"),
            repo_dir=answer.get("repo_dir"),
            error=answer.get("error"),
        )


@dataclass(frozen=True)
class IndexFacts:
    """What the checkpoint's index says (its ``total_size`` is reported, never trusted)."""

    present: bool
    total_size: int | None
    tensors: int
    shards: int

    @classmethod
    def parse(cls, answer: Mapping[str, Any] | None) -> IndexFacts | None:
        if answer is None:
            return None
        return cls(
            present=bool(answer["present"]),
            total_size=answer.get("total_size"),
            tensors=int(answer["tensors"]),
            shards=int(answer["shards"]),
        )


class ShardRow(NamedTuple):
    """One shard as the check read it: its status, sizes and safetensors header.

    A named tuple, not a frozen dataclass: a checkpoint of 11,900 shards makes 11,900 of them
    at every check, 3.5 ms so against 11.5 ms (a frozen dataclass sets each field through
    ``object.__setattr__``)."""

    file: str
    status: str
    size: int | None
    expected_size: int | None
    header_len: int | None
    tensors: int | None
    detail: str | None

    @classmethod
    def parse(cls, row: Mapping[str, Any]) -> ShardRow:
        return cls(
            file=str(row["file"]),
            status=str(row["status"]),
            size=row.get("size"),
            expected_size=row.get("expected_size"),
            header_len=row.get("header_len"),
            tensors=row.get("tensors"),
            detail=row.get("detail"),
        )

    def cells(self) -> list[Any]:
        return list(self)


@dataclass(frozen=True)
class CheckSummary:
    """The shards counted by status (each problem status lists its files) and the bytes."""

    shards: int
    ok: int
    missing: list[str] = field(default_factory=list)
    truncated: list[str] = field(default_factory=list)
    corrupt: list[str] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    bytes_present: int = 0
    bytes_expected: int = 0
    expected_estimated: bool = False
    index_total_size: int | None = None

    @classmethod
    def parse(cls, answer: Mapping[str, Any]) -> CheckSummary:
        lists = ("missing", "truncated", "corrupt", "unreadable", "unexpected")
        return cls(
            shards=int(answer["shards"]),
            ok=int(answer["ok"]),
            **{key: list(answer.get(key) or []) for key in lists},
            bytes_present=int(answer["bytes_present"]),
            bytes_expected=int(answer["bytes_expected"]),
            expected_estimated=bool(answer.get("expected_estimated")),
            index_total_size=answer.get("index_total_size"),
        )


def shard_rows(table: Mapping[str, Any]) -> list[ShardRow]:
    """The probe's shard table (``columns``, ``rows``) as ShardRows. Its columns are
    SHARD_COLUMNS, ShardRow's fields in their order: each row is the fields' values as they
    stand (11,900 rows in 3.5 ms, against 22 ms by name)."""
    columns = tuple(table["columns"])
    if columns == SHARD_COLUMNS:
        return list(map(ShardRow._make, table["rows"]))
    return [ShardRow.parse(dict(zip(columns, row, strict=True))) for row in table["rows"]]


@dataclass(frozen=True)
class CheckAnswer:
    """The download probe's whole ``check`` answer."""

    where: Where
    index: IndexFacts | None
    summary: CheckSummary
    shards: list[ShardRow]
    files: list[dict[str, Any]]
    partials: list[dict[str, Any]]
    findings: list[Finding]

    @classmethod
    def parse(cls, answer: Mapping[str, Any]) -> CheckAnswer:
        return cls(
            where=Where.parse(answer["where"]),
            index=IndexFacts.parse(answer["index"]),
            summary=CheckSummary.parse(answer["summary"]),
            shards=shard_rows(answer["shards"]),
            files=list(answer["files"]),
            partials=list(answer["partials"]),
            findings=[to_finding(item) for item in answer["findings"]],
        )


@dataclass(kw_only=True, repr=False)
class CheckResult(Result):
    """The download check's result, with what the probe found."""

    where: Where
    index: IndexFacts | None
    summary: CheckSummary
    shards: list[ShardRow]
    files: Table
    partials: list[dict[str, Any]]

    def shards_table(self) -> Table:
        return Table(SHARD_COLUMNS, [row.cells() for row in self.shards])


# How the probe's error for a model folder that cannot be opened begins (its
# shard_read.UNREADABLE; the probe runs on the host, from its own file).
UNREADABLE = "cannot read the checkpoint"


def check_result(answer: Mapping[str, Any]) -> CheckResult:
    """Turn the probe's ``check`` answer into a Result."""
    return result_of(CheckAnswer.parse(answer))


def result_of(parsed: CheckAnswer) -> CheckResult:
    """The check's Result, from its parsed answer."""
    ok = not any(f.is_problem for f in parsed.findings)
    # A folder that cannot be read has no shards to count: why is the message, not "no shards".
    error = parsed.where.error or ""
    message = error if error.startswith(UNREADABLE) else check_message(parsed.summary, ok)
    return CheckResult(
        ok,
        message,
        findings=parsed.findings,
        where=parsed.where,
        index=parsed.index,
        summary=parsed.summary,
        shards=parsed.shards,
        files=Table.from_records(parsed.files, ("file", "status", "detail")),
        partials=parsed.partials,
    )


@dataclass(frozen=True)
class ShardCounts:
    """How many shards of a checked checkpoint are in which state, and its size."""

    shards: int
    ok: int
    missing: int
    truncated: int
    corrupt: int
    unreadable: int
    bytes_expected: int


def shard_counts(check: CheckResult) -> ShardCounts:
    """The counts of a :func:`check_download` result."""
    summary = check.summary
    return ShardCounts(
        shards=summary.shards,
        ok=summary.ok,
        missing=len(summary.missing),
        truncated=len(summary.truncated),
        corrupt=len(summary.corrupt),
        unreadable=len(summary.unreadable),
        bytes_expected=summary.bytes_expected,
    )


def check_message(summary: CheckSummary, ok: bool) -> str:
    """One sentence on the state of the shards and the bytes present."""
    total = summary.shards
    sizes = f"{format_bytes(summary.bytes_present)} of {format_bytes(summary.bytes_expected)}"
    if total == 0:
        return "no checkpoint shards found"
    if ok and summary.ok == total:
        return f"all {total} shards complete and readable ({sizes})"
    problems = [
        f"{len(files)} {key}"
        for key, files in (
            ("missing", summary.missing),
            ("truncated", summary.truncated),
            ("corrupt", summary.corrupt),
            ("unreadable", summary.unreadable),
        )
        if files
    ]
    if not problems:
        return f"{summary.ok} of {total} shards ok ({sizes}); see the findings"
    return f"{summary.ok} of {total} shards ok; {', '.join(problems)} ({sizes} present)"


def to_finding(item: Mapping[str, Any]) -> Finding:
    """A probe's JSON finding as a :class:`Finding`."""
    return Finding(
        item["severity"], item["subject"], item["message"], item.get("remedy", ""), SOURCE
    )


# --- hash ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class HashRow:
    """One shard's hash (the download probe's ``hash`` answer, opsbook/remote/probes/
    shard_hash.py): its status (``match``, ``mismatch``, ``no-reference``, ``unreadable``),
    the reference it was compared with and where that came from."""

    file: str
    status: str
    sha256: str | None = None
    expected: str | None = None
    source: str | None = None
    cached: bool = False
    bytes: int = 0
    error: str = ""

    @classmethod
    def parse(cls, row: Mapping[str, Any]) -> HashRow:
        return cls(
            file=str(row["file"]),
            status=str(row["status"]),
            sha256=row.get("sha256"),
            expected=row.get("expected"),
            source=row.get("source"),
            cached=bool(row.get("cached")),
            bytes=int(row.get("bytes") or 0),
            error=str(row.get("error") or ""),
        )

    def cells(self) -> list[Any]:
        return [getattr(self, column) for column in HASH_COLUMNS]


def hash_rows(answer: Mapping[str, Any]) -> list[HashRow]:
    """The rows of one ``hash`` answer."""
    return [HashRow.parse(row) for row in answer["files"]]


def hash_shards(
    host: RemoteHost,
    model_path: str,
    *,
    manifest: Mapping[str, str] | None = None,
    cache_path: str | None = None,
    progress: Callable[[HashProgress], None] | None = None,
    batch_size: int = 8,
    workers: int | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> HashResult | CheckResult:
    """sha256 every shard on the host and compare with the known hashes.

    References, in order: ``manifest``, the hub cache blob name (the sha256 of LFS files),
    the local-dir metadata etag. Shards go in batches of ``batch_size`` per probe run, each
    hashed on several cores, and ``progress`` is called after each batch.

    Args:
        host: the host holding the checkpoint.
        model_path: as for :func:`check_download`.
        manifest: ``{file name: sha256}`` from elsewhere (a release note, another host).
        cache_path: a file on the host remembering hashes by size and mtime, so a second
            run skips unchanged shards. Nothing is written on the host without it.
        progress: called with a :class:`HashProgress` after each batch.
        batch_size: shards per probe run.
        workers: hashing threads on the host (default: its CPU count).
        clock: time source (for tests).

    Returns:
        The hashes (``files``, a Table, ``rows`` and ``counts``), or the check's result when
        the path holds no checkpoint.

    Raises:
        ProbeError: the probe could not run on the host.
    """
    answer = host.probe(PROBE, {"op": "check", "path": model_path}, timeout=CHECK_TIMEOUT)
    listing = CheckAnswer.parse(answer)
    if listing.where.error:
        return result_of(listing)
    names = [row.file for row in listing.shards if row.status != "unexpected"]
    sizes = {row.file: row.size or 0 for row in listing.shards}
    rows: list[HashRow] = []
    started = clock()
    for batch in batched(names, batch_size):
        args: dict[str, Any] = {"op": "hash", "path": model_path, "files": batch}
        args["manifest"] = dict(manifest or {})
        if cache_path:
            args["cache_path"] = cache_path
        if workers:
            args["workers"] = workers
        rows += hash_rows(host.probe(PROBE, args, timeout=HASH_BATCH_TIMEOUT))
        if progress is not None:
            done = sum(sizes.get(row.file, 0) for row in rows)
            progress(
                HashProgress(len(rows), len(names), done, sum(sizes.values()), clock() - started)
            )
    return hash_result(rows)


@dataclass(kw_only=True, repr=False)
class HashResult(Result):
    """The shards' hashes: a row per shard (the download probe's ``hash`` rows), a table of
    them, and how many are in each status."""

    files: Table
    rows: list[HashRow]
    counts: dict[str, int]


def hash_result(rows: Sequence[HashRow]) -> HashResult:
    """Turn hash rows into a Result: errors for mismatches, a note for files without reference."""
    counts = count_by([row.status for row in rows])
    findings = [hash_finding(row) for row in rows if row.status != "match"]
    ok = not any(f.is_problem for f in findings) and bool(rows)
    parts = [f"{n} {status}" for status, n in sorted(counts.items())]
    message = f"{len(rows)} shards hashed: {', '.join(parts)}" if rows else "no shards to hash"
    files = Table(HASH_COLUMNS, [row.cells() for row in rows])
    return HashResult(ok, message, findings=findings, files=files, rows=list(rows), counts=counts)


def hash_finding(row: HashRow) -> Finding:
    """A finding for a shard whose hash does not match, or cannot be checked."""
    name = row.file
    if row.status == "mismatch":
        return Finding(
            "error",
            name,
            f"sha256 {row.sha256} differs from {row.expected} ({row.source})",
            "delete this shard and download it again",
            SOURCE,
        )
    if row.status == "unreadable":
        return Finding(
            "error",
            name,
            f"cannot hash: {row.error}",
            "check the file exists and is readable",
            SOURCE,
        )
    return Finding(
        "info",
        name,
        f"sha256 {row.sha256}: no reference hash to compare with",
        "pass a manifest of known hashes to compare",
        SOURCE,
    )


# --- watch --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProgressTotals:
    """Shards per state, and bytes present against bytes expected (estimated for the shards
    whose header is not there yet when ``expected_estimated``)."""

    shards: int
    done: int
    partial: int
    missing: int
    bytes_present: int
    bytes_expected: int
    expected_estimated: bool

    @classmethod
    def parse(cls, answer: Mapping[str, Any]) -> ProgressTotals:
        return cls(
            shards=int(answer["shards"]),
            done=int(answer["done"]),
            partial=int(answer["partial"]),
            missing=int(answer["missing"]),
            bytes_present=int(answer["bytes_present"]),
            bytes_expected=int(answer["bytes_expected"]),
            expected_estimated=bool(answer["expected_estimated"]),
        )


@dataclass(frozen=True)
class ProgressRow:
    """One shard's state in a download: ``done``, ``partial`` or ``missing``; ``expected`` is
    its full size once its header is there."""

    file: str
    state: str
    bytes: int
    expected: int | None

    @classmethod
    def parse(cls, row: Mapping[str, Any]) -> ProgressRow:
        return cls(str(row["file"]), str(row["state"]), int(row["bytes"]), row.get("expected"))

    def cells(self) -> list[Any]:
        return [getattr(self, column) for column in PROGRESS_COLUMNS]


@dataclass(frozen=True)
class ProgressAnswer:
    """The download probe's ``progress`` answer (opsbook/remote/probes/download.py): each
    shard's state and the totals."""

    where: Where
    shards: list[ProgressRow]
    totals: ProgressTotals
    findings: list[Finding]

    @classmethod
    def parse(cls, answer: Mapping[str, Any]) -> ProgressAnswer:
        return cls(
            where=Where.parse(answer["where"]),
            shards=[ProgressRow.parse(row) for row in answer["shards"]],
            totals=ProgressTotals.parse(answer["totals"]),
            findings=[to_finding(item) for item in answer["findings"]],
        )


def watch_download(
    host: RemoteHost,
    model_path: str,
    *,
    interval: float = 5.0,
    timeout: float = 3600.0,
    on_update: Callable[[DownloadProgress], None] | None = None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> WatchResult:
    """Follow a download until every shard is complete or ``timeout`` passes.

    Args:
        host: the host the download runs on.
        model_path: as for :func:`check_download`.
        interval: seconds between looks (each look is one probe run).
        timeout: seconds to watch before giving up (the download keeps running).
        on_update: called with a :class:`DownloadProgress` after each look.
        sleep: how to wait (for tests).
        clock: time source (for tests).

    Returns:
        ok when the download is complete, with the ``samples`` (``(seconds, bytes present)``
        for plotting), the last look (``progress``) and the ``shards`` (a Table).

    Raises:
        ProbeError: the probe could not run on the host.
    """
    samples: list[tuple[float, int]] = []
    started = clock()
    while True:
        args = {"op": "progress", "path": model_path}
        snapshot = ProgressAnswer.parse(host.probe(PROBE, args, timeout=CHECK_TIMEOUT))
        samples.append((clock() - started, snapshot.totals.bytes_present))
        update = progress_from(snapshot.totals, samples)
        if on_update is not None:
            on_update(update)
        if update.complete or snapshot.where.error or samples[-1][0] >= timeout:
            break
        sleep(interval)
    return watch_result(snapshot, update, samples)


@dataclass(kw_only=True, repr=False)
class WatchResult(Result):
    """A watched download: bytes present over time, the last look, and each shard's state."""

    samples: list[tuple[float, int]]
    progress: DownloadProgress
    shards: Table


def watch_result(
    snapshot: ProgressAnswer, update: DownloadProgress, samples: list[tuple[float, int]]
) -> WatchResult:
    """The Result of a watch: complete or not, with a stall warning when bytes stopped."""
    findings = list(snapshot.findings)
    if not update.complete and update.stalled_for >= STALL_AFTER:
        findings.append(
            Finding(
                "warning",
                "download",
                f"no new bytes for {format_duration(update.stalled_for)}",
                "check that the download process is still running and the disk is not full",
                SOURCE,
            )
        )
    if update.complete:
        message = f"download complete: {update.line()}"
    else:
        message = f"download not complete after {format_duration(update.elapsed)}: {update.line()}"
    shards = Table(PROGRESS_COLUMNS, [row.cells() for row in snapshot.shards])
    return WatchResult(
        update.complete, message, findings=findings, samples=samples, progress=update, shards=shards
    )


def progress_from(totals: ProgressTotals, samples: Sequence[tuple[float, int]]) -> DownloadProgress:
    """A :class:`DownloadProgress` from the probe's totals and the samples so far."""
    rate = transfer_rate(samples)
    return DownloadProgress(
        elapsed=samples[-1][0] if samples else 0.0,
        bytes_present=totals.bytes_present,
        bytes_expected=totals.bytes_expected,
        expected_estimated=totals.expected_estimated,
        shards=totals.shards,
        done=totals.done,
        partial=totals.partial,
        missing=totals.missing,
        rate=rate,
        eta=eta_seconds(totals.bytes_present, totals.bytes_expected, rate),
        stalled_for=stalled_for(samples),
    )


def transfer_rate(
    samples: Sequence[tuple[float, int]], window: float = RATE_WINDOW
) -> float | None:
    """Bytes per second over the last ``window`` seconds of samples (None before two)."""
    if len(samples) < 2:
        return None
    end_time, end_bytes = samples[-1]
    recent = [s for s in samples if s[0] >= end_time - window]
    start_time, start_bytes = recent[0] if len(recent) >= 2 else samples[-2]
    if end_time <= start_time:
        return None
    return max(end_bytes - start_bytes, 0) / (end_time - start_time)


def eta_seconds(present: int, expected: int, rate: float | None) -> float | None:
    """Seconds left at ``rate`` (0 when done; None when the rate is unknown or zero)."""
    if present >= expected > 0:
        return 0.0
    if not rate or rate <= 0:
        return None
    return (expected - present) / rate


def stalled_for(samples: Sequence[tuple[float, int]]) -> float:
    """Seconds since the byte count last changed."""
    if not samples:
        return 0.0
    end_time, end_bytes = samples[-1]
    since = end_time
    for when, present in reversed(samples):
        if present != end_bytes:
            break
        since = when
    return end_time - since


# --- small helpers ------------------------------------------------------------------------


def batched(items: Sequence[str], size: int) -> list[list[str]]:
    """``items`` in consecutive lists of at most ``size`` (at least 1)."""
    size = max(size, 1)
    return [list(items[i : i + size]) for i in range(0, len(items), size)]


def count_by(values: Sequence[str]) -> dict[str, int]:
    """How many times each value occurs."""
    counts: dict[str, int] = {}
    for value in values:
        counts[value] = counts.get(value, 0) + 1
    return counts


def format_bytes(count: float | None) -> str:
    """Bytes in decimal units, as download tools and disk vendors count them (540 GB)."""
    if count is None:
        return "?"
    value = float(count)
    for unit in ("B", "kB", "MB", "GB"):
        if abs(value) < 1000:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{value:.1f} TB"


def format_duration(seconds: float | None) -> str:
    """A short human duration: ``45 s``, ``3 min 20 s``, ``2 h 05 min``."""
    if seconds is None:
        return "?"
    whole = int(round(seconds))
    if whole < 60:
        return f"{whole} s"
    if whole < 3600:
        return f"{whole // 60} min {whole % 60:02d} s"
    return f"{whole // 3600} h {whole % 3600 // 60:02d} min"
