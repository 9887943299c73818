"""Unit tests of reading logs as streams: several startups in one file, logs of any size,
line numbers as ``grep -n`` counts them, inputs that are no log, and public sources."""

from __future__ import annotations

import io
import json
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest

from opsbook.core.exceptions import LogError
from opsbook.knowledge.logscan import FAILED, READY, diagnose_log, diagnose_stream, load_catalogue
from opsbook.knowledge.logscan import stream as logread

LOGS = Path(__file__).resolve().parents[1] / "data" / "logs"


def read_log(name: str) -> str:
    return (LOGS / name).read_text(encoding="utf-8")


def concatenated(*names: str) -> str:
    return "".join(read_log(name) for name in names)


def grep_n(text: str, fixed: str) -> list[int]:
    """The line numbers ``grep -n -F`` gives for ``fixed`` in ``text``."""
    done = subprocess.run(
        ["grep", "-n", "-F", "--", fixed], input=text.encode(), capture_output=True, check=True
    )
    return [int(line.split(b":", 1)[0]) for line in done.stdout.splitlines()]


def in_process(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    from opsbook import cli

    code = cli.main(["diagnose", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def run_cli(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "opsbook.cli", "diagnose", *args],
        input=stdin,
        capture_output=True,
        timeout=120,
    )


# --- several startups in one file (issue 17 item 1) --------------------------------------


def test_the_last_startup_failed_after_earlier_ones_were_ready_and_failed() -> None:
    text = concatenated(
        "ready-3.log", "engine-dead-1.log", "ready-4.log", "trust-remote-code-2.log"
    )

    diagnosis = diagnose_log(text)

    assert (diagnosis.state, diagnosis.failure) == (FAILED, "trust-remote-code")
    assert diagnosis.line is not None
    key = "Please pass the argument `trust_remote_code=True`"
    assert diagnosis.line.number in grep_n(text, key)
    assert diagnosis.earlier_counts == {READY: 2, FAILED: 1}
    assert diagnosis.earlier_summary == "3 earlier startups in this file: 2 ready, 1 failed"
    assert [s.failure for s in diagnosis.earlier] == [None, "engine-dead", None]
    starts = [s.first_line for s in diagnosis.earlier] + [diagnosis.first_line]
    assert starts == sorted(starts) and len(set(starts)) == 4


def test_the_last_startup_ready_after_two_failed_ones() -> None:
    text = concatenated("engine-dead-1.log", "trust-remote-code-2.log", "ready-4.log")

    diagnosis = diagnose_log(text)

    assert diagnosis.state == READY
    assert diagnosis.line is not None
    assert diagnosis.line.number == grep_n(text, "Application startup complete.")[-1]
    assert diagnosis.earlier_summary == "2 earlier startups in this file: 2 failed"
    data = diagnosis.to_dict()["earlier_startups"]
    assert data["count"] == 2
    finding = diagnosis.to_result().findings[-1]
    assert finding.subject == "earlier startups" and "2 failed" in finding.message
    assert [s["failure"] for s in data["startups"]] == ["engine-dead", "trust-remote-code"]


def test_the_cli_prints_the_earlier_startups_in_text_and_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "vllm.log"
    log.write_text(concatenated("ready-3.log", "ready-6.log", "trust-remote-code-2.log"))

    code, text, _ = in_process(capsys, "--log", str(log))
    _, as_json, _ = in_process(capsys, "--log", str(log), "--json")

    assert code == 1
    assert "2 earlier startups in this file: 2 ready" in text
    data = json.loads(as_json)
    assert data["failure"] == "trust-remote-code"
    assert data["earlier_startups"]["states"] == {"ready": 2}


def test_one_startup_has_no_earlier_ones() -> None:
    diagnosis = diagnose_log(read_log("vllm-startup-8x-rtxpro6000-glm51-nvfp4.log"))

    assert diagnosis.state == READY
    assert diagnosis.earlier == [] and diagnosis.earlier_summary is None


# --- long logs and bad input (issue 17 item 2) --------------------------------------------


def all_logs() -> str:
    return "".join(read_log(path.name) for path in sorted(LOGS.glob("*.log")))


def test_the_logs_concatenated_16_times_are_answered(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "long.log"
    log.write_text(all_logs() * 16)
    assert log.stat().st_size > 2_000_000

    code, out, err = in_process(capsys, "--log", str(log), "--json")

    assert code in (0, 1), err
    data = json.loads(out)
    assert data["earlier_startups"]["count"] >= 16 * 4
    assert data["state"] in (READY, FAILED)


def test_timestamps_stepping_back_over_many_appended_runs_never_leave_the_calendar() -> None:
    december = "INFO 12-31 23:59:59 [api_server.py:1] vLLM API server version 0.9.0\n"
    january = "ERROR 01-01 00:00:01 [core.py:1] ValueError: boom\n"

    diagnosis = diagnose_log((december + january) * 9000)

    assert diagnosis.state == FAILED
    assert all(p.timestamp is None or p.timestamp.year <= 9999 for p in diagnosis.phases)


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\n\n\n",
        b"\x00" * 10_000,
        b"\xff\xfe\x00garbage\r\r\r\n" * 50,
        bytes(random.Random(7).randrange(256) for _ in range(200_000)),
        "(APIServer pid=1) ERROR 02-30 99:99:99 [x.py:1] ValueError: \u2603\n".encode() * 3,
        b"Traceback (most recent call last):\n" * 500,
    ],
    ids=["empty", "blank", "nul", "garbage", "random", "bad-date", "tracebacks"],
)
def test_no_input_crashes_the_diagnosis(data: bytes) -> None:
    diagnosis = diagnose_stream(io.BytesIO(data))

    assert diagnosis.state
    assert diagnosis.to_dict()["state"] == diagnosis.state


def test_random_mixes_of_real_lines_never_crash() -> None:
    lines = all_logs().split("\n")
    rng = random.Random(11)
    for _ in range(30):
        sample = "\n".join(rng.choice(lines) for _ in range(rng.randrange(1, 400)))
        assert diagnose_log(sample).state


def test_dev_zero_is_refused_as_no_text_log_with_exit_2() -> None:
    done = run_cli("--log", "/dev/zero")

    assert done.returncode == 2
    assert b"not a text log" in done.stderr


def test_a_long_file_without_newlines_is_cut_not_held() -> None:
    stream = io.BytesIO(b"ERROR x " + b"a" * (3 * logread.MAX_LINE_BYTES))

    lines = list(logread.screened_lines(stream))

    assert len(lines) == 1
    assert len(lines[0][1]) == logread.MAX_LINE_BYTES


def test_a_missing_or_folder_log_is_bad_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = in_process(capsys, "--log", str(tmp_path / "nope.log"))
    assert code == 2 and "No such file" in err
    code, _, err = in_process(capsys, "--log", str(tmp_path))
    assert code == 2 and "is a folder" in err


def test_a_defect_of_the_tool_exits_3_not_1(monkeypatch: pytest.MonkeyPatch) -> None:
    from opsbook import cli
    from opsbook.knowledge import logscan

    def broken(stream: object) -> None:
        raise ValueError("year 10000 is out of range")

    monkeypatch.setattr(logscan, "diagnose_stream", broken)

    assert cli.main(["diagnose", "--log", str(LOGS / "ready-3.log")]) == 3


def test_unreadable_stream_raises_log_error() -> None:
    class Broken(io.RawIOBase):
        def readable(self) -> bool:
            return True

        def readinto(self, buffer: object) -> int:
            raise OSError(5, "Input/output error")

    with pytest.raises(LogError, match="cannot read the log"):
        diagnose_stream(io.BufferedReader(Broken()))


# --- line numbers as grep -n counts them (issue 17 item 3) --------------------------------


def test_line_numbers_with_carriage_returns_match_grep(tmp_path: Path) -> None:
    bar = "Loading safetensors checkpoint shards:  50% Completed | 1/2\r" * 3
    text = (
        "INFO 03-12 10:11:12 [api_server.py:1] vLLM API server version 0.11.0\n"
        f"{bar}\n"
        "a progress bar\rredrawn\rtwice\n"
        "ERROR 03-12 10:11:13 [core.py:1] EngineCore failed to start.\r\n"
        "ValueError: The quantization method fp8 is not supported for the current GPU. "
        "Minimum capability: 89. Current capability: 86.\n"
    )
    log = tmp_path / "cr.log"
    log.write_bytes(text.encode())

    diagnosis = diagnose_log(text)
    data = json.loads(run_cli("--log", str(log), "--json").stdout)

    expected = grep_n(text, "The quantization method fp8")
    assert diagnosis.failure == "quant-capability"
    assert diagnosis.line is not None and [diagnosis.line.number] == expected == [5]
    assert data["line"]["number"] == 5


def test_line_numbers_of_a_large_file_match_grep_across_chunks(tmp_path: Path) -> None:
    routine = "(APIServer pid=1) INFO 05-15 06:00:00 [loggers.py:1] Engine 000: throughput\n"
    lines_per_chunk = logread.CHUNK_BYTES // len(routine)
    error = "(APIServer pid=1) ERROR 05-15 06:00:01 [x.py:1] OSError: [Errno 98] Address in use\n"
    text = routine * (lines_per_chunk + 123) + error + routine * 10

    diagnosis = diagnose_log(text)

    assert diagnosis.line is not None
    assert diagnosis.line.number == grep_n(text, "[Errno 98]")[0] == lines_per_chunk + 124


def test_reading_from_standard_input() -> None:
    done = run_cli("--log", "-", stdin=(LOGS / "oom-2.log").read_bytes())

    assert done.returncode == 1
    assert b"failure: oom" in done.stdout


# --- the screen keeps every line the catalogue or the phases need -----------------------


def test_routine_info_lines_are_skipped_and_others_kept() -> None:
    assert logread.is_routine(
        "(APIServer pid=1) INFO 05-15 06:00:00 [loggers.py:127] Engine 000: Avg prompt"
    )
    assert logread.is_routine('INFO:     127.0.0.1:51234 - "POST /v1/completions HTTP/1.1" 200')
    kept = [
        "(APIServer pid=1) INFO 05-15 05:33:37 [api_server.py:1] vLLM API server version 0.2",
        "INFO 06-10 06:16:42 [core.py:65] Initializing a V1 LLM engine (v0.9.0.1) with config",
        "(APIServer pid=1) WARNING 05-15 05:33:37 [x.py:1] anything",
        "ERROR 05-15 05:33:37 [x.py:1] anything",
        "INFO:     Application startup complete.",
        "node1:123:456 [0] NCCL INFO Init COMPLETE",
        "Traceback (most recent call last):",
    ]
    assert not any(logread.is_routine(line) for line in kept)


def test_a_line_of_interest_keeps_its_context_wherever_the_pieces_were_cut() -> None:
    # Routine lines around two lines of interest: the two lines each side are their context,
    # whether a piece ends just before, on or just after either one.
    routine = "(APIServer pid=1) INFO 05-15 06:00:{:02d} [loggers.py:127] Engine 000: Avg prompt\n"
    lines = [routine.format(n) for n in range(12)]
    lines[4] = "(APIServer pid=1) WARNING 05-15 06:00:04 [x.py:1] one\n"
    lines[6] = "ERROR 05-15 06:00:06 [x.py:1] two\n"
    raw = "".join(lines).encode()
    whole = logread.LineScreen().feed(raw)
    assert [number for number, _ in whole] == [3, 4, 5, 6, 7, 8, 9]
    for cut in range(1, len(raw)):
        for second_cut in (cut, min(cut + 57, len(raw))):
            screen = logread.LineScreen()
            pieces = screen.feed(raw[:cut]) + screen.feed(raw[cut:second_cut])
            assert pieces + screen.feed(raw[second_cut:]) == whole, (cut, second_cut)


def screened_one_by_one(raw: bytes) -> list[tuple[int, str]]:
    """The screen as its rule says, line by line: each line of interest (not routine) with two
    lines each side, and the last line with text."""
    lines = raw.split(b"\n")
    if raw.endswith(b"\n"):
        lines.pop()
    interesting = [i for i, line in enumerate(lines) if not logread.ROUTINE_LINE.match(line)]
    shown = {j: lines[j] for i in interesting for j in range(i - 2, i + 3) if 0 <= j < len(lines)}
    last = max((i for i, line in enumerate(lines) if line.strip()), default=None)
    if last is not None and last not in shown:
        shown[last] = lines[last].rstrip()
    return [(i + 1, shown[i].decode("utf-8", "replace")) for i in sorted(shown)]


@pytest.mark.parametrize(
    ("memo_lines", "mostly_new"),
    [(logread.ROUTINE_MEMO_LINES, logread.MOSTLY_NEW), (0, 1), (logread.ROUTINE_MEMO_LINES, 10**9)],
)
def test_the_screen_in_bulk_keeps_the_lines_its_rule_keeps(
    monkeypatch: pytest.MonkeyPatch, memo_lines: int, mostly_new: int
) -> None:
    # From no answers kept; kept per line text and forgotten at every chunk, each chunk read
    # by the answers kept; each chunk with a new text read by the pattern on every line.
    monkeypatch.setattr(logread, "_ROUTINE_MEMO", {})
    monkeypatch.setattr(logread, "ROUTINE_MEMO_LINES", memo_lines)
    monkeypatch.setattr(logread, "MOSTLY_NEW", mostly_new)
    monkeypatch.setattr(logread, "CHUNK_BYTES", 5000)
    routine = b"(APIServer pid=155) INFO 11-28 16:00:00 [loggers.py:127] Engine 000: Avg\n"
    for name in ("ready-4.log", "engine-dead-1.log", "vllm-startup-8x-rtxpro6000-glm51-nvfp4.log"):
        raw = (LOGS / name).read_bytes()
        for log in (raw, routine * 300 + raw + routine * 300 + b"  \n"):
            assert list(logread.screened_lines(io.BytesIO(log))) == screened_one_by_one(log)


def test_the_screen_tells_no_digit_from_another() -> None:
    # Its answer is kept per line with the digits masked: right only if no digit is named.
    from tests.unit.test_startup_shapes import names_no_digit

    assert names_no_digit(logread.ROUTINE_LINE)


@pytest.mark.parametrize(
    "carrier", ["2025-03-12T10:11:12.123456Z ", "Mar 12 10:11:12 gpu1 vllm[42]: ", "vllm-1  | "]
)
def test_a_carrier_s_prefix_does_not_keep_a_routine_line(carrier: str) -> None:
    routine = "(APIServer pid=1) INFO 05-15 06:00:00 [loggers.py:127] Engine 000: Avg prompt"
    phase = "(APIServer pid=1) INFO 05-15 05:33:37 [launcher.py:1] Route: /health, Methods: GET"

    assert logread.is_routine(carrier + routine)
    assert not logread.is_routine(carrier + phase)
    assert not logread.is_routine(carrier + "(APIServer pid=1) ERROR 05-15 05:33:37 [x.py:1] y")


# --- public sources (issue 17 item 4) -----------------------------------------------------

PRIVATE_SOURCE = re.compile(r"vllm-facts|§|shared/|DESIGN\.md|INDEX\.md|reference/", re.I)
PUBLIC_SOURCE = re.compile(
    r"vLLM \d|vllm-project/vllm#|PyTorch|NVIDIA/nccl|huggingface_hub|safetensors|transformers"
    r"|uvicorn|Linux kernel|ray-project/ray|python/cpython|CPython|triton-lang/triton"
    r"|GNU bash|opsbook \(no catalogue entry\)"
)


def test_no_catalogue_source_names_a_document_outside_the_repository() -> None:
    for entry in load_catalogue():
        assert not PRIVATE_SOURCE.search(entry.source), (entry.id, entry.source)
        assert PUBLIC_SOURCE.search(entry.source), (entry.id, entry.source)


@pytest.mark.parametrize("name", ["ready-4.log", "engine-dead-1.log", "shm-1.log"])
def test_no_diagnosis_source_names_a_document_outside_the_repository(name: str) -> None:
    for running in (None, True):
        diagnosis = diagnose_log(read_log(name), running=running)
        assert not PRIVATE_SOURCE.search(diagnosis.source), diagnosis.source
    assert not PRIVATE_SOURCE.search(diagnose_log("hello").source)


# --- bounded memory (issue 16 item 5) ---------------------------------------------------


class RepeatedLog(io.RawIOBase):
    """A log of ``size`` bytes made on the fly: a head, one line repeated, a tail."""

    def __init__(self, head: bytes, line: bytes, size: int, tail: bytes) -> None:
        self.parts = [head]
        self.line, self.left, self.tail = line * 10_000, size, tail

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray) -> int:  # type: ignore[override]
        if not self.parts:
            if self.left > 0:
                self.parts.append(self.line)
                self.left -= len(self.line)
            elif self.tail:
                self.parts.append(self.tail)
                self.tail = b""
            else:
                return 0
        part = self.parts.pop()
        size = min(len(buffer), len(part))
        buffer[:size] = part[:size]
        if size < len(part):
            self.parts.append(part[size:])
        return size


