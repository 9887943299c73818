"""Optional imports that opsbook's own processes (the command, the HTML exporter) skip.

jsonschema (under nbformat, under papermill and nbconvert) imports rfc3987_syntax when it is
installed (JupyterLab's jupyter-events brings it) for its optional "iri" format checks; that
module compiles 38 lark grammars at import, 1-2 s of this machine's CPU. No notebook or schema
opsbook validates uses those formats.
"""

from __future__ import annotations

import sys

SLOW_OPTIONAL_MODULES = ("rfc3987_syntax",)


def skip_slow_optional_imports() -> None:
    """Make the optional imports above fail fast in this process (``None`` in
    ``sys.modules`` is how Python marks a module as not importable); for opsbook's own
    processes only, never a kernel's or JupyterLab's."""
    for name in SLOW_OPTIONAL_MODULES:
        sys.modules.setdefault(name, None)  # type: ignore[arg-type]
