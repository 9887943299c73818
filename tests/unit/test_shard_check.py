import json
import os
import shutil
import stat
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from opsbook.core.results import Finding
from opsbook.rehearsal import checkpoint
from opsbook.rehearsal.checkpoint import make_checkpoint
from opsbook.remote import probes
from opsbook.remote.testing import FakeHost, local_probe
from opsbook.steps import shard_check
from opsbook.steps.shard_check import CheckAnswer, DownloadProgress, HashProgress

INDEX = "model.safetensors.index.json"


def LocalProber() -> FakeHost:
    """A host whose download probe runs with the local python3, as a host's python would."""
    return FakeHost(probes={"download": local_probe("download")})


def check(path: Path | str) -> CheckAnswer:
    return CheckAnswer.parse(probes.run_local("download", {"op": "check", "path": str(path)}))


def errors(answer: CheckAnswer) -> list[Finding]:
    return [f for f in answer.findings if f.severity == "error"]


def status_of(answer: CheckAnswer, name: str) -> str:
    return next(row.status for row in answer.shards if row.file == name)


def shard(n: int, total: int = 5) -> str:
    return checkpoint.shard_name(n, total)


def tree_state(root: Path) -> dict[str, tuple[int, int]]:
    state = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            info = os.lstat(os.path.join(folder, name))
            state[os.path.join(folder, name)] = (info.st_size, info.st_mtime_ns)
    return state


@pytest.fixture
def local(tmp_path: Path) -> Path:
    return make_checkpoint(tmp_path / "Kimi-K2.5-NVFP4", shards=5, shard_bytes=100_000)


@pytest.fixture
def cached(tmp_path: Path) -> Path:
    return make_checkpoint(tmp_path / "hub", shards=5, shard_bytes=100_000, layout="hf-cache")


# --- the probe's check ---------------------------------------------------------------------


def test_good_local_dir(local: Path) -> None:
    answer = check(local)
    assert answer.findings == []
    assert answer.where.layout == "local-dir"
    assert answer.summary.ok == 5
    assert answer.summary.bytes_present == answer.summary.bytes_expected == 500_000


@pytest.mark.parametrize("which", ["snapshot", "repo"])
def test_good_hf_cache(cached: Path, which: str) -> None:
    path = cached if which == "snapshot" else cached.parent.parent
    answer = check(path)
    assert answer.findings == []
    assert answer.where.layout == "hf-cache"
    assert answer.where.model_dir == str(cached)
    assert answer.summary.ok == 5


def test_default_119_shards_in_one_quick_probe(tmp_path: Path) -> None:
    model_dir = make_checkpoint(tmp_path / "full")
    started = time.monotonic()
    answer = check(model_dir)
    assert time.monotonic() - started < 5.0
    assert answer.findings == []
    assert answer.summary.ok == 119
    assert answer.summary.bytes_present > 500e9


def test_total_size_is_reported_never_failed_on(local: Path) -> None:
    index = json.loads((local / INDEX).read_text())
    index["metadata"]["total_size"] = 123
    (local / INDEX).write_text(json.dumps(index))
    answer = check(local)
    assert answer.findings == []
    assert answer.summary.index_total_size == 123


def test_missing_path(tmp_path: Path) -> None:
    answer = check(tmp_path / "nope")
    assert "does not exist" in errors(answer)[0].message


def test_not_a_directory(local: Path) -> None:
    answer = check(local / "config.json")
    assert "not a directory" in errors(answer)[0].message


def test_no_index_and_no_shards(tmp_path: Path) -> None:
    answer = check(tmp_path)
    assert "no model.safetensors.index.json and no *.safetensors" in errors(answer)[0].message


def test_index_not_json_falls_back_to_shards_on_disk(local: Path) -> None:
    (local / INDEX).write_text("{not json")
    answer = check(local)
    assert errors(answer)[0].subject == INDEX
    assert answer.summary.ok == 5


def test_index_not_utf8_is_not_valid_json_and_falls_back_to_shards_on_disk(local: Path) -> None:
    (local / INDEX).write_bytes(b'{"weight_map": {"a": "\xff\xfe"}}')
    answer = check(local)
    assert errors(answer)[0].subject == INDEX
    assert "not valid JSON" in errors(answer)[0].message
    assert answer.summary.ok == 5


