import base64
import json
import zlib

from opsbook.core.redact import Redactor
from opsbook.remote import probes
from opsbook.remote.journal import Journal


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


def test_the_journal_page_names_each_operation_first_read_or_write() -> None:
    from opsbook.remote.journal import JournalEntry, journal_page, operation

    def entry(kind: str, command: str, code: int | None = 0) -> JournalEntry:
        return JournalEntry("gpu-01", kind, command, code, 0.25, "", "", "2026-12-03T01:02:03.456")

    stop = entry("run", "probe launch (python3 -) args={'op': 'stop', 'pid_file': '/s/p'}")
    health = entry("run", "probe launch (python3 -) args={'op': 'http', 'path': '/health'}")
    put = entry("upload", "sftp put /h/launch.sh (876 bytes, mode 755)")
    check = entry("run", "bash -n /h/launch.sh", 2)
    ops = [operation(e) for e in (stop, health, put, check)]
    assert [(o.what, o.writes) for o in ops] == [
        ("launch stop", True),
        ("launch http /health", False),
        ("sftp put /h/launch.sh (876 bytes, mode 755)", True),
        ("bash -n /h/launch.sh", False),
    ]
    page = journal_page([stop, health, put, check], title="journal of run")
    assert "4 operation(s), 2 of them writing" in page and "<td>01:02:03</td>" in page
    assert (
        "<pre class='command'>probe launch (python3 -) args={&#x27;op&#x27;: &#x27;stop&#x27;"
        in page
    )
    assert "background:#ffebe9" in page  # the failed bash -n stands out


def test_a_compressed_probe_answer_is_journalled_readable_with_the_secret_masked() -> None:
    # A probe's large answer (a log read back, a secret in it) leaves compressed.
    answer = json.dumps({"log": "y" * 3000 + " token topsecret1 at the end"})
    packed = probes.COMPRESSED + base64.b64encode(zlib.compress(answer.encode())).decode()
    stdout = f"\n{probes.BEGIN}\n{packed}\n{probes.END}\n"
    journal = Journal(Redactor(["topsecret1"]))
    journal.record(host="h", kind="run", command="probe", exit_code=0, duration=0.1, stdout=stdout)

    tail = journal.entries[0].stdout_tail
    assert "token *** at the end" in tail and "topsecret1" not in tail


def test_the_journal_page_shows_every_command_whole_in_time_order() -> None:
    from opsbook.remote.journal import JournalEntry, journal_page

    long_command = "bash -lc " + " ".join(f"--flag-{n}=value-{n}" for n in range(40))
    # As the file holds them: each written when its command ended, from two hosts' threads.
    late = JournalEntry("b", "run", long_command, 0, 2.5, "out", "", "2026-12-03T01:02:05.000")
    early = JournalEntry("a", "run", "echo first", 0, 0.1, "", "", "2026-12-03T01:02:03.000")
    page = journal_page([late, early])
    assert page.index("echo first") < page.index("--flag-0=")
    assert f"<pre class='command'>{long_command}</pre>" in page  # whole, shown without a click
    assert "<details><summary>output</summary><pre>out</pre>" in page


def test_an_entry_recorded_without_its_start_time_began_its_duration_ago() -> None:
    from datetime import datetime, timedelta, timezone

    journal = Journal()
    before = datetime.now(timezone.utc)
    journal.record(host="h", kind="upload", command="sftp put /x", exit_code=0, duration=30.0)
    started = datetime.fromisoformat(journal.entries[0].started)
    assert before - timedelta(seconds=31) < started < before - timedelta(seconds=29)


def test_a_probe_is_journalled_with_every_argument_whole_but_file_texts_and_secrets() -> None:
    from opsbook.remote.commands import TEXT_ARG_CHARS, _short

    paths = [f"/models/checkpoint-{n}/config.json" for n in range(12)]
    args = {
        "action": "apply",
        "files": paths,
        "writes": {"config.json": {"expect_sha256": "ab" * 32, "text": "{" + "x" * 5000 + "}"}},
        "headers": {"token": "hf_abcdefghijklmnop"},
    }
    label = _short(args)
    assert all(repr(path) in label for path in paths)  # nothing cut from the end
    assert f"'expect_sha256': '{'ab' * 32}'" in label and "'text': '<5002 characters>'" in label
    assert "'token': '***'" in label and "hf_" not in label
    assert len(label) < 1000 and TEXT_ARG_CHARS >= 100


def test_the_notebooks_journal_table_shows_each_command_whole_wrapped_in_time_order() -> None:
    from datetime import datetime, timedelta, timezone

    from opsbook.remote.journal import COMMAND_STYLE

    # Longer than the 120 characters the table once cut at, with a secret past that point.
    long_command = "vllm serve /m " + " ".join(f"--flag-{n}=v{n}" for n in range(30))
    long_command += " --api-key topsecret1 --port 8000"
    journal = Journal(Redactor(["topsecret1"]))
    now = datetime.now(timezone.utc)
    # Recorded as they ended: the long command ended first, though it began later.
    later = journal.record(host="b", kind="run", command=long_command, exit_code=0,
                           duration=0.5, started=now)  # fmt: skip
    journal.record(host="a", kind="run", command="echo first\necho second", exit_code=0,
                   duration=9.0, started=now - timedelta(seconds=1))  # fmt: skip
    table = journal.table()
    whole = long_command.replace("topsecret1", "***")
    assert len(whole) > 240 and later.command == whole
    assert [r["host"] for r in table.records()] == ["a", "b"]
    assert table.records()[1]["command"] == whole
    page = table._repr_html_()
    assert f"<pre style='{COMMAND_STYLE}'>{whole}</pre>" in page
    assert "white-space:pre-wrap" in COMMAND_STYLE and "monospace" in COMMAND_STYLE
    assert "<pre style='" + COMMAND_STYLE + "'>echo first\necho second</pre>" in page
    # As text (a headless notebook's output), as `records show` prints it: whole, indented.
    text = str(table).splitlines()
    assert "    " + whole in text and ["    echo first", "    echo second"] == text[1:3]
    assert "topsecret1" not in page + str(table) and "..." not in page
