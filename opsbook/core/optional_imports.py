"""Optional imports that opsbook's own processes (the command, the HTML exporter) skip.

jsonschema (under nbformat, under papermill and nbconvert) imports a checker for each optional
string format it can check when that checker is installed (JupyterLab's jupyter-events brings
them): rfc3987_syntax compiles 38 lark grammars at import, 1-2 s of this machine's CPU; the
duration, URI, date-time, colour and host-name checkers (isoduration brings arrow and dateutil)
take another 40-80 ms. nbformat validates without a format checker, and no schema opsbook
validates uses those formats.

pydantic looks for plugins in every installed distribution's entry points when it builds its
first schema (25 ms of a health check's 0.7 s here); the deployment schema needs none.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator

SLOW_OPTIONAL_MODULES = (
    "rfc3987_syntax",
    "isoduration",
    "rfc3986_validator",
    "rfc3339_validator",
    "webcolors",
    "uri_template",
    "fqdn",
)
# pydantic's documented switch (pydantic/plugin/_loader.py).
PYDANTIC_PLUGINS_ENV = "PYDANTIC_DISABLE_PLUGINS"


def skip_slow_optional_imports() -> None:
    """Make the optional imports above fail fast in this process (``None`` in
    ``sys.modules`` is how Python marks a module as not importable); for opsbook's own
    processes only, never a kernel's or JupyterLab's."""
    for name in SLOW_OPTIONAL_MODULES:
        sys.modules.setdefault(name, None)  # type: ignore[arg-type]


@contextlib.contextmanager
def without_pydantic_plugins() -> Iterator[None]:
    """pydantic schemas built inside skip the plugin search, unless the operator set the switch
    themselves; the environment is restored after, so kernels the command starts are not
    affected."""
    if PYDANTIC_PLUGINS_ENV in os.environ:
        yield
        return
    os.environ[PYDANTIC_PLUGINS_ENV] = "__all__"
    try:
        yield
    finally:
        os.environ.pop(PYDANTIC_PLUGINS_ENV, None)