def test_a_large_log_is_read_in_bounded_memory() -> None:
    import tracemalloc

    routine = b"(APIServer pid=155) INFO 11-28 16:00:00 [loggers.py:127] Engine 000: Avg\n"
    stream = RepeatedLog(
        (LOGS / "ready-4.log").read_bytes(),
        routine,
        96 * 1024 * 1024,
        (LOGS / "trust-remote-code-2.log").read_bytes(),
    )
    tracemalloc.start()
    try:
        diagnosis = diagnose_stream(io.BufferedReader(stream, 1 << 20))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert diagnosis.failure == "trust-remote-code"
    assert diagnosis.earlier_counts == {READY: 1}
    assert peak < 24 * 1024 * 1024, peak


def test_a_startup_keeps_its_first_and_last_lines_of_interest_only() -> None:
    from opsbook.knowledge import logscan

    warning = "(APIServer pid=155) WARNING 11-28 16:00:00 [x.py:1] request {n} ignored a field\n"
    lines = [warning.format(n=n) for n in range(logscan.STARTUP_HEAD_LINES * 3)]
    text = (
        read_log("ready-4.log")
        + "".join(lines)
        + "ERROR 11-28 16:00:01 [x.py:1] OSError: [Errno 98] x\n"
    )

    diagnosis = diagnose_log(text)

    assert diagnosis.failure == "port-in-use"
    assert diagnosis.skipped_lines > 0
    assert diagnosis.phase == "ready"


