"""01_download_check over real SSH to the rehearsal host: the check in one round trip, both
layouts, every kind of bad input named by file, full hashes with a resumable cache, and a
download in progress watched until complete. Nothing is written on the host unless a hash
cache is asked for.

Checkpoints are made here as root under the sandbox user's home and handed to that user, so
that the probe meets real permissions.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import stat
import struct
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from opsbook.core.results import Result
from opsbook.rehearsal import checkpoint
from opsbook.rehearsal.checkpoint import INDEX_NAME, make_checkpoint
from opsbook.rehearsal.sandbox import Sandbox
from opsbook.remote.hosts import Host
from opsbook.steps import plots, shard_check
from opsbook.steps.shard_check import DownloadProgress, HashProgress

pytestmark = pytest.mark.integration

SMALL: dict[str, Any] = {"shards": 3, "shard_bytes": 50_000}
Listing = dict[str, tuple[int, int, int, int]]


@pytest.fixture(scope="module")
def host(sandbox: Sandbox) -> Iterator[Host]:
    with Host(sandbox.host_spec()) as connected:
        yield connected


@pytest.fixture(scope="module")
def root(sandbox: Sandbox) -> Iterator[Path]:
    """A folder of this module's checkpoints in the sandbox user's home."""
    folder = Path(tempfile.mkdtemp(prefix="ckpt-", dir=sandbox.home))
    folder.chmod(0o755)
    give_to(sandbox, folder)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def place(sandbox: Sandbox, root: Path, request: pytest.FixtureRequest) -> Path:
    """A fresh folder for one test, owned by the sandbox user."""
    folder = Path(tempfile.mkdtemp(prefix=request.node.name[:40] + "-", dir=root))
    folder.chmod(0o755)
    give_to(sandbox, folder)
    return folder


def give_to(box: Sandbox, path: Path) -> None:
    """Hand a tree to the sandbox's login user (only root can, and only root needs to)."""
    if os.geteuid() != 0:
        return
    owner = pwd.getpwnam(box.user)
    for folder, dirs, files in os.walk(path):
        os.chown(folder, owner.pw_uid, owner.pw_gid, follow_symlinks=False)
        for name in dirs + files:
            os.chown(os.path.join(folder, name), owner.pw_uid, owner.pw_gid, follow_symlinks=False)


def make(box: Sandbox, where: Path, *, layout: str = "local-dir", **options: Any) -> Path:
    """A synthetic checkpoint under ``where``, owned by the sandbox user; its model dir."""
    target = where / ("hub" if layout == "hf-cache" else "Kimi-K2.5-NVFP4")
    model = make_checkpoint(target, layout=layout, **options)
    give_to(box, where)
    return model


def listing(top: Path) -> Listing:
    """Every entry under ``top`` with its mode, owner, size and mtime (not atime: reads set it)."""
    seen: Listing = {}
    for folder, dirs, files in os.walk(top):
        for name in dirs + files:
            info = os.lstat(os.path.join(folder, name))
            seen[os.path.join(folder, name)] = (
                info.st_mode,
                info.st_uid,
                info.st_size,
                info.st_mtime_ns,
            )
    return seen


def shard(n: int, total: int = 3) -> str:
    return checkpoint.shard_name(n, total)


def problems(result: Result) -> dict[str, str]:
    return {f.subject: f.message for f in result.findings if f.is_problem}


# --- the check ------------------------------------------------------------------------------


def test_default_119_shards_check_ok_in_one_round_trip(
    sandbox: Sandbox, host: Host, place: Path
) -> None:
    model = make(sandbox, place)
    before = len(host.journal)
    result = shard_check.check_download(host, str(model))
    assert len(host.journal) == before + 1
    assert result.ok, result
    assert result.message.startswith("all 119 shards complete and readable")
    assert result.summary.ok == 119
    assert result.summary.bytes_present > 500e9