def test_without_an_index_a_missing_shard_of_a_numbered_series_is_missing(tmp_path) -> None:
    # The case: index gone, shard 50 of 119 gone; the names say -of-00119.
    model_dir = make_checkpoint(tmp_path / "full")
    (model_dir / INDEX).unlink()
    (model_dir / shard(50, 119)).unlink()
    answer = check(model_dir)
    assert answer.summary.missing == [shard(50, 119)]
    assert (answer.summary.shards, answer.summary.ok) == (119, 118)
    assert any(f.subject == shard(50, 119) for f in errors(answer))
    result = shard_check.result_of(answer)
    assert not result.ok
    assert result.message.startswith("118 of 119 shards ok; 1 missing"), result.message


def test_a_series_name_claiming_a_huge_count_is_not_believed(tmp_path) -> None:
    model_dir = make_checkpoint(tmp_path / "m", shards=2, shard_bytes=10_000)
    (model_dir / INDEX).unlink()
    (model_dir / "model-00001-of-99999999.safetensors").write_bytes(b"")
    answer = check(model_dir)
    assert answer.summary.shards == 3


def test_missing_shard(local: Path) -> None:
    (local / shard(3)).unlink()
    answer = check(local)
    assert answer.summary.missing == [shard(3)]
    assert answer.summary.expected_estimated is True
    assert any(f.subject == shard(3) for f in errors(answer))


def test_truncated_shard(local: Path) -> None:
    checkpoint.truncate_shard(local, 2, 60_000)
    answer = check(local)
    assert answer.summary.truncated == [shard(2)]
    row = answer.shards[1]
    assert row.size == 60_000 and row.expected_size == 100_000


def test_header_length_beyond_file_size(local: Path) -> None:
    checkpoint.corrupt_header(local, 4, "length")
    answer = check(local)
    assert status_of(answer, shard(4)) == "truncated"
    assert "beyond the file" in errors(answer)[0].message


def test_huge_header_length_is_corrupt(local: Path) -> None:
    with open(local / shard(1), "r+b") as handle:
        handle.write((2**40).to_bytes(8, "little"))
    answer = check(local)
    assert status_of(answer, shard(1)) == "corrupt"


def test_header_not_json(local: Path) -> None:
    checkpoint.corrupt_header(local, 1, "not-json")
    answer = check(local)
    assert answer.summary.corrupt == [shard(1)]
    assert "not valid JSON" in errors(answer)[0].message


def test_overlapping_offsets(local: Path) -> None:
    checkpoint.corrupt_header(local, 5, "overlap")
    answer = check(local)
    assert answer.summary.corrupt == [shard(5)]
    assert "overlaps" in errors(answer)[0].message


def test_tensor_in_index_but_not_in_header(local: Path) -> None:
    index = json.loads((local / INDEX).read_text())
    index["weight_map"]["language_model.model.layers.7.mlp.experts.9.up_proj.weight"] = shard(2)
    (local / INDEX).write_text(json.dumps(index))
    answer = check(local)
    assert answer.summary.corrupt == [shard(2)]
    assert "experts.9.up_proj.weight" in errors(answer)[0].message


def test_unexpected_shard(local: Path) -> None:
    shutil.copy(local / shard(1), local / "model-00006-of-00006.safetensors")
    answer = check(local)
    assert answer.summary.unexpected == ["model-00006-of-00006.safetensors"]
    assert answer.summary.shards == 5
    assert not errors(answer)