def test_a_log_followed_piece_by_piece_is_diagnosed_as_the_whole_file() -> None:
    from opsbook.knowledge.logscan import LogFollower, diagnose_log

    for name in ("ready-4.log", "trust-remote-code-2.log", "engine-dead-1.log"):
        raw = (LOGS / name).read_bytes()
        follower = LogFollower()
        for start in range(0, len(raw), 777):  # pieces that cut lines anywhere
            follower.feed(raw[start : start + 777])
        whole = diagnose_log(raw.decode("utf-8", "surrogateescape"))
        followed = follower.diagnose()
        assert (followed.state, followed.failure, followed.phase) == (
            whole.state,
            whole.failure,
            whole.phase,
        ), name
        assert followed.line == whole.line and follower.size == len(raw)


def test_a_follower_sees_the_line_still_being_written() -> None:
    from opsbook.knowledge.logscan import LogFollower

    raw = (LOGS / "ready-4.log").read_bytes()
    cut = raw.rindex(b"Application startup complete") + 5
    follower = LogFollower()
    follower.feed(raw[:cut])
    assert follower.diagnose(running=True).state == "loading"
    follower.feed(raw[cut:])
    assert follower.diagnose(running=True).state == "ready"


def test_a_look_that_brought_nothing_new_is_answered_without_diagnosing_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from opsbook.knowledge import logscan
    from opsbook.knowledge.logscan import follower as follower_module

    raw = (LOGS / "ready-4.log").read_bytes()
    follower = logscan.LogFollower()
    follower.feed(raw[: len(raw) // 2])
    first = follower.diagnose(running=True)
    calls: list[int] = []
    diagnose_lines = follower_module._diagnose_lines
    monkeypatch.setattr(
        follower_module, "_diagnose_lines", lambda *a: calls.append(1) or diagnose_lines(*a)
    )

    again = follower.diagnose(running=True)
    assert calls == []
    assert (again.state, again.phase, again.line) == (first.state, first.phase, first.line)

    follower.diagnose(running=False)  # another question: answered afresh
    follower.feed(raw[len(raw) // 2 :])  # new lines: diagnosed
    assert follower.diagnose(running=True).state == READY
    assert calls == [1, 1]


def test_a_follower_that_keeps_what_it_read_diagnoses_each_look_as_a_fresh_reading() -> None:
    # Every shipped log, followed in pieces that cut lines anywhere, with the memo carried from
    # look to look: each look's diagnosis is the one a follower reading the same bytes afresh
    # gives (its memo holds nothing from earlier looks).
    from opsbook.knowledge.logscan import LogFollower

    logs = sorted(LOGS.rglob("*.log"))
    assert len(logs) > 500
    for number, path in enumerate(logs):
        raw = path.read_bytes()
        follower = LogFollower()
        cuts = [len(raw) * k // 4 + number % 7 for k in (1, 2, 3)] + [len(raw)]
        start = 0
        for look, cut in enumerate(cuts):
            follower.feed(raw[start:cut])
            start = cut
            running = (None, True, False)[(number + look) % 3]
            fresh = LogFollower()
            fresh.feed(raw[:cut])
            kept = follower.diagnose(running=running)
            assert kept.to_dict() == fresh.diagnose(running=running).to_dict(), (path, cut)


def test_a_look_reads_only_the_texts_it_has_not_read_before(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from opsbook.knowledge import logscan
    from opsbook.knowledge.logscan import log_lines
    from opsbook.knowledge.logscan import matching as matching_module

    reads: list[str] = []
    matched: list[str] = []
    read_message, matching = log_lines._read_message, matching_module._matching_patterns
    monkeypatch.setattr(
        log_lines, "_read_message", lambda key: reads.append(key[0]) or read_message(key)
    )
    monkeypatch.setattr(
        matching_module,
        "_matching_patterns",
        lambda e, s, text: matched.append(text) or matching(e, s, text),
    )
    startup = read_log("ready-4.log").encode()
    lines = startup.splitlines(keepends=True)
    follower = logscan.LogFollower()
    follower.feed(b"".join(lines[:-5]))
    follower.diagnose(running=True)
    first_reads, first_matched = len(reads), len(matched)
    reads.clear()
    matched.clear()
    follower.feed(b"".join(lines[-5:]))

    assert follower.diagnose(running=True).state == READY
    assert first_reads > 30 and first_matched > 30
    # The five new lines, and the line that was still being written at the first look.
    assert 0 < len(reads) <= 6 and 0 < len(matched) <= 6


def test_the_memo_forgets_what_a_look_did_not_use() -> None:
    from opsbook.knowledge.logscan import LineMemo

    memo = LineMemo()
    computed: list[str] = []

    def upper(text: str) -> str:
        computed.append(text)
        return text.upper()

    assert memo.cleaned.get("a", upper) == "A" and memo.cleaned.get("b", upper) == "B"
    memo.turn()
    assert memo.cleaned.get("a", upper) == "A"  # kept from the look before
    memo.turn()  # "b" was not used at that look: forgotten
    assert memo.cleaned.get("b", upper) == "B"
    assert computed == ["a", "b", "b"]


# A pattern that can begin with an unbounded run of a class (``\S+``, ``\w*``, ``[\d.]+``) is
# tried from every position of a long run of that class (a base64 blob, a line of one
# character, a terminal-wrapped line joined back) and runs it out from each: 200 kB of random
# bytes took 46 s, a joined 60 kB line 4.8 s. The leftmost match begins where the run does, so
# a lookbehind in front (``(?<!\S)``, ``(?<!\w)``) finds the same matches in linear time. Read
# from the parsed pattern (CPython's re parser), not its text.
def _may_begin_with_a_run(
    items: list[tuple[object, object]], guard: re.Pattern[str] | None = None
) -> bool | None:
    """True if the pattern can start with an unbounded repeat of characters its lookbehind
    (``guard``) does not refuse, before any anchor or literal; False if one of those comes
    first; None if the items can all match nothing."""
    from re import _constants as c

    for op, arg in items:
        if op in (c.AT, c.LITERAL):
            return False
        if op == c.ASSERT_NOT and arg[0] == -1:  # type: ignore[index]
            guard = _compiled(list(arg[1]))  # type: ignore[index]
            continue
        if op in (c.ASSERT, c.ASSERT_NOT):
            return False
        if op in (c.IN, c.ANY, c.CATEGORY, c.NOT_LITERAL):
            continue  # one character of a class: a run may follow it
        if op == c.SUBPATTERN:
            found = _may_begin_with_a_run(list(arg[-1]), guard)  # type: ignore[index]
            if found is not None:
                return found
            continue
        if op == c.BRANCH:
            return any(_may_begin_with_a_run(list(alt), guard) for alt in arg[1])  # type: ignore[index]
        if op in (c.MAX_REPEAT, c.MIN_REPEAT, c.POSSESSIVE_REPEAT):
            low, high, body = arg  # type: ignore[misc]
            if high == c.MAXREPEAT and not _refuses_every_start(guard, list(body)):
                return True
            if _may_begin_with_a_run(list(body), guard):
                return True
            if low:
                return False
            continue
        return False
    return None


def _compiled(items: list[tuple[object, object]]) -> re.Pattern[str]:
    from re import _compiler, _parser

    return _compiler.compile(_parser.SubPattern(_parser.State(), items))  # type: ignore[no-any-return]


# Characters a run may be made of in a log: ASCII, Latin-1, box drawing, CJK.
SAMPLE = [chr(n) for n in (*range(1, 0x250), *range(0x2500, 0x2580), *range(0x4E00, 0x4E40))]


def _refuses_every_start(guard: re.Pattern[str] | None, body: list[tuple[object, object]]) -> bool:
    """Whether the lookbehind refuses to start a match after any character the run takes."""
    if guard is None:
        return False
    run = _compiled(body)
    return all(guard.fullmatch(ch) for ch in SAMPLE if run.fullmatch(ch))


def begins_with_a_run(pattern: re.Pattern[str]) -> bool:
    from re import _parser

    return bool(_may_begin_with_a_run(list(_parser.parse(pattern.pattern, pattern.flags))))


def test_no_catalogue_pattern_may_begin_with_an_unbounded_run() -> None:
    for entry in load_catalogue():
        for kind in ("patterns", "parse", "after"):
            for pattern in getattr(entry, kind):
                if pattern is not None:
                    assert not begins_with_a_run(pattern), (entry.id, kind, pattern.pattern)


@pytest.mark.parametrize(
    "unbounded",
    [
        r"(?P<repo>\S+) is gated",
        r"\S* gated",
        r"(?<![\w.-])(?:\S*/)?vllm: x",
        r"\w*LLMEngine has failed",
        r"(?P<file>[\w./-]+\.safetensors)",
        r"x|(?P<n>\d+) replicas",
        r"\s*[|]\s*$",
    ],
)
def test_the_check_sees_a_pattern_that_may_begin_with_a_run(unbounded: str) -> None:
    assert begins_with_a_run(re.compile(unbounded))


@pytest.mark.parametrize(
    "bounded",
    [
        r"(?<!\S)(?P<repo>\S+) is gated",
        r"(?<!\w)\w*LLMEngine has failed",
        r"^\s*gated",
        r"Error: (?P<what>\S+)",
        r"\d{1,3} replicas",
    ],
)
def test_the_check_passes_a_pattern_anchored_before_its_run(bounded: str) -> None:
    assert not begins_with_a_run(re.compile(bounded))
