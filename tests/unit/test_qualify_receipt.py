"""The receipt of 06_qualify: one schema, written whole, read back from earlier run folders."""

import json

from opsbook.remote.testing import FakeHost
from opsbook.steps import qualify_matrix as matrix
from opsbook.steps import qualify_receipt as receipts
from tests.unit.test_qualify_gate import FINGERPRINT, receipt


def test_a_receipt_reads_back_as_it_was_written(tmp_path) -> None:
    written = receipt(120.0)
    written.skipped_cells = [matrix.SkippedCell(matrix.Cell(1024, 4), "too long")]
    path = receipts.write_receipt(tmp_path / "run-1", written)
    assert path == tmp_path / "run-1" / "qualify" / "receipt.json"
    doc = json.loads(path.read_text())
    assert doc["schema"] == receipts.SCHEMA
    assert doc["receipts"][0]["fingerprint_id"] == FINGERPRINT.id
    (back,) = receipts.earlier_receipts(tmp_path / "run-2")
    assert back.cells == written.cells and back.skipped_cells == written.skipped_cells
    assert back.fingerprint == written.fingerprint and back.software == written.software
    assert back.run_folder == "runs/one"


def test_each_host_of_a_run_has_its_receipt_in_the_one_file(tmp_path) -> None:
    receipts.write_receipt(tmp_path, receipt(host="ops@a"))
    receipts.write_receipt(tmp_path, receipt(host="ops@b"))
    receipts.write_receipt(tmp_path, receipt(host="ops@a", profile="full"))
    doc = json.loads((tmp_path / "qualify" / "receipt.json").read_text())
    assert [(r["host"], r["profile"]) for r in doc["receipts"]] == [
        ("ops@b", "quick"),
        ("ops@a", "full"),
    ]


def test_earlier_receipts_leave_out_this_run_and_unreadable_files(tmp_path) -> None:
    receipts.write_receipt(tmp_path / "a", receipt(started_at="2026-12-02", run_folder=""))
    receipts.write_receipt(tmp_path / "b", receipt(started_at="2026-12-01"))
    receipts.write_receipt(tmp_path / "deploy" / "batch-01", receipt(started_at="2026-12-03"))
    (tmp_path / "c" / "qualify").mkdir(parents=True)
    (tmp_path / "c" / "qualify" / "receipt.json").write_text("{not json")
    (tmp_path / "d" / "qualify").mkdir(parents=True)
    (tmp_path / "d" / "qualify" / "receipt.json").write_text('{"receipts": [{"schema": "x"}]}')
    found = list(receipts.earlier_receipts(tmp_path / "a"))
    assert [r.started_at for r in found] == ["2026-12-01", "2026-12-03"]
    assert receipts.runs_root(tmp_path / "deploy" / "batch-02") == tmp_path
    (first, *_) = receipts.earlier_receipts(tmp_path / "b")
    assert first.run_folder == str(tmp_path / "a")


def test_the_fingerprint_changes_with_the_hardware_only() -> None:
    same = receipts.Fingerprint(*FINGERPRINT.__dict__.values())
    assert same.id == FINGERPRINT.id and len(FINGERPRINT.id) == 16
    other = receipts.Fingerprint("H200", 8)
    assert other.id != FINGERPRINT.id
    assert "gpu_model: H200 vs NVIDIA RTX PRO 6000" in other.differences(FINGERPRINT)


def test_the_startup_facts_come_from_the_log_lines_the_host_picks_out() -> None:
    lines = (
        "INFO 12-06 10:00:01 [kv_cache_utils.py:1229] GPU KV cache size: 1,234,560 tokens\n"
        "INFO 12-06 10:00:01 [kv_cache_utils.py:1234] Maximum concurrency for 8,192 tokens per "
        "request: 150.70x\n"
        "INFO 12-06 10:00:00 [cuda.py:300] Using TRITON_MLA attention backend out of [...]\n"
    )
    host = FakeHost("a", commands={r"^grep -a -F": lines})
    startup = receipts.startup_of(host, "/home/u/opsbook/vllm.log", [])
    assert (startup.kv_cache_tokens, startup.max_concurrency) == (1_234_560, 150.7)
    assert startup.attention_backend == "TRITON_MLA"
    # vLLM 0.32.0 says both on one line, the device first.
    one_line = (
        "INFO [kv_cache_utils.py:2328] CPU KV cache size: 65,536 tokens, Maximum concurrency "
        "for 2,048 tokens per request: 32.00x\n"
    )
    startup = receipts.startup_of(FakeHost("a", commands={r"^grep": one_line}), "/l", [])
    assert (startup.kv_cache_tokens, startup.max_concurrency) == (65_536, 32.0)