@pytest.fixture
def world_readable_dir() -> Iterator[Path]:
    # pytest's own tmp dirs are private to root, so another user could not even look inside.
    folder = Path(tempfile.mkdtemp(prefix="opsbook-perm-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder)


def test_unreadable_shard(world_readable_dir: Path, tmp_path: Path) -> None:
    model_dir = make_checkpoint(world_readable_dir / "m", shards=3, shard_bytes=50_000)
    (model_dir / shard(2, 3)).chmod(0o600)
    python = "/usr/bin/python3"
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("needs setpriv to drop root, which reads every file")
        wrapper = tmp_path / "python-as-nobody"
        wrapper.write_text(
            f'#!/bin/sh\nexec {setpriv} --reuid=65534 --regid=65534 --clear-groups {python} "$@"\n'
        )
        wrapper.chmod(0o755)
        python = str(wrapper)
    asked = {"op": "check", "path": str(model_dir)}
    answer = CheckAnswer.parse(probes.run_local("download", asked, python=python))
    assert answer.summary.unreadable == [shard(2, 3)]
    assert "permission denied" in errors(answer)[0].message


def test_path_with_spaces_and_quotes(tmp_path: Path) -> None:
    model_dir = make_checkpoint(tmp_path / 'it\'s a "model" dir', shards=2, shard_bytes=50_000)
    answer = check(model_dir)
    assert answer.findings == []
    assert answer.where.model_dir == str(model_dir)


def test_symlink_loop_as_path(tmp_path: Path) -> None:
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    assert "symlink loop" in errors(check(tmp_path / "a"))[0].message


def test_symlink_loop_as_shard(local: Path) -> None:
    (local / shard(2)).unlink()
    (local / shard(2)).symlink_to(shard(2))
    answer = check(local)
    assert answer.summary.unreadable == [shard(2)]
    assert "symlink loop" in errors(answer)[0].message


def test_broken_snapshot_links(cached: Path) -> None:
    os.unlink(checkpoint.shard_path(cached, 3))
    os.unlink((cached / "tokenizer_config.json").resolve())
    answer = check(cached)
    assert answer.summary.missing == [shard(3)]
    subjects = {f.subject for f in errors(answer)}
    assert {shard(3), "tokenizer_config.json"} <= subjects


@pytest.mark.parametrize("layout", ["local-dir", "hf-cache"])
def test_partial_downloads_are_found_in_both_layouts(tmp_path: Path, layout: str) -> None:
    model_dir = make_checkpoint(tmp_path / "m", shards=5, shard_bytes=100_000, layout=layout)
    pid = checkpoint.start_download_simulation(model_dir, shards=[4], rate_bytes_per_s=1, step=60)
    try:
        answer = check(model_dir)
    finally:
        checkpoint.stop_download_simulation(pid)
    assert answer.summary.missing == [shard(4)]
    kinds = sorted(p["kind"] for p in answer.partials)
    assert kinds == ["incomplete", "lock"]
    assert all(p["shard"] == shard(4) for p in answer.partials)
    assert any("partial download of " + shard(4) in f.message for f in errors(answer))


def test_config_and_tokenizer_files(local: Path) -> None:
    (local / "config.json").write_text("{")
    (local / "tokenizer_config.json").unlink()
    (local / "tiktoken.model").unlink()
    answer = check(local)
    assert [f.subject for f in errors(answer)] == ["config.json"]
    warnings = {f.subject for f in answer.findings if f.severity == "warning"}
    assert {"tokenizer_config.json", "tokenizer"} <= warnings


def test_missing_remote_code_module_is_a_warning(local: Path) -> None:
    (local / "tokenization_kimi.py").unlink()
    answer = check(local)
    assert [f.subject for f in answer.findings] == ["tokenization_kimi.py"]
    assert answer.findings[0].severity == "warning"


def test_probe_writes_nothing(local: Path, cached: Path, tmp_path: Path) -> None:
    before = tree_state(tmp_path)
    for path in (local, cached):
        for op in ("check", "hash", "progress"):
            probes.run_local("download", {"op": op, "path": str(path)})
    assert tree_state(tmp_path) == before


# --- hashing -------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["local-dir", "hf-cache"])
def test_hashes_match_known_references(tmp_path: Path, layout: str) -> None:
    model_dir = make_checkpoint(tmp_path / "m", shards=5, shard_bytes=100_000, layout=layout)
    result = shard_check.hash_shards(LocalProber(), str(model_dir))
    assert result.ok, result
    assert result.counts == {"match": 5}
    sources = {row.source for row in result.rows}
    assert sources == {"hf-cache blob name" if layout == "hf-cache" else "local-dir metadata etag"}


def test_changed_byte_is_a_mismatch(local: Path) -> None:
    with open(local / shard(2), "r+b") as handle:
        handle.seek(-1, os.SEEK_END)
        handle.write(b"\x01")
    result = shard_check.hash_shards(LocalProber(), str(local))
    assert not result.ok
    assert [f.subject for f in result.findings] == [shard(2)]
    assert "differs" in result.findings[0].message


def test_manifest_takes_precedence(local: Path) -> None:
    result = shard_check.hash_shards(LocalProber(), str(local), manifest={shard(1): "0" * 64})
    rows = {row.file: row for row in result.rows}
    assert rows[shard(1)].source == "manifest"
    assert rows[shard(1)].status == "mismatch"


def test_no_reference_is_information(tmp_path: Path) -> None:
    model_dir = make_checkpoint(tmp_path / "m", shards=2, shard_bytes=50_000)
    shutil.rmtree(model_dir / ".cache")
    result = shard_check.hash_shards(LocalProber(), str(model_dir))
    assert result.ok
    assert {f.severity for f in result.findings} == {"info"}


def test_progress_between_batches_and_resumable_cache(local: Path, tmp_path: Path) -> None:
    seen: list[HashProgress] = []
    cache = tmp_path / "state" / "hashes.json"
    host = LocalProber()
    result = shard_check.hash_shards(
        host, str(local), cache_path=str(cache), progress=seen.append, batch_size=2
    )
    assert result.ok
    assert [p.files_done for p in seen] == [2, 4, 5]
    assert seen[-1].bytes_done == seen[-1].bytes_total == 500_000
    assert "hashed 5/5 shards" in seen[-1].line()
    assert len(host.probe_args) == 4  # one listing, three batches
    assert len(json.loads(cache.read_text())) == 5
    again = shard_check.hash_shards(host, str(local), cache_path=str(cache))
    assert all(row.cached for row in again.rows)
    os.utime(local / shard(3), ns=(0, 0))
    third = shard_check.hash_shards(host, str(local), cache_path=str(cache))
    assert [row.file for row in third.rows if not row.cached] == [shard(3)]


def test_hash_of_missing_path_is_a_finding(tmp_path: Path) -> None:
    result = shard_check.hash_shards(LocalProber(), str(tmp_path / "gone"))
    assert not result.ok
    assert "does not exist" in result.findings[0].message


# --- the library ---------------------------------------------------------------------------


def test_check_download_result(local: Path) -> None:
    checkpoint.truncate_shard(local, 2, 10)
    result = shard_check.check_download(LocalProber(), str(local))
    assert not result.ok
    assert result.message.startswith("4 of 5 shards ok; 1 truncated")
    assert len(result.shards) == 5
    assert result.findings[0].subject == shard(2)
    good = shard_check.check_download(LocalProber(), str(local.parent / "absent"))
    assert good.message == "no checkpoint shards found"


def test_watch_download_follows_a_simulated_download(local: Path) -> None:
    pid = checkpoint.start_download_simulation(
        local, shards=[3, 4, 5], rate_bytes_per_s=1_000_000, step=0.02
    )
    updates: list[DownloadProgress] = []
    try:
        result = shard_check.watch_download(
            LocalProber(), str(local), interval=0.1, timeout=20, on_update=updates.append
        )
    finally:
        checkpoint.stop_download_simulation(pid)
    assert result.ok, result
    samples = result.samples
    assert samples[-1][1] == 500_000
    assert [b for _, b in samples] == sorted(b for _, b in samples)
    assert updates[0].done < 5 and updates[-1].complete


def test_watch_download_gives_up_at_timeout(local: Path) -> None:
    (local / shard(5)).unlink()
    clock = iter([0.0, 1.0, 200.0, 400.0]).__next__
    result = shard_check.watch_download(
        LocalProber(), str(local), interval=0, timeout=300, sleep=lambda _: None, clock=clock
    )
    assert not result.ok
    assert "not complete after" in result.message
    assert [f.subject for f in result.findings] == ["download"]
    assert len(result.samples) == 3


# --- pure helpers --------------------------------------------------------------------------


def test_transfer_rate_uses_recent_window() -> None:
    assert shard_check.transfer_rate([(0.0, 0)]) is None
    samples = [(0.0, 0), (100.0, 100), (110.0, 1100), (120.0, 2100)]
    assert shard_check.transfer_rate(samples, window=20) == 100.0
    assert shard_check.transfer_rate([(0.0, 0), (0.0, 10)]) is None


def test_eta_seconds() -> None:
    assert shard_check.eta_seconds(50, 100, 10.0) == 5.0
    assert shard_check.eta_seconds(100, 100, None) == 0.0
    assert shard_check.eta_seconds(50, 100, 0.0) is None


def test_stalled_for() -> None:
    assert shard_check.stalled_for([]) == 0.0
    assert shard_check.stalled_for([(0.0, 1), (5.0, 2), (9.0, 2), (20.0, 2)]) == 15.0
    assert shard_check.stalled_for([(0.0, 1), (5.0, 2)]) == 0.0


def test_formatting() -> None:
    assert shard_check.format_bytes(547_400_000_000) == "547.4 GB"
    assert shard_check.format_bytes(999) == "999 B"
    assert shard_check.format_bytes(None) == "?"
    assert shard_check.format_bytes(2e15) == "2000.0 TB"
    assert shard_check.format_duration(45) == "45 s"
    assert shard_check.format_duration(200) == "3 min 20 s"
    assert shard_check.format_duration(7500) == "2 h 05 min"
    assert shard_check.batched(["a", "b", "c"], 2) == [["a", "b"], ["c"]]


def test_progress_line() -> None:
    progress = DownloadProgress(
        elapsed=10.0,
        bytes_present=270_000_000_000,
        bytes_expected=540_000_000_000,
        expected_estimated=True,
        shards=119,
        done=59,
        partial=1,
        missing=59,
        rate=1e9,
        eta=270.0,
        stalled_for=0.0,
    )
    assert progress.line() == (
        "59/119 shards done, 1 partial, 59 missing; 270.0 GB of ~540.0 GB (50.0%), "
        "1.0 GB/s, about 4 min 30 s left"
    )
    assert not progress.complete


def test_shard_rows_are_read_by_position_and_by_name_alike(local: Path) -> None:
    # The probe's columns are ShardRow's fields in order, so rows are read by position; a
    # table whose columns come in another order is read by name, to the same rows.
    assert shard_check.ShardRow._fields == shard_check.SHARD_COLUMNS
    table = probes.run_local("download", {"op": "check", "path": str(local)})["shards"]
    assert tuple(table["columns"]) == shard_check.SHARD_COLUMNS
    reordered = {
        "columns": table["columns"][::-1],
        "rows": [row[::-1] for row in table["rows"]],
    }
    rows = shard_check.shard_rows(table)
    assert rows == shard_check.shard_rows(reordered)
    assert [row.file for row in rows] == [shard(n) for n in range(1, 6)]
    assert {(row.status, row.detail) for row in rows} == {("ok", "")}
    assert all(row.size == row.expected_size == 100_000 for row in rows)


def test_check_message_lists_problems() -> None:
    summary = shard_check.CheckSummary(
        shards=119,
        ok=117,
        missing=["a"],
        truncated=[],
        corrupt=["b"],
        unreadable=[],
        bytes_present=10,
        bytes_expected=20,
    )
    assert shard_check.check_message(summary, ok=False) == (
        "117 of 119 shards ok; 1 missing, 1 corrupt (10 B of 20 B present)"
    )


def test_shard_table_is_displayable(local: Path) -> None:
    result = shard_check.check_download(LocalProber(), str(local))
    assert result.ok
    assert result.message == "all 5 shards complete and readable (500.0 kB of 500.0 kB)"
    assert "<table>" in result.shards_table()._repr_html_()
    assert repr(result) == str(result) == f"OK: {result.message}"
    assert stat.S_ISDIR(os.stat(result.where.model_dir).st_mode)


# --- shards inspected by forked workers --------------------------------------------------


def raw_check_with(path: Path, workers: int) -> dict[str, Any]:
    args = {"op": "check", "path": str(path), "workers": workers}
    answer: dict[str, Any] = probes.run_local("download", args)
    return answer


def check_with(path: Path, workers: int) -> CheckAnswer:
    return CheckAnswer.parse(raw_check_with(path, workers))


@pytest.fixture
def parent_reads() -> Iterator[list[str]]:
    """The probe's own process leaves every chunk of shards to its workers (forks: they take
    them as usual), so that they surely run; yields the shards it reads itself all the same."""
    from opsbook.remote.probes import download as probe

    parent, take, inspect = os.getpid(), probe.Inspection.take, probe.inspect_shard
    read: list[str] = []

    def take_in_workers(self: Any) -> Any:
        return None if os.getpid() == parent else take(self)

    def inspect_noting(model_dir: str, name: str) -> Any:
        if os.getpid() == parent:
            read.append(name)
        return inspect(model_dir, name)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(probe.Inspection, "take", take_in_workers)
        patch.setattr(probe, "inspect_shard", inspect_noting)
        yield read


def faulty_checkpoint(tmp_path: Path) -> Path:
    model = make_checkpoint(tmp_path / "m", shards=9, shard_bytes=100_000)
    (model / shard(3, 9)).unlink()
    checkpoint.truncate_shard(model, 2, 60_000)
    checkpoint.corrupt_header(model, 4, "not-json")
    checkpoint.corrupt_header(model, 5, "overlap")
    index = json.loads((model / INDEX).read_text())
    index["weight_map"]["language_model.model.layers.7.mlp.experts.9.up_proj.weight"] = shard(6, 9)
    del index["weight_map"][next(t for t, f in index["weight_map"].items() if f == shard(7, 9))]
    (model / INDEX).write_text(json.dumps(index))
    shutil.copy(model / shard(1, 9), model / "model-00010-of-00010.safetensors")
    return model


def test_workers_answer_exactly_as_one_process_does(
    tmp_path: Path, parent_reads: list[str]
) -> None:
    from opsbook.remote.probes import download as probe

    model = faulty_checkpoint(tmp_path)
    forked = probe.check({"path": str(model), "workers": 3})
    # the workers read every shard on disk; this process looks for the missing one, and reads
    # again the two whose names differ from the index's
    assert parent_reads == [shard(3, 9), shard(6, 9), shard(7, 9)]
    assert forked == raw_check_with(model, 1)


def test_forked_workers_answer_exactly_as_one_process_does(tmp_path: Path) -> None:
    model = faulty_checkpoint(tmp_path)
    raw_alone, raw_forked = raw_check_with(model, 1), raw_check_with(model, 3)
    alone = CheckAnswer.parse(raw_alone)

    assert raw_forked == raw_alone
    summary = alone.summary
    assert summary.missing == [shard(3, 9)]
    assert summary.truncated == [shard(2, 9)]
    assert summary.corrupt == [shard(4, 9), shard(5, 9), shard(6, 9)]
    # shard 7 holds a tensor the index does not name: more than the index asks is not a fault
    assert status_of(alone, shard(7, 9)) == "ok"
    assert summary.unexpected == ["model-00010-of-00010.safetensors"]
    assert raw_forked["shards"]["columns"] == list(shard_check.SHARD_COLUMNS)
    assert all(len(row) == len(shard_check.SHARD_COLUMNS) for row in raw_forked["shards"]["rows"])


def test_a_worker_that_fails_leaves_its_shards_to_the_parent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, parent_reads: list[str]
) -> None:
    from opsbook.remote.probes import download as probe

    model = make_checkpoint(tmp_path / "m", shards=6, shard_bytes=100_000)
    checkpoint.truncate_shard(model, 2, 60_000)

    def broken(model_dir: str, names: list[str]) -> list[dict[str, Any]]:
        raise RuntimeError("a worker that dies")  # runs in the forked child only

    monkeypatch.setattr(probe, "inspect_share", broken)
    answer = CheckAnswer.parse(probe.check({"path": str(model), "workers": 3}))

    assert [row.file for row in answer.shards] == [shard(n, 6) for n in range(1, 7)]
    assert sorted(parent_reads) == [shard(n, 6) for n in range(1, 7)]
    assert answer.summary.truncated == [shard(2, 6)]
    assert len(answer.summary.truncated) + answer.summary.ok == 6


def test_only_the_shards_whose_names_differ_from_the_index_are_read_again(
    tmp_path: Path, parent_reads: list[str]
) -> None:
    from opsbook.remote.probes import download as probe

    model = make_checkpoint(tmp_path / "m", shards=6, shard_bytes=100_000)
    index = json.loads((model / INDEX).read_text())
    index["weight_map"]["language_model.model.layers.7.mlp.experts.9.up_proj.weight"] = shard(4, 6)
    del index["weight_map"][next(t for t, f in index["weight_map"].items() if f == shard(5, 6))]
    (model / INDEX).write_text(json.dumps(index))

    answer = CheckAnswer.parse(probe.check({"path": str(model), "workers": 3}))

    # the workers read every shard; this process reads again the two whose names differ
    assert sorted(parent_reads) == [shard(4, 6), shard(5, 6)]
    assert answer == CheckAnswer.parse(probe.check({"path": str(model), "workers": 1}))
    assert answer.summary.corrupt == [shard(4, 6)]
    assert "1 tensor(s) named in the index are not in the header" in answer.shards[3].detail
    assert status_of(answer, shard(5, 6)) == "ok"


def test_a_worker_that_answers_in_part_leaves_its_shards_to_the_parent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, parent_reads: list[str]
) -> None:
    # A worker cut off while writing its rows (it still ends with status 0): what it wrote is
    # not taken, and the parent reads its shards itself.
    import marshal

    from opsbook.remote.probes import download as probe

    model = faulty_checkpoint(tmp_path)

    def cut_short(inspection: Any, answers: int) -> None:
        rows = probe.inspect_share(inspection.model_dir, inspection.take() or [])
        with os.fdopen(answers, "wb") as out:
            out.write(marshal.dumps(rows)[:-3])

    monkeypatch.setattr(probe, "serve_share", cut_short)
    forked = probe.check({"path": str(model), "workers": 3})

    assert shard(1, 9) in parent_reads and shard(9, 9) in parent_reads
    assert forked == raw_check_with(model, 1)