@pytest.mark.parametrize("layout", ["local-dir", "hf-cache"])
def test_both_layouts_and_damaged_shards_named(
    sandbox: Sandbox, host: Host, place: Path, layout: str
) -> None:
    model = make(sandbox, place, layout=layout, shards=5, shard_bytes=100_000)
    good = shard_check.check_download(host, str(model))
    assert good.ok, good
    assert good.where.layout == layout
    if layout == "hf-cache":
        repo = model.parent.parent
        assert shard_check.check_download(host, str(repo)).where.model_dir == str(model)
    checkpoint.truncate_shard(model, 2, 60_000)
    checkpoint.corrupt_header(model, 4, "not-json")
    before = listing(place)
    result = shard_check.check_download(host, str(model))
    assert listing(place) == before
    assert not result.ok
    found = problems(result)
    assert set(found) == {shard(2, 5), shard(4, 5)}
    assert found[shard(2, 5)].startswith("truncated: 60000 of")
    assert found[shard(4, 5)].startswith("corrupt: header is not valid JSON")
    assert result.message.startswith("3 of 5 shards ok; 1 truncated, 1 corrupt")


def test_folder_with_spaces_and_quotes(sandbox: Sandbox, host: Host, place: Path) -> None:
    odd = place / 'it\'s a "quoted" $HOME `dir`'
    odd.mkdir()
    model = make(sandbox, odd, **SMALL)
    result = shard_check.check_download(host, str(model))
    assert result.ok, result
    assert result.where.model_dir == str(model)
    hashed = shard_check.hash_shards(host, str(model))
    assert hashed.ok and hashed.counts == {"match": 3}


def write_gap(model: Path, index: int) -> None:
    """Move the second tensor one byte later: a gap before it, the file size unchanged."""
    path = checkpoint.shard_path(model, index)
    with open(path, "r+b") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        header = json.loads(handle.read(length))
        header.pop("__metadata__")
        second = [name for name in header][1]
        begin, end = header[second]["data_offsets"]
        header[second]["data_offsets"] = [begin + 1, end + 1]
        text = json.dumps(header, separators=(",", ":")).encode()
        assert len(text) <= length
        handle.seek(8)
        handle.write(text + b" " * (length - len(text)))


def self_loop(path: Path) -> Path:
    """Make ``path`` a symlink to itself."""
    if path.exists() or path.is_symlink():
        path.unlink()
    path.symlink_to(path.name)
    return path


def absent(model: Path) -> Path:
    return model.parent / "no such dir"


def a_file(model: Path) -> Path:
    return model / "config.json"


def empty_dir(model: Path) -> Path:
    folder = model.parent / "empty"
    folder.mkdir()
    return folder


def index_not_json(model: Path) -> Path:
    (model / INDEX_NAME).write_text("{'weight_map': ")
    return model


def header_damage(kind: str) -> Callable[[Path], Path]:
    def damage(model: Path) -> Path:
        checkpoint.corrupt_header(model, 2, kind)
        return model

    return damage


def gap(model: Path) -> Path:
    write_gap(model, 2)
    return model


def no_permission(model: Path) -> Path:
    (model / shard(2)).chmod(0)
    return model


def path_loop(model: Path) -> Path:
    return self_loop(model.parent / "loop")


def shard_loop(model: Path) -> Path:
    self_loop(model / shard(2))
    return model


