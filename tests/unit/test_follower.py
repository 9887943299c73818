"""Several startups in one log: a crash loop's startups diagnosed once per shape."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from opsbook.knowledge.logscan import FAILED, diagnose_log, follower

LOGS = Path(__file__).resolve().parents[1] / "data" / "logs"


def restarted(startup: str, run: int) -> str:
    """The startup as the run-th restart of a loop writes it: its own times and PIDs."""
    clock = f"{run // 60 % 24:02d}:{run % 60:02d}:{run * 7 % 60:02d}"
    text = re.sub(r"\d\d:\d\d:\d\d", clock, startup)
    return re.sub(r"pid=\d+", f"pid={4000 + run}", text)


def crash_loop(runs: int) -> tuple[str, str]:
    real = (LOGS / "vllm-startup-8x-rtxpro6000-glm51-nvfp4.log").read_text()
    one = real[: real.index("\n", 30_000) + 1] + (LOGS / "fp8kv-mla-1.log").read_text()
    return one, "".join(restarted(one, run) for run in range(runs))


def test_a_crash_loop_diagnoses_each_startup_shape_once(monkeypatch: pytest.MonkeyPatch) -> None:
    one, log = crash_loop(120)
    alone = diagnose_log(one)
    calls = []
    real = follower._diagnose_lines
    monkeypatch.setattr(
        follower, "_diagnose_lines", lambda *a, **k: calls.append(1) or real(*a, **k)
    )
    found = diagnose_log(log)
    # The first startup, the shape of the others (each also holds the lines the next restart
    # printed before its banner), and the last: not one diagnosis per startup.
    assert len(calls) == 3
    assert found.earlier_counts == {FAILED: 119}
    lines = one.count("\n")
    assert alone.line is not None
    assert [e.line for e in found.earlier] == [
        alone.line.number + run * lines for run in range(119)
    ]
    assert {e.failure for e in found.earlier} == {alone.failure}


def test_the_shape_keeps_what_is_not_a_time_or_a_pid() -> None:
    lines = [(10, "(APIServer pid=7) INFO 05-15 05:33:37 [gpu.py:1] 8 GPUs, 12.5 GiB free")]
    later = [(90, "(APIServer pid=9) INFO 05-15 06:01:02 [gpu.py:1] 8 GPUs, 12.5 GiB free")]
    other = [(90, "(APIServer pid=9) INFO 05-15 06:01:02 [gpu.py:1] 8 GPUs, 0.5 GiB free")]
    assert follower._shape(lines) == follower._shape(later)
    assert follower._shape(lines) != follower._shape(other)


def test_which_times_and_pids_are_equal_is_part_of_the_shape() -> None:
    # Two records of one process at one time, or of two: the diagnosis groups lines by them.
    same = [(1, "(EngineCore pid=5) ERROR 05-15 05:33:37 a"), (2, "(EngineCore pid=5) x")]
    apart = [(1, "(EngineCore pid=5) ERROR 05-15 05:33:37 a"), (2, "(EngineCore pid=6) x")]
    assert follower._shape(same) != follower._shape(apart)