def test_tensors_swapped_between_two_shards_are_found(tmp_path: Path) -> None:
    # Each shard's names are matched on their own: a swap keeps the sums over all shards equal.
    model = make_checkpoint(tmp_path / "m", shards=4, shard_bytes=100_000)
    index = json.loads((model / INDEX).read_text())
    weight_map = index["weight_map"]
    first = next(t for t, f in weight_map.items() if f == shard(2, 4))
    second = next(t for t, f in weight_map.items() if f == shard(3, 4))
    weight_map[first], weight_map[second] = shard(3, 4), shard(2, 4)
    (model / INDEX).write_text(json.dumps(index))

    for workers in (1, 3):
        answer = check_with(model, workers)
        assert answer.summary.corrupt == [shard(2, 4), shard(3, 4)], workers
        assert second in answer.shards[1].detail and first in answer.shards[2].detail


def tensor(dtype: str, shape: list[Any], begin: Any, end: Any) -> dict[str, Any]:
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


LAYOUTS = {
    "sound": {
        "__metadata__": {},
        "b": tensor("F32", [2], 8, 16),
        "a": tensor("BF16", [2, 2], 0, 8),
    },
    "empty": {"__metadata__": {"format": "pt"}},
    "zero-length": {"a": tensor("F32", [0], 0, 0), "b": tensor("U8", [4], 0, 4)},
    "unknown dtype": {"a": tensor("C64", [3], 0, 24)},
    "F4 packs two in a byte": {"a": tensor("F4", [3], 0, 2)},
    "gap": {"a": tensor("U8", [4], 0, 4), "b": tensor("U8", [4], 6, 10)},
    "overlap": {"a": tensor("U8", [4], 0, 4), "b": tensor("U8", [4], 2, 6)},
    "inside a zero-length": {"a": tensor("U8", [10], 0, 10), "b": tensor("U8", [0], 5, 5)},
    "not from 0": {"a": tensor("U8", [4], 4, 8)},
    "size": {"a": tensor("F32", [3], 0, 8)},
    "reversed": {"a": tensor("U8", [0], 4, 0)},
    "negative": {"a": tensor("U8", [4], -4, 0)},
    "bool offsets": {"a": tensor("U8", [1], False, True)},
    "float offsets": {"a": tensor("U8", [4], 0.0, 4.0)},
    "float dims": {"a": tensor("U8", [2.0, 2], 0, 4)},
    "text dims": {"a": tensor("U8", ["4"], 0, 4)},
    "no shape": {"a": {"dtype": "U8", "data_offsets": [0, 4]}},
    "three offsets": {"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4, 8]}},
    "not an object": {"a": [0, 4]},
}


@pytest.mark.parametrize("name", LAYOUTS)
def test_the_quick_layout_check_says_what_the_full_one_says(name: str) -> None:
    from opsbook.remote.probes import shard_read as probe

    header = LAYOUTS[name]
    quick = probe.sound_layout(header)
    assert probe.layout_of(header) == probe.layout_problem(header)
    assert quick is None or quick == probe.layout_problem(header)
    if name in ("sound", "empty", "zero-length", "unknown dtype", "F4 packs two in a byte"):
        assert quick is not None and quick[1] == ""
    if name in ("gap", "overlap", "inside a zero-length", "not from 0", "size", "reversed"):
        assert quick is None and probe.layout_problem(header)[1]


@pytest.mark.parametrize(
    "text",
    [
        '{"a": 1}',
        '{"a": [1, 2]}' + " " * 7,
        '{"a": 1}\t\n\r ',
        '{"a": NaN, "b": -Infinity}',
        '{"a": 1} x',
        '{"a": 1}\x0c',
        '{"a": 1}{"b": 2}',
        '{"a": 1',
        '{"a": "\x01"}',
        '{"a": "\\u00e9\\ud800"}',
        '{"a": 1, "a": 2}',
    ],
)
def test_a_header_parses_as_json_loads_parses_it(text: str) -> None:
    # The quick parse calls the decoder's scanner itself: what it takes, what it refuses and
    # why must be json.loads's, or a header's verdict and detail would change.
    from opsbook.remote.probes import shard_read as probe

    try:
        expected: Any = json.loads(text)
    except ValueError as error:
        with pytest.raises(ValueError) as refused:
            probe.parse_object(text)
        assert str(refused.value) == str(error)
    else:
        assert probe.parse_object(text) == expected


@pytest.mark.parametrize("tensors", [1, 50, 3000])
def test_a_header_is_read_whole_whatever_its_length(tmp_path: Path, tensors: int) -> None:
    # Shorter and longer than the first read, and one whose last byte ends the first read.
    from opsbook.remote.probes import shard_read as probe

    header = {f"t{i}": tensor("U8", [4], 4 * i, 4 * i + 4) for i in range(tensors)}
    text = json.dumps(header).encode()
    for body in (text, text + b" " * (probe.FIRST_READ - 8 - len(text) % probe.FIRST_READ)):
        path = tmp_path / f"t-{len(body)}.safetensors"
        path.write_bytes(len(body).to_bytes(8, "little") + body + bytes(4 * tensors))
        length, read, status, _ = probe.read_header(str(path), path.stat().st_size)
        assert (length, read, status) == (len(body), header, "ok")
        # the same file cut inside its header
        cut = tmp_path / "cut.safetensors"
        cut.write_bytes(path.read_bytes()[: 8 + len(body) // 2])
        assert probe.read_header(str(cut), cut.stat().st_size)[2] == "truncated"
    assert (len(text) + 8 > probe.FIRST_READ) == (tensors == 3000)


def test_without_an_index_each_shard_is_read_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from opsbook.remote.probes import download as probe

    model = make_checkpoint(tmp_path / "m", shards=6, shard_bytes=100_000)
    (model / INDEX).unlink()
    reads: list[str] = []
    inspect = probe.inspect_shard

    def noting(model_dir: str, name: str) -> Any:
        reads.append(name)
        return inspect(model_dir, name)

    monkeypatch.setattr(probe, "inspect_shard", noting)
    answer = CheckAnswer.parse(probe.check({"path": str(model), "workers": 1}))
    assert answer.summary.ok == 6
    assert sorted(reads) == [shard(n, 6) for n in range(1, 7)]


def test_a_checkpoint_folder_that_cannot_be_read_says_so_not_no_shards(
    local: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As for a login user without read permission on it (root reads any folder: simulated).
    from opsbook.remote.probes import shard_read

    real = os.scandir

    def denied(path: Any = ".") -> Any:
        if str(path) == str(local):
            raise PermissionError(13, "Permission denied", str(path))
        return real(path)

    monkeypatch.setattr(shard_read.os, "scandir", denied)
    where = shard_read.locate(str(local))
    assert where["error"] == f"cannot read the checkpoint: {local}: permission denied"
    result = shard_check.check_result(_check_in_process(local))
    assert not result.ok
    assert result.message == f"cannot read the checkpoint: {local}: permission denied"
    assert "no checkpoint shards found" not in str(result)
    assert shard_check.UNREADABLE == shard_read.UNREADABLE


def _check_in_process(path: Path) -> dict[str, Any]:
    from opsbook.remote.probes import download

    answer: dict[str, Any] = download.check({"path": str(path)})
    return answer
