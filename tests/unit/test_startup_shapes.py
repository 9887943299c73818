"""A startup's shape, and a crash loop's next startup told to repeat the last one
(opsbook.knowledge.logscan.startup_shapes).

The startups are real: the first ~30 kB of a real vLLM 0.20 startup on 8x RTX PRO 6000
(tests/data/logs/vllm-startup-8x-rtxpro6000-glm51-nvfp4.log) and a real failure
(tests/data/logs/fp8kv-mla-1.log), restarted with other times and PIDs as a restart loop
writes them.
"""

from __future__ import annotations

import re
from pathlib import Path
from re import _constants as sre  # type: ignore[attr-defined]
from re import _parser as sre_parse  # type: ignore[attr-defined]
from typing import Any

import pytest

from opsbook.knowledge.logscan import follower
from opsbook.knowledge.logscan.catalogue import signals
from opsbook.knowledge.logscan.line_grammar import _ANSI, _COMMENT
from opsbook.knowledge.logscan.startup_shapes import _PER_RUN, Template, shape_of
from opsbook.knowledge.logscan.stream import screened_lines

LOGS = Path(__file__).resolve().parents[1] / "data" / "logs"
DIGITS = set(range(ord("0"), ord("9") + 1))


def names_no_digit(pattern: re.Pattern[Any]) -> bool:
    """Whether ``pattern`` treats every ASCII digit alike: no digit as a literal, and every
    class holds all ten digits or none. Then a line's match, and where its matches fall, do
    not depend on which digits it holds."""
    return _digit_blind(sre_parse.parse(pattern.pattern, pattern.flags))


def _digit_blind(parsed: Any) -> bool:
    for op, value in parsed:
        if op in (sre.LITERAL, sre.NOT_LITERAL) and value in DIGITS:
            return False
        if op == sre.IN and not _class_blind(value):
            return False
        for inner in _subpatterns(op, value):
            if not _digit_blind(inner):
                return False
    return True


def _class_blind(items: list[tuple[Any, Any]]) -> bool:
    held: set[int] = set()
    for op, value in items:
        if op == sre.LITERAL:
            held |= {value} & DIGITS
        elif op == sre.RANGE:
            held |= set(range(value[0], value[1] + 1)) & DIGITS
        elif op == sre.CATEGORY and value in (sre.CATEGORY_DIGIT, sre.CATEGORY_WORD):
            held |= DIGITS
    return held in (set(), DIGITS)


def _subpatterns(op: Any, value: Any) -> list[Any]:
    if op == sre.BRANCH:
        return list(value[1])
    if op == sre.SUBPATTERN:
        return [value[-1]]
    if op in (sre.MAX_REPEAT, sre.MIN_REPEAT, sre.POSSESSIVE_REPEAT):
        return [value[2]]
    if op in (sre.ASSERT, sre.ASSERT_NOT):
        return [value[1]]
    if op == sre.ATOMIC_GROUP:
        return [value]
    if op == sre.GROUPREF_EXISTS:
        return [branch for branch in value[1:] if branch is not None]
    return []


def test_the_check_sees_a_digit_named_in_a_pattern() -> None:
    assert names_no_digit(re.compile(r"pid=\d+ [\w.]+ [^\s]"))
    assert not names_no_digit(re.compile(r"pid=1\d"))
    assert not names_no_digit(re.compile(r"(?:a|b[1-9])"))
    assert not names_no_digit(re.compile(r"(?<=[0-4])x"))


def test_what_a_repeat_is_told_by_names_no_digit() -> None:
    # Template.repeats compares texts with their digits masked: the patterns that cut a
    # startup's times and PIDs, and the splitter's tests of each line, must not tell one
    # digit from another.
    marks = signals()
    for pattern in (
        _PER_RUN,
        *marks.startup_markers,
        marks.api_server_pid,
        marks.run_error,
        _ANSI,
        _COMMENT,
        follower._ANSI_HINT,
        follower._ANY_MARKER,
    ):
        assert names_no_digit(pattern), pattern.pattern
    assert not any(ch.isdigit() for word in follower.MARKER_WORDS for ch in word)


def split_shape(kept: list[tuple[int, str]]) -> tuple[object, ...]:
    """The shape as it was first written (one regex split), to hold shape_of to it."""
    parts = _PER_RUN.split("\n".join(line for _, line in kept))
    order: dict[str, int] = {}
    places = tuple(order.setdefault(value, len(order)) for value in parts[1::2])
    first = kept[0][0] if kept else 0
    return ("\0".join(parts[0::2]), places, tuple(n - first for n, _ in kept))


def restarted(text: str, run: int) -> str:
    clock = f"{run // 60 % 24:02d}:{run % 60:02d}:{run * 7 % 60:02d}"
    return re.sub(r"pid=\d+", f"pid={4000 + run}", re.sub(r"\d\d:\d\d:\d\d", clock, text))


