"""The ``vllm`` command (``vllm serve MODEL``, ``vllm --version``), simulated."""

from __future__ import annotations

import sys

from ..._simserver import main as _main


def main(argv: list[str] | None = None) -> int:
    """Run the ``vllm`` command line; the console script calls this."""
    return _main(sys.argv[1:] if argv is None else argv, form="serve")


if __name__ == "__main__":
    sys.exit(main())
