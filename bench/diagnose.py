"""Benchmark: ``opsbook diagnose --log`` on a 500 MB log and on a small one, against ``grep``.

Writes a log as a server that ran for a long time leaves it: the shared real logs of
``tests/data/logs`` (several startups), then a real startup that became ready
(``ready-4.log``) followed by routine lines (throughput metrics, the access log, a warning
every 10,000 lines) up to the size asked for, then a last startup that failed
(``trust-remote-code-2.log``, another API-server PID). Then it times, each in its own process,
with the peak RSS from ``wait4``:

* ``opsbook diagnose --log FILE`` (the whole CLI: interpreter start, imports, the scan);
* ``grep -a -E`` of the failure catalogue's fatal patterns (every error class's patterns as one
  POSIX regex, :mod:`plainways`) on the same file: the plain way an operator finds the failure
  lines of a log, and what the diagnosis does at the least (it also judges the startups,
  phases and root cause);
* the same two on a small real log (``ready-4.log``) and on a crash-looping server's log
  (``--startups`` startups that each failed, one file).

It prints the figures, then the table rows (issue 16's goals: 500 MB in at most 10 s and
100 MB; a small log in under 0.5 s; ``/dev/zero`` refused with exit 2 in bounded memory; issue
37's: the crash-looping log within 5x the ``grep -E``).
``--worst-mb`` also times a log made only of the real logs concatenated (three lines of four
are lines of interest there: the hardest case for the screen). Each figure is wall seconds with
the CPU seconds (user + system) beside them: the machine is shared, and a ratio of wall
seconds moves with its load. ``--rounds N`` runs each side N times, taking turns, and keeps
each one's fastest.

Usage: ``.venv/bin/python bench/diagnose.py [--mb 500] [--worst-mb 50] [--rounds 2] [--keep]``.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

import benchtable
import plainways

ROOT = Path(__file__).resolve().parents[1]
LOGS = ROOT / "tests" / "data" / "logs"
GNU_TIME = "/usr/bin/time"
GOAL_SECONDS = 10.0
GOAL_RSS_MB = 100.0
GOAL_SMALL_SECONDS = 0.5
GOAL_CRASHLOOP_RATIO = 5.0
CRASHLOOP_STARTUP_BYTES = 30_000
METRICS = (
    "(APIServer pid=155) INFO 11-28 16:{m:02d}:{s:02d} [loggers.py:127] Engine 000: Avg prompt"
    " throughput: 1873.4 tokens/s, Avg generation throughput: 412.9 tokens/s, Running: 14 reqs,"
    " Waiting: 0 reqs, GPU KV cache usage: 7.3%, Prefix cache hit rate: 61.2%\n"
)
ACCESS = (
    '(APIServer pid=155) INFO:     127.0.0.1:{port} - "POST /v1/chat/completions HTTP/1.1" 200 OK\n'
)
WARNING = (
    "(APIServer pid=155) WARNING 11-28 16:{m:02d}:{s:02d} [protocol.py:82] The following fields"
    " were present in the request but ignored: {{'top_k'}}\n"
)


def write_long_log(path: Path, megabytes: int) -> None:
    """The real logs, a ready startup, routine lines to ``megabytes``, a failed startup."""
    real = "".join(p.read_text(encoding="utf-8") for p in sorted(LOGS.glob("*.log")))
    ready = (LOGS / "ready-4.log").read_text(encoding="utf-8")
    failed = (LOGS / "trust-remote-code-2.log").read_text(encoding="utf-8")
    block = []
    for i in range(10_000):
        m, s = divmod(i % 3600, 60)
        block.append(METRICS.format(m=m, s=s) if i % 2 else ACCESS.format(port=40000 + i))
    block.append(WARNING.format(m=0, s=0))
    routine = "".join(block).encode()
    target = megabytes * 1_000_000
    with path.open("wb") as out:
        out.write(real.encode() + ready.encode())
        while out.tell() < target:
            out.write(routine)
        out.write(failed.encode())


def write_crashloop_log(path: Path, startups: int) -> None:
    """A crash-looping server's log: ``startups`` startups appended to one file, each the
    first ~30 kB of a real 8x RTX PRO 6000 startup (vLLM 0.20, its banner, arguments and
    load) then a real failure (``fp8kv-mla-1.log``), each with its own times and API-server
    PID, as a restart loop writes them (the survey's log: 1,000 startups in 29 MB)."""
    real = (LOGS / "vllm-startup-8x-rtxpro6000-glm51-nvfp4.log").read_text(encoding="utf-8")
    loaded = real[: real.index("\n", CRASHLOOP_STARTUP_BYTES) + 1]
    failed = (LOGS / "fp8kv-mla-1.log").read_text(encoding="utf-8")
    startup = re.sub(r"\d\d:\d\d:\d\d", "\0clock\0", loaded + failed)
    parts = re.sub(r"pid=\d+", "pid=\0pid\0", startup).split("\0")
    with path.open("w", encoding="utf-8") as out:
        for i in range(startups):
            h, rest = divmod(i * 37, 3600)
            clock = f"{h % 24:02d}:{rest // 60:02d}:{rest % 60:02d}"
            fill = {"clock": clock, "pid": str(1000 + i)}
            out.write("".join(fill.get(part, part) for part in parts))


def write_worst_log(path: Path, megabytes: int) -> None:
    real = "".join(p.read_text(encoding="utf-8") for p in sorted(LOGS.glob("*.log"))).encode()
    with path.open("wb") as out:
        while out.tell() < megabytes * 1_000_000:
            out.write(real)


class Measured(NamedTuple):
    """One process's wall seconds, CPU seconds (user + system), peak RSS in MB, exit code."""

    seconds: float
    cpu: float
    rss: float
    code: int


def measure(command: list[str]) -> Measured:
    """Run ``command`` once and measure it.

    GNU time reports the peak RSS of the command itself; ``wait4`` from here would count
    this interpreter's pages copied by the fork before the exec. The CPU seconds say what the
    wall seconds of a loaded machine do not: the machine is shared, and its load moves.
    """
    if os.path.exists(GNU_TIME):
        command = [GNU_TIME, "-f", "%M %U %S", *command]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    # Output to a pipe, not /dev/null: GNU grep stops at the first match when it sees that
    # its output goes nowhere.
    done = subprocess.run(command, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if os.path.exists(GNU_TIME):
        rss, user, system = done.stderr.split()[-3:]
        return Measured(seconds, float(user) + float(system), int(rss) / 1024, done.returncode)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return Measured(seconds, cpu, after.ru_maxrss / 1024, done.returncode)


def opsbook_diagnose(path: Path) -> list[str]:
    return [sys.executable, "-m", "opsbook.cli", "diagnose", "--log", str(path)]


def compare(label: str, path: Path, rounds: int = 1) -> tuple[Measured, Measured]:
    """opsbook's and grep's figures on ``path``, each printed; over several ``rounds`` (taking
    turns, so both meet the same load), each one's fastest."""
    runs = [
        (measure(opsbook_diagnose(path)), measure(plainways.grep_fatal(path)))
        for _ in range(rounds)
    ]
    ours = min((ours for ours, _ in runs), key=lambda m: m.seconds)
    plain = min((plain for _, plain in runs), key=lambda m: m.seconds)
    size = path.stat().st_size / 1e6
    print(f"{label} ({size:.1f} MB):")
    print(
        f"  opsbook diagnose --log: {ours.seconds:7.3f} s, CPU {ours.cpu:6.3f} s,"
        f" max RSS {ours.rss:6.1f} MB (exit {ours.code})"
    )
    print(
        f"  grep -E fatal lines  : {plain.seconds:7.3f} s, CPU {plain.cpu:6.3f} s,"
        f" max RSS {plain.rss:6.1f} MB"
    )
    return ours, plain


def _figures(measured: Measured, digits: int, *, rss: bool = True) -> str:
    shown = f"{measured.seconds:.{digits}f} s (CPU {measured.cpu:.{digits}f} s)"
    return shown + (f", {measured.rss:.0f} MB" if rss else "")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=500, help="size of the long log (MB)")
    parser.add_argument("--worst-mb", type=int, default=0, help="also a log of real logs only")
    parser.add_argument(
        "--startups", type=int, default=3000, help="startups in the crash-looping log"
    )
    parser.add_argument(
        "--rounds", type=int, default=1, help="runs of each, taking turns (the fastest counts)"
    )
    parser.add_argument("--keep", action="store_true", help="keep the generated logs")
    args = parser.parse_args()
    benchtable.as_installed()
    folder = Path(tempfile.mkdtemp(prefix="opsbook-bench-diagnose-"))
    rows = []
    try:
        long_log = folder / "long.log"
        write_long_log(long_log, args.mb)
        ours, grep = compare(
            "long log: real startups + routine lines + a failed startup", long_log, args.rounds
        )
        met = ours.seconds <= GOAL_SECONDS and ours.rss <= GOAL_RSS_MB
        rows.append(
            (
                f"diagnose --log, {args.mb} MB log",
                _figures(ours, 2),
                "grep -E " + _figures(grep, 2, rss=False),
                ours.seconds / grep.seconds,
                f"<= {GOAL_SECONDS:.0f} s, <= {GOAL_RSS_MB:.0f} MB: {benchtable.verdict(met)}",
            )
        )
        done = subprocess.run(opsbook_diagnose(long_log), capture_output=True, text=True)
        print("  verdict              : " + " | ".join(done.stdout.splitlines()[:2]))
        small, small_grep = compare("small log: ready-4.log", LOGS / "ready-4.log", args.rounds)
        rows.append(
            (
                "diagnose --log, small log (process start included)",
                _figures(small, 3),
                "grep -E " + _figures(small_grep, 3, rss=False),
                small.seconds / small_grep.seconds,
                f"<= {GOAL_SMALL_SECONDS} s: "
                + benchtable.verdict(small.seconds <= GOAL_SMALL_SECONDS),
            )
        )
        looping = folder / "crashloop.log"
        write_crashloop_log(looping, args.startups)
        loop, loop_grep = compare(
            f"crash-looping log: {args.startups} startups that failed", looping, args.rounds
        )
        met = loop.seconds <= GOAL_CRASHLOOP_RATIO * loop_grep.seconds and loop.rss <= GOAL_RSS_MB
        rows.append(
            (
                f"diagnose --log, {args.startups} startups in one log",
                _figures(loop, 2),
                "grep -E " + _figures(loop_grep, 2, rss=False),
                loop.seconds / loop_grep.seconds,
                f"<= {GOAL_CRASHLOOP_RATIO:g}x grep -E (CPU {loop.cpu / loop_grep.cpu:.1f}x),"
                f" <= {GOAL_RSS_MB:.0f} MB: {benchtable.verdict(met)}",
            )
        )
        zero = measure([*opsbook_diagnose(Path("/dev/zero"))])
        refused = zero.code == 2 and zero.rss <= GOAL_RSS_MB
        rows.append(
            (
                "diagnose --log /dev/zero (no line break ever)",
                f"{zero.seconds:.2f} s, {zero.rss:.0f} MB, exit {zero.code}",
                "-",
                None,
                f"refused, exit 2, bounded memory: {benchtable.verdict(refused)}",
            )
        )
        if args.worst_mb:
            worst = folder / "worst.log"
            write_worst_log(worst, args.worst_mb)
            w, w_grep = compare("worst case: the real logs concatenated", worst, args.rounds)
            rows.append(
                (
                    f"  secondary: {args.worst_mb} MB of real logs only",
                    _figures(w, 2),
                    "grep -E " + _figures(w_grep, 2, rss=False),
                    w.seconds / w_grep.seconds,
                    "(worst case)",
                )
            )
    finally:
        if args.keep:
            print(f"logs kept in {folder}")
        else:
            for path in folder.iterdir():
                path.unlink()
            folder.rmdir()
    benchtable.header(
        "logs of any size: opsbook diagnose --log vs grep -E of the fatal patterns (same file)"
    )
    for row in rows:
        benchtable.row(*row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
