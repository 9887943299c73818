"""``python -m vllm.entrypoints.openai.api_server``: the OpenAI-compatible server (simulated)."""

from __future__ import annotations

import sys

from ..._simserver import main as _main


def main(argv: list[str] | None = None) -> int:
    """Run the server with the module's argument parser (``api_server.py`` in usage lines)."""
    return _main(sys.argv[1:] if argv is None else argv, form="api_server")


if __name__ == "__main__":
    sys.exit(main())
