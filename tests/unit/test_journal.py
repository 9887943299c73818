import json

from opsbook.journal import Journal
from opsbook.redact import Redactor


def test_entries_are_redacted_and_mirrored_to_json_lines(tmp_path) -> None:
    path = tmp_path / "journal.jsonl"
    journal = Journal(Redactor(["topsecret1"]), path)
    journal.record(
        host="h",
        kind="run",
        command="echo topsecret1",
        exit_code=0,
        duration=0.1234,
        stdout="topsecret1\n" + "x" * 5000,
    )
    entry = journal.entries[0]
    assert "topsecret1" not in entry.command + entry.stdout_tail
    assert len(entry.stdout_tail) < 2100
    lines = path.read_text().splitlines()
    assert json.loads(lines[0])["command"] == "echo ***"
    assert journal.table().records()[0]["exit"] == 0
