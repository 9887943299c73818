"""The CLI starts without the heavy packages: they are imported by the commands that use them.

Each case runs in a fresh interpreter (this one has long imported them) and reads
``sys.modules`` after the parse; no timing is asserted.
"""

import json
import subprocess
import sys

import pytest

HEAVY = (
    "papermill",
    "nbconvert",
    "nbformat",
    "nbclient",
    "jupyter_client",
    "fabric",
    "paramiko",
    "invoke",
    "yaml",
    "pydantic",
    "matplotlib",
    "rich",  # only a run's lines on a terminal need it (opsbook.terminal)
)

PROBE = """
import json, sys
from opsbook import cli
try:
    cli.main(json.loads(sys.argv[1]))
except SystemExit:
    pass
heavy = json.loads(sys.argv[2])
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in heavy)))
"""


def imported_after(argv: list[str]) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(argv), json.dumps(HEAVY)],
        capture_output=True,
        text=True,
        check=True,
    )
    heavy: list[str] = json.loads(done.stdout.splitlines()[-1])
    return heavy


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["run", "--help"],
        ["run", "deploy"],  # -f is missing
        ["run", "deploy", "-f", "d.yml", "--forks", "0"],
        ["sandbox", "sideways"],
        ["sandbox", "up", "--vllm-version", "latest"],
        ["lint"],
        ["records", "sideways"],
        ["diagnose"],
        ["check"],
        ["check", "-f", "d.yml", "--bogus"],
    ],
)
def test_help_and_argument_errors_import_no_heavy_package(argv: list[str]) -> None:
    assert imported_after(argv) == []


def test_the_probe_sees_a_heavy_import_when_a_command_makes_one(tmp_path) -> None:
    # The control: a command that reads a deployment file does import YAML.
    missing = tmp_path / "none.yml"
    assert "yaml" in imported_after(["run", "00_preflight", "-f", str(missing)])


EXPORT_AFTER_MAIN = """
import sys
from opsbook import cli
try:
    cli.main(["--help"])
except SystemExit:
    pass
import nbformat, papermill
from nbconvert import HTMLExporter
nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("exported by opsbook")])
nbformat.validate(nb)
body, _ = HTMLExporter().from_notebook_node(nb)
from opsbook.core.optional_imports import SLOW_OPTIONAL_MODULES
loaded = any(sys.modules.get(name) is not None for name in SLOW_OPTIONAL_MODULES)
print("exported by opsbook" in body, loaded, "lark" in sys.modules or "arrow" in sys.modules)
"""


def test_the_command_skips_jsonschemas_optional_format_checkers_and_still_exports() -> None:
    # rfc3987_syntax compiles 38 lark grammars at import (1-2 s), isoduration imports arrow:
    # the command's process never needs them, and notebooks still validate and export.
    done = subprocess.run(
        [sys.executable, "-c", EXPORT_AFTER_MAIN], capture_output=True, text=True, check=True
    )
    assert done.stdout.split()[-3:] == ["True", "False", "False"]


CONSOLE = """
import gc, sys
from opsbook import cli
sys.argv = ["opsbook", "diagnose", "--log", sys.argv[1]]
code = cli.console()
print(code, gc.get_threshold()[0], gc.get_freeze_count() > 0)
"""


def test_the_program_collects_rarely_and_leaves_nothing_for_the_last_collections(
    tmp_path,
) -> None:
    log = tmp_path / "vllm.log"
    log.write_text("INFO:     Application startup complete.\n")
    done = subprocess.run(
        [sys.executable, "-c", CONSOLE, str(log)], capture_output=True, text=True, check=True
    )
    assert done.stdout.split()[-3:] == ["0", "50000", "True"]
