"""Benchmark: the command's start: ``opsbook --help`` and argument errors, each in its own
process, against the interpreter starting and doing nothing (``python -c pass``: no command
written in Python starts faster).

Goal (issue 16): ``--help`` and every subcommand's argument error in under 0.3 s.

Usage: ``.venv/bin/python bench/cli.py [--runs 9]``
"""

from __future__ import annotations

import argparse
import sys

import benchtable

GOAL = 0.3
OPSBOOK = [sys.executable, "-m", "opsbook"]
CASES = [
    ("`opsbook --help`", ["--help"]),
    ("`opsbook run --help`", ["run", "--help"]),
    ("`opsbook run deploy` (no -f: exit 2)", ["run", "deploy"]),
    ("`opsbook check -f d.yml --bogus` (exit 2)", ["check", "-f", "d.yml", "--bogus"]),
    (
        "`opsbook sandbox up --vllm-version latest` (exit 2)",
        ["sandbox", "up", "--vllm-version", "latest"],
    ),
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=9, help="runs per command (median kept)")
    args = parser.parse_args()
    benchtable.as_installed()
    benchtable.header("CLI start: opsbook vs the bare interpreter (medians, one run)")
    floor = [sys.executable, "-c", "pass"]
    for label, argv in CASES:
        (ours, code), (base, _) = benchtable.interleaved(args.runs, [*OPSBOOK, *argv], floor)
        benchtable.row(
            f"{label}, exit {code}",
            benchtable.seconds(ours),
            f"python -c pass {benchtable.seconds(base)}",
            ours / base,
            f"< {GOAL:g} s: {benchtable.verdict(ours < GOAL)}",
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