# Each case: the damage done to a fresh 3-shard checkpoint (returning the path to check), the
# subject of the expected error (None: that path itself) and part of its message.
BAD_INPUTS: dict[str, tuple[Callable[[Path], Path], str | None, str]] = {
    "missing path": (absent, None, "does not exist"),
    "not a directory": (a_file, None, "is not a directory"),
    "no index and no shards": (empty_dir, None, f"no {INDEX_NAME} and no *.safetensors files"),
    "index not JSON": (index_not_json, INDEX_NAME, "not valid JSON"),
    "header length beyond the file": (
        header_damage("length"),
        shard(2),
        "truncated: header length",
    ),
    "header not JSON": (header_damage("not-json"), shard(2), "corrupt: header is not valid JSON"),
    "offsets overlap": (header_damage("overlap"), shard(2), "overlaps the previous tensor"),
    "offsets leave a gap": (gap, shard(2), "gap of 1 bytes before"),
    "shard unreadable by permissions": (no_permission, shard(2), "unreadable: permission denied"),
    "path is a symlink loop": (path_loop, None, "symlink loop"),
    "shard is a symlink loop": (shard_loop, shard(2), "symlink loop"),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_is_a_finding_naming_the_file(
    sandbox: Sandbox, host: Host, place: Path, case: str
) -> None:
    damage, subject, message = BAD_INPUTS[case]
    model = make(sandbox, place, **SMALL)
    path = damage(model)
    give_to(sandbox, place)
    before = listing(place)
    result = shard_check.check_download(host, str(path))
    assert listing(place) == before
    assert not result.ok
    found = problems(result)
    expected = subject or str(path)
    assert expected in found, result
    assert message in found[expected]


# --- full hash ------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["local-dir", "hf-cache"])
def test_full_hash_flipped_byte_and_resumable_cache(
    sandbox: Sandbox, host: Host, place: Path, layout: str
) -> None:
    model = make(sandbox, place, layout=layout, shards=4, shard_bytes=2_000_000, hashes=True)
    before, calls = listing(place), len(host.journal)
    seen: list[HashProgress] = []
    first = shard_check.hash_shards(host, str(model), progress=seen.append, batch_size=2)
    assert first.ok, first
    assert first.counts == {"match": 4}
    assert len(host.journal) == calls + 3  # the listing, then two batches
    assert [(p.files_done, p.files_total) for p in seen] == [(2, 4), (4, 4)]
    assert seen[-1].bytes_done == seen[-1].bytes_total >= 8_000_000
    assert listing(place) == before

    cache = f"{sandbox.home}/{place.name}-hashes.json"
    warm = shard_check.hash_shards(host, str(model), cache_path=cache)
    assert warm.ok and not any(row.cached for row in warm.rows)

    flipped = checkpoint.shard_path(model, 3)
    with open(flipped, "r+b") as handle:
        handle.seek(-1, os.SEEK_END)
        handle.write(b"\x01")
    info = flipped.stat()
    # Coarse file-system clocks could leave the mtime as it was; a rewrite moves it.
    os.utime(flipped, ns=(info.st_atime_ns, info.st_mtime_ns + 1_000_000_000))

    again = shard_check.hash_shards(host, str(model), cache_path=cache)
    assert not again.ok
    assert set(problems(again)) == {shard(3, 4)}
    assert "differs from" in problems(again)[shard(3, 4)]
    cached = {row.file: row.cached for row in again.rows}
    assert cached == {shard(1, 4): True, shard(2, 4): True, shard(3, 4): False, shard(4, 4): True}
    Path(cache).unlink()


# --- watching a download --------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["local-dir", "hf-cache"])
def test_watch_a_download_in_progress_until_complete(
    sandbox: Sandbox, host: Host, place: Path, layout: str
) -> None:
    model = make(sandbox, place, layout=layout, shards=4, shard_bytes=300_000)
    total = shard_check.check_download(host, str(model)).summary.bytes_expected
    # The writer runs as root here; the files it makes must stay readable by the login user.
    umask = os.umask(0o022)
    try:
        pid = checkpoint.start_download_simulation(
            model, shards=[2, 3, 4], rate_bytes_per_s=600_000, step=0.05
        )
    finally:
        os.umask(umask)
    updates: list[DownloadProgress] = []
    try:
        during = shard_check.check_download(host, str(model))
        result = shard_check.watch_download(
            host, str(model), interval=0.25, timeout=30, on_update=updates.append
        )
    finally:
        checkpoint.stop_download_simulation(pid)
    assert not during.ok
    assert shard_check.check_download(host, str(model)).ok
    assert result.ok, result
    assert result.message.startswith("download complete: 4/4 shards done")
    samples = result.samples
    present = [b for _, b in samples]
    assert present == sorted(present) and present[0] < present[-1] == total
    assert len(samples) >= 3
    assert updates[0].done < 4 and (updates[0].partial or updates[0].missing)
    assert updates[-1].complete and updates[-1].eta == 0.0
    chart = plots.download_progress(samples, total)
    assert 'class="progress"' in chart._repr_svg_()


def test_unreadable_shard_mode_is_left_as_found(sandbox: Sandbox, host: Host, place: Path) -> None:
    model = make(sandbox, place, **SMALL)
    (model / shard(1)).chmod(0)
    hashed = shard_check.hash_shards(host, str(model))
    assert problems(hashed) == {shard(1): "cannot hash: permission denied"}
    assert stat.S_IMODE((model / shard(1)).stat().st_mode) == 0