@pytest.fixture(scope="module")
def startups() -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    """Two startups of a crash loop as the screen gives them: the template's lines with the
    first line of the next, and the next's first line with its rest and the one after."""
    real = (LOGS / "vllm-startup-8x-rtxpro6000-glm51-nvfp4.log").read_text()
    one = real[: real.index("\n", 30_000) + 1] + (LOGS / "fp8kv-mla-1.log").read_text()
    size = one.count("\n")
    text = "".join(restarted(one, run) for run in range(3))
    lines = [(n, t) for n, t in _screened(text) if n <= 2 * size + 1]
    cut = next(i for i, (n, _) in enumerate(lines) if n > size)
    return lines[: cut + 1], lines[cut:]


def _screened(text: str) -> list[tuple[int, str]]:
    import io

    return list(screened_lines(io.BytesIO(text.encode())))


@pytest.mark.parametrize("log", ["ready-4.log", "engine-dead-1.log", "fp8kv-mla-1.log"])
def test_the_shape_is_the_split_s(log: str) -> None:
    kept = _screened((LOGS / log).read_text(errors="replace"))
    assert shape_of(kept) == split_shape(kept)
    assert shape_of([]) == split_shape([])


def test_the_shape_keeps_what_is_not_a_time_or_a_pid() -> None:
    lines = [(10, "(APIServer pid=7) INFO 05-15 05:33:37 [gpu.py:1] 8 GPUs, 12.5 GiB free")]
    later = [(90, "(APIServer pid=9) INFO 05-15 06:01:02 [gpu.py:1] 8 GPUs, 12.5 GiB free")]
    other = [(90, "(APIServer pid=9) INFO 05-15 06:01:02 [gpu.py:1] 8 GPUs, 0.5 GiB free")]
    assert shape_of(lines) == shape_of(later)
    assert shape_of(lines) != shape_of(other)


def test_which_times_and_pids_are_equal_is_part_of_the_shape() -> None:
    # Two records of one process at one time, or of two: the diagnosis groups lines by them.
    same = [(1, "(EngineCore pid=5) ERROR 05-15 05:33:37 a"), (2, "(EngineCore pid=5) x")]
    apart = [(1, "(EngineCore pid=5) ERROR 05-15 05:33:37 a"), (2, "(EngineCore pid=6) x")]
    assert shape_of(same) != shape_of(apart)


def test_a_template_has_its_startup_s_shape(startups: tuple[list[Any], list[Any]]) -> None:
    template_lines, _ = startups
    template = Template(template_lines[:-1], template_lines[-1])
    assert template.shape == shape_of(template_lines[:-1])
    assert template.size == len(template_lines) - 1


def test_a_restarted_startup_repeats_the_template(startups: tuple[list[Any], list[Any]]) -> None:
    template_lines, next_lines = startups
    template = Template(template_lines[:-1], template_lines[-1])
    assert template.repeats(next_lines[0], next_lines[1:])
    assert shape_of(next_lines[:-1]) == template.shape


def changed(lines: list[tuple[int, str]], at: int, old: str, new: str) -> list[tuple[int, str]]:
    number, text = lines[at]
    assert old in text, (old, text)
    return [*lines[:at], (number, text.replace(old, new, 1)), *lines[at + 1 :]]


def test_a_startup_that_differs_in_more_than_times_and_pids_is_no_repeat(
    startups: tuple[list[Any], list[Any]],
) -> None:
    template_lines, next_lines = startups
    template = Template(template_lines[:-1], template_lines[-1])
    first, rest = next_lines[0], next_lines[1:]
    at = next(i for i, (_, t) in enumerate(rest) if "[utils.py:306]" in t)
    pid = re.search(r"pid=(\d+)", rest[at][1])
    assert pid is not None
    other_pid = str(int(pid.group(1)) + 1)
    gap = [*rest[:5], *((n + 1, t) for n, t in rest[5:])]
    differing = {
        "a digit that is no time or PID": changed(rest, at, "306]", "307]"),
        "a time or PID that is no longer one": changed(rest, at, "pid=", "pad="),
        "two PIDs where the template had one": changed(rest, at, pid.group(0), f"pid={other_pid}"),
        "another gap between line numbers": gap,
        "a line fewer": rest[:-1],
    }
    for what, lines in differing.items():
        assert not template.repeats(first, lines), what
    assert template.repeats(first, rest)


def test_one_pid_or_time_where_the_template_had_two_is_no_repeat() -> None:
    kept = [(1, "(APIServer pid=5) INFO 05-15 05:33:37 [x.py:1] a"), (2, "(Worker pid=6) b")]
    template = Template(kept, (3, "(APIServer pid=7) INFO 05-15 05:33:40 [x.py:1] a"))
    first = (3, "(APIServer pid=8) INFO 05-15 06:00:00 [x.py:1] a")
    restart = [(4, "(Worker pid=9) b"), (5, "(APIServer pid=4) INFO 05-15 06:00:03 [x.py:1] a")]
    one_pid = [(4, "(Worker pid=8) b"), restart[1]]
    one_time = [restart[0], (5, "(APIServer pid=4) INFO 05-15 06:00:00 [x.py:1] a")]
    assert template.repeats(first, restart)
    assert not template.repeats(first, one_pid)
    assert not template.repeats(first, one_time)
