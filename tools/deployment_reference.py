"""Write the README's deployment file reference from the schema (``opsbook.core.deployment``).

The table between the ``deployment-reference`` markers of README.md is replaced by
:func:`opsbook.core.deployment_text.reference_table`; ``tests/unit/test_deployment.py`` checks that the
README holds exactly that table.

Usage::

    .venv/bin/python tools/deployment_reference.py          # rewrite README.md
    .venv/bin/python tools/deployment_reference.py --check  # exit 1 when it differs
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from opsbook.core.deployment_text import reference_table

README = Path(__file__).resolve().parent.parent / "README.md"
START = "<!-- deployment-reference:start (tools/deployment_reference.py) -->\n"
END = "<!-- deployment-reference:end -->\n"


def with_table(text: str) -> str:
    """``text`` with the table between the markers replaced by the schema's."""
    head, start, rest = text.partition(START)
    _, end, tail = rest.partition(END)
    if not start or not end:
        raise SystemExit(f"README.md lacks the markers {START.strip()} ... {END.strip()}")
    return head + START + reference_table() + END + tail


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when README.md differs")
    args = parser.parse_args()
    text = README.read_text()
    new = with_table(text)
    if args.check:
        print("README.md deployment reference is " + ("current" if new == text else "stale"))
        return 0 if new == text else 1
    README.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
