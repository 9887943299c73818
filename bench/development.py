"""Accuracy of the log diagnosis on the development corpus (tests/data/logs/development/).

These sets were seen while the catalogue and logscan were developed (see that folder's README):
their figures say whether a change to the decision keeps or improves what already worked, not
how the diagnosis does on logs it has not seen (that is bench/heldout.py's held-out set). Scored
exactly as bench/heldout.py scores the held-out set.
"""

from __future__ import annotations

import contextlib
import io
import sys

from bench.heldout import LOGS, load_labels, score

DEVELOPMENT = LOGS / "development"


def main() -> int:
    verbose = "-v" in sys.argv[1:]
    total = ids = lines = 0
    for folder in sorted(p for p in DEVELOPMENT.iterdir() if (p / "labels.yaml").exists()):
        with contextlib.redirect_stdout(io.StringIO()):
            scores = [score(label, folder) for label in load_labels(folder)]
        for s in scores:
            if verbose and not (s.id_right and s.line_right):
                mark = ("id " if s.id_right else "ID!") + (" line " if s.line_right else " LINE!")
                print(
                    f"{mark}  {folder.name}/{s.label.file:<40} "
                    f"want {s.label.failure or s.label.state:<24} got {s.failure or s.state}"
                )
        total += len(scores)
        ids += sum(s.id_right for s in scores)
        lines += sum(s.line_right for s in scores)
    print(f"development: {total} logs")
    print(f"development: failure id right: {ids}/{total} ({ids / total:.1%})")
    print(f"development: key line reported: {lines}/{total} ({lines / total:.1%})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
