"""The run's papermill engine saves the record when a code cell starts and when the run ends,
with every output in the end (a real kernel and papermill, here)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import nbformat
import papermill
import pytest
from jupyter_client.channels import HBChannel
from jupyter_core.utils import run_sync
from papermill.exceptions import PapermillExecutionError

from opsbook.runner import engine
from opsbook.runner.kernel import quiet_kernel_manager


def notebook(path: Path, *codes: str) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    for code in codes:
        nb.cells.append(nbformat.v4.new_markdown_cell("What the next cell does, and why."))
        nb.cells.append(nbformat.v4.new_code_cell(code))
    nbformat.write(nb, path)
    return path


@pytest.fixture
def saves(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The papermill status of each code cell at each save."""
    seen: list[list[str]] = []
    original = engine.RecordSaves.save

    def save(self: Any, **kwargs: Any) -> None:
        if not self._quiet:
            cells = [c for c in self.nb.cells if c.cell_type == "code"]
            seen.append([c.metadata.papermill.get("status", "") for c in cells])
        original(self, **kwargs)

    monkeypatch.setattr(engine.RecordSaves, "save", save)
    return seen


def run(source: Path, output: Path) -> Any:
    return papermill.execute_notebook(
        str(source), str(output), engine_name=engine.register(), progress_bar=False
    )


def test_the_record_is_saved_at_the_start_at_each_code_cell_and_at_the_end(
    tmp_path: Path, saves: list[list[str]]
) -> None:
    output = tmp_path / "out.ipynb"
    run(notebook(tmp_path / "in.ipynb", "print('one')", "print('two')"), output)
    assert saves == [
        ["pending", "pending"],
        ["running", "pending"],
        ["completed", "running"],
        ["completed", "completed"],
    ]
    written = nbformat.read(output, as_version=4)
    code = [c for c in written.cells if c.cell_type == "code"]
    assert [c.outputs[0]["text"] for c in code] == ["one\n", "two\n"]


def test_the_whole_schema_is_checked_when_papermill_reads_and_last_writes_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = notebook(tmp_path / "in.ipynb", "print('one')", "print('two')")
    checks: list[int] = []
    validate = nbformat.validate

    def counted(*args: Any, **kwargs: Any) -> Any:
        checks.extend([1] if "cells" in args[0] else [])  # whole notebooks, not new outputs
        return validate(*args, **kwargs)

    monkeypatch.setattr(nbformat, "validate", counted)
    output = tmp_path / "out.ipynb"
    ran = run(source, output)
    assert len(checks) == 2  # papermill's reading of the notebook, and its last write
    assert output.read_text() == nbformat.writes(ran)  # the same JSON as a validated write


def test_a_failed_cell_is_in_the_record_with_its_error(
    tmp_path: Path, saves: list[list[str]]
) -> None:
    output = tmp_path / "out.ipynb"
    with pytest.raises(PapermillExecutionError):
        run(notebook(tmp_path / "in.ipynb", "print('one')", "1 / 0", "print('never')"), output)
    assert saves[-1] == ["completed", "failed", "pending"]
    written = nbformat.read(output, as_version=4)
    failed = [c for c in written.cells if c.cell_type == "code"][1]
    assert failed.outputs[-1]["ename"] == "ZeroDivisionError"


def test_a_stage_on_a_shared_kernel_leaves_no_client_of_it_running(tmp_path: Path) -> None:
    # nbclient keeps its client's channels open to a kernel it was handed; two stages on the
    # deploy's shared kernel each left one (a heartbeat thread and open sockets) behind.
    km = quiet_kernel_manager(tmp_path / "kernel.log")(kernel_name="python3")
    run_sync(km.start_kernel)()
    try:
        for n in range(2):
            output = tmp_path / f"out{n}.ipynb"
            papermill.execute_notebook(
                str(notebook(tmp_path / "in.ipynb", f"print({n})")),
                str(output),
                engine_name=engine.register(),
                progress_bar=False,
                km=km,
            )
            assert nbformat.read(output, as_version=4).cells[1].outputs[0]["text"] == f"{n}\n"
            assert km.has_kernel, "the shared kernel stays up for the next stage"
            assert not [t for t in threading.enumerate() if isinstance(t, HBChannel)]
    finally:
        run_sync(km.shutdown_kernel)(now=True)


def test_each_stage_on_a_shared_kernel_finds_its_own_environment_from_its_first_cell(
    tmp_path: Path,
) -> None:
    km = quiet_kernel_manager(tmp_path / "kernel.log")(kernel_name="python3")
    run_sync(km.start_kernel)()
    try:
        for n in range(2):
            output = tmp_path / f"out{n}.ipynb"
            code = "import os; print(os.environ['OPSBOOK_TEST_STAGE'])"
            papermill.execute_notebook(
                str(notebook(tmp_path / "in.ipynb", code)),
                str(output),
                engine_name=engine.register(),
                progress_bar=False,
                km=km,
                environment={"OPSBOOK_TEST_STAGE": f"stage {n}"},
            )
            printed = nbformat.read(output, as_version=4).cells[1].outputs[0]["text"]
            assert printed == f"stage {n}\n"
    finally:
        run_sync(km.shutdown_kernel)(now=True)


def test_a_running_cell_is_on_disk_as_running_and_the_end_in_nbformat_s_layout(
    tmp_path: Path,
) -> None:
    # A code cell's start is written as compact JSON (the C encoder); a runner killed during
    # the cell leaves a notebook that nbformat reads, with that cell running.
    output = tmp_path / "out.ipynb"
    look = (
        f"import nbformat\nnb = nbformat.read({str(output)!r}, as_version=4)\n"
        "print([c.metadata.papermill.status for c in nb.cells if c.cell_type == 'code'])"
    )
    ran = run(notebook(tmp_path / "in.ipynb", "print('one')", look), output)
    code = [c for c in ran.cells if c.cell_type == "code"]
    assert code[1].outputs[0]["text"] == "['completed', 'running']\n"
    assert output.read_text() == nbformat.writes(ran)
