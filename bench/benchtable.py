"""The table every bench prints: measure | opsbook | plain | ratio | goal, one row a measure.

``plain`` is the strongest plain way a competent operator would write for the same job, run in
the same bench run; ``ratio`` is opsbook's figure over it; ``goal`` is issue 16's, with whether
this run met it.
"""

from __future__ import annotations

import compileall
import statistics
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

HEADER = ("measure", "opsbook", "plain", "ratio", "goal")


def as_installed() -> None:
    """opsbook's modules compiled to bytecode, as ``pip install`` leaves them: a checkout run
    with ``PYTHONDONTWRITEBYTECODE`` would otherwise compile every module at each start and
    time the compiler, not opsbook."""
    compileall.compile_dir(Path(__file__).resolve().parents[1] / "opsbook", quiet=1)


def header(title: str) -> None:
    print(f"\n{title}")
    print("| " + " | ".join(HEADER) + " |")
    print("|" + "---|" * len(HEADER))


def row(measure: str, ours: str, plain: str, ratio: float | None, goal: str) -> None:
    shown = f"{ratio:.2f}x" if ratio is not None else "-"
    print(f"| {measure} | {ours} | {plain} | {shown} | {goal} |", flush=True)


def verdict(met: bool) -> str:
    return "met" if met else "NOT met"


def seconds(value: float) -> str:
    return f"{value:.3f} s"


def median_seconds(runs: int, timed: Callable[[], object]) -> float:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        timed()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def interleaved(runs: int, *commands: Sequence[str]) -> list[tuple[float, int]]:
    """Each command ``runs`` times, taking turns (so a busy moment of the shared machine hits
    them alike): per command its median wall seconds and its last exit code."""
    times: list[list[float]] = [[] for _ in commands]
    codes = [0] * len(commands)
    for _ in range(runs):
        for i, command in enumerate(commands):
            started = time.perf_counter()
            done = subprocess.run(list(command), capture_output=True, text=True)
            times[i].append(time.perf_counter() - started)
            codes[i] = done.returncode
    return [(statistics.median(t), c) for t, c in zip(times, codes, strict=True)]
