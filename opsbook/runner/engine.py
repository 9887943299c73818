"""papermill's engine for opsbook's runs: the record is saved where it says something new.

papermill (2.x, ``engines.py``) writes the whole notebook, validated against nbformat's schema,
when it starts, when each cell starts and when each cell completes, markdown cells included:
about 25 writes for one of the runbook's notebooks, most of a stage's own overhead. This engine
writes it when the run starts, when a code cell starts (a hung cell is the last one marked
running), every ``autosave_cell_every`` seconds while a cell prints, and when the run ends,
failed or not (papermill ends it in a ``finally``); a cell's completion is written by the next
code cell's start or by the end. A code cell's start is written as compact JSON, as the
standard library's C encoder writes it (0.13-0.2 ms for a stage's notebook, against 0.8-1.2 ms
for nbformat's indented write): it is there for a runner killed mid-cell, and the end writes
the notebook in nbformat's own layout.

It also closes its kernel client's channels when the kernel is the deploy's shared one:
nbclient stops them only for a kernel it started, so each stage left a client (its heartbeat
thread pinging and its sockets open, 18 descriptors) behind in the runner.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import nbformat
from jupyter_core.utils import run_sync
from papermill.clientwrap import PapermillNotebookClient
from papermill.engines import NBClientEngine, NotebookExecutionManager, papermill_engines
from papermill.iorw import papermill_io
from papermill.utils import merge_kwargs, remove_args
from traitlets import Dict, Unicode

from opsbook.core.exceptions import RunError

NAME = "opsbook"


class RecordSaves(NotebookExecutionManager):
    """A :class:`NotebookExecutionManager` that skips the saves that add nothing to the record:
    markdown cells' start and every cell's completion; and the schema check of the saves it
    makes, which papermill's last write of the notebook does once (``execute_notebook``)."""

    _quiet = False
    _compact = False

    def save(self, **kwargs: Any) -> None:
        if self._quiet:
            return
        if self.output_path:
            papermill_io.write(self._text(), self.output_path)
        self.last_save_time = self.now()

    def _text(self) -> str:
        if self._compact:
            # nbformat's write copies the notebook and indents it in pure Python (json's C
            # encoder does not indent), at every code cell.
            return json.dumps(self.nb, ensure_ascii=False)
        # nbformat.writes validates the whole notebook on every save (25-40 ms here) only to
        # log what it finds; the notebook is the same JSON without it.
        return nbformat.v4.writes(self.nb)

    def cell_start(self, cell: Any, cell_index: Any = None, **kwargs: Any) -> None:
        self._quiet = cell.cell_type != "code"
        self._compact = True
        try:
            super().cell_start(cell, cell_index, **kwargs)
        finally:
            self._quiet = self._compact = False

    def cell_complete(self, cell: Any, cell_index: Any = None, **kwargs: Any) -> None:
        self._quiet = True
        try:
            super().cell_complete(cell, cell_index, **kwargs)
        finally:
            self._quiet = False


class ClosingClient(PapermillNotebookClient):
    """papermill's notebook client that closes its channels to a kernel it did not start
    (nbclient keeps them open: ``cleanup_kc`` defaults to owning the kernel manager), and sets
    ``environment`` in such a kernel before the first cell (the deploy's shared kernel takes
    each stage's results file and journal so, on the client that runs the notebook)."""

    environment = Dict(
        value_trait=Unicode(), help="variables set in a kernel it did not start, before any cell"
    )

    async def async_start_new_kernel_client(self) -> Any:
        client = await super().async_start_new_kernel_client()
        if self.environment and not self.owns_km:
            await set_environment(client, dict(self.environment))
        return client

    # papermill sets the kernel up through nbclient's blocking wrapper, bound to the base's
    # coroutine when nbclient's class was made.
    start_new_kernel_client = run_sync(async_start_new_kernel_client)

    def execute(self, **kwargs: Any) -> Any:
        try:
            return super().execute(**kwargs)
        finally:
            client: Any = getattr(self, "kc", None)
            if not self.owns_km and client is not None:
                client.stop_channels()
                self.kc = None


class RecordEngine(NBClientEngine):
    """nbclient's engine over :class:`RecordSaves` and :class:`ClosingClient` (papermill's
    ``Engine.execute_notebook`` and ``NBClientEngine.execute_managed_notebook`` with the
    manager and client classes swapped)."""

    @classmethod
    def execute_notebook(
        cls,
        nb: Any,
        kernel_name: str,
        output_path: str | None = None,
        progress_bar: bool = True,
        log_output: bool = False,
        autosave_cell_every: int = 30,
        **kwargs: Any,
    ) -> Any:
        nb_man = RecordSaves(
            nb,
            output_path=output_path,
            progress_bar=progress_bar,
            log_output=log_output,
            autosave_cell_every=autosave_cell_every,
        )
        nb_man.notebook_start()
        try:
            cls.execute_managed_notebook(nb_man, kernel_name, log_output=log_output, **kwargs)
        finally:
            nb_man.cleanup_pbar()
            nb_man.notebook_complete()
        return nb_man.nb

    @classmethod
    def execute_managed_notebook(
        cls,
        nb_man: Any,
        kernel_name: str,
        log_output: bool = False,
        stdout_file: Any = None,
        stderr_file: Any = None,
        start_timeout: int = 60,
        execution_timeout: int | None = None,
        **kwargs: Any,
    ) -> Any:
        kwargs = remove_args(["input_path"], **kwargs)
        safe_kwargs = remove_args(["timeout", "startup_timeout"], **kwargs)
        final_kwargs = merge_kwargs(
            safe_kwargs,
            timeout=execution_timeout if execution_timeout else kwargs.get("timeout"),
            startup_timeout=start_timeout,
            kernel_name=kernel_name,
            log=logging.getLogger("papermill"),
            log_output=log_output,
            stdout_file=stdout_file,
            stderr_file=stderr_file,
        )
        return ClosingClient(nb_man, **final_kwargs).execute()


async def set_environment(client: Any, env: dict[str, str]) -> None:
    """Update a running kernel's ``os.environ`` with ``env`` over ``client`` (ready)."""
    code = f"import os as _os\n_os.environ.update({env!r})\ndel _os"
    reply = await client.execute_interactive(
        code, store_history=False, timeout=60, output_hook=lambda msg: None
    )
    if reply["content"].get("status") != "ok":
        raise RunError("the shared kernel refused to take the stage's environment")


def register() -> str:
    """Make the engine known to papermill; its name, for ``engine_name``."""
    papermill_engines.register(NAME, RecordEngine)
    return NAME
